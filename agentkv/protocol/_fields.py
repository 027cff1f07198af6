"""The one strictness rule every decoder of the wire protocol applies (docs/protocol.md).

- Unknown keys are ignored (a newer peer may send more).
- A known field that is wrongly typed, out of range, NaN or infinite rejects the whole
  message (the hint, the event): :class:`Malformed` carries the reason, which the caller
  counts and, on the control route, answers with. Nothing of a rejected message is applied.
- A missing field is absent (None), unless the message needs it (a trajectory id).
- Decoders never raise into their caller: they catch :class:`Malformed` and JSON errors
  (including nesting too deep to parse) themselves.

Pure: no agentkv, vLLM or pydantic import.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from agentkv.protocol._wire import MAX_ID_CHARS, valid_salt

__all__ = [
    "Malformed",
    "read_bool",
    "read_choice",
    "read_count",
    "read_id",
    "read_int",
    "read_ms",
    "read_salt",
    "read_turn_id",
]

#: The largest integer a JSON number carries exactly (and a sane bound on any ms figure).
MAX_SAFE_INT = 2**53


class Malformed(ValueError):
    """A known field that breaks its rule; ``str()`` is the reason, naming the field."""


def _number(name: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Malformed(f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise Malformed(f"{name} must be finite")
    return value


def read_id(name: str, value: Any) -> str | None:
    """A string id of 1..:data:`MAX_ID_CHARS` characters (None: absent)."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise Malformed(f"{name} must be a string of 1..{MAX_ID_CHARS} characters")
    return value


def read_int(name: str, value: Any, low: int, high: int) -> int | None:
    """A whole number within ``[low, high]`` (an integral float is one; None: absent)."""
    if value is None:
        return None
    number = _number(name, value)
    if isinstance(number, float):
        if not number.is_integer():
            raise Malformed(f"{name} must be a whole number")
        number = int(number)
    if not low <= number <= high:
        raise Malformed(f"{name} must be within [{low}, {high}]")
    return number


def read_count(name: str, value: Any) -> int | None:
    """A non-negative whole number, or its decimal string (a turn id on the wire)."""
    if isinstance(value, str) and value.isascii() and value.isdecimal() and len(value) < 16:
        value = int(value)
    return read_int(name, value, 0, MAX_SAFE_INT)


def read_turn_id(name: str, value: Any) -> int | str | None:
    """A turn id: a turn number (see :func:`read_count`), or a harness's own label, any
    string of 1..:data:`MAX_ID_CHARS` characters (the contract's ``turnId: string``)."""
    if isinstance(value, str) and not (value.isascii() and value.isdecimal()):
        return read_id(name, value)
    return read_count(name, value)


def read_ms(name: str, value: Any) -> float | None:
    """A non-negative finite number of milliseconds below 2**53 (None: absent)."""
    if value is None:
        return None
    number = _number(name, value)
    if not 0 <= number < MAX_SAFE_INT:
        raise Malformed(f"{name} must be a non-negative number of milliseconds")
    return float(number)


def read_bool(name: str, value: Any, *, numeric: bool = False) -> bool | None:
    """A JSON boolean (None: absent). ``numeric``: ``1`` and ``0`` read as true and false
    too (what vLLM's request model makes of a boolean in ``vllm_xargs``); any other value,
    a string such as ``"true"`` included, breaks the rule."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if numeric and type(value) is int and value in (0, 1):
        return bool(value)
    raise Malformed(f"{name} must be true or false, got {type(value).__name__}")


def read_choice(name: str, value: Any, allowed: Collection[str]) -> str | None:
    """One of ``allowed`` (None: absent)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in allowed:
        raise Malformed(f"{name} must be one of {sorted(allowed)}")
    return value


def read_salt(name: str, value: Any) -> str | None:
    """A cache salt vLLM accepts (None: absent)."""
    if value is None:
        return None
    if not valid_salt(value):
        raise Malformed(f"{name} must be the cache_salt the requests carried")
    return str(value)
