"""Error containment: the strict flag, contained internal errors, warnings given once.

A leaf module (it imports nothing from agentkv), so every layer can guard its work:

- :func:`internal_error` records an error inside agentkv, logs it once per place on
  logger ``agentkv`` and re-raises it in strict mode, so the caller's work proceeds as if
  agentkv were absent (invariant 1) while bugs cannot hide in tests;
- strict mode is ``AGENTKV_STRICT=1`` unless :func:`set_strict` overrides it
  (``agentkv.configure(strict=...)``);
- :func:`warn_once` logs a warning the first time its key is seen in the process.
"""

from __future__ import annotations

import logging
import os
import threading

__all__ = [
    "error_counts",
    "get_strict_override",
    "internal_error",
    "is_strict",
    "reset",
    "set_strict",
    "warn_once",
]

logger = logging.getLogger("agentkv")

_lock = threading.Lock()
_strict: bool | None = None  # None: follow AGENTKV_STRICT
_errors: dict[str, int] = {}
_warned: set[str] = set()


def _env_strict() -> bool:
    return os.environ.get("AGENTKV_STRICT", "").strip().lower() in {"1", "true", "yes", "on"}


def set_strict(strict: bool | None) -> None:
    """Make internal errors propagate (True), be contained (False), or follow the env (None)."""
    global _strict
    _strict = strict


def get_strict_override() -> bool | None:
    """The value given to :func:`set_strict` (None: strictness follows ``AGENTKV_STRICT``)."""
    return _strict


def is_strict() -> bool:
    """True when internal errors should propagate instead of being contained."""
    if _strict is not None:
        return _strict
    return _env_strict()


def internal_error(where: str, exc: BaseException) -> None:
    """Record an error inside agentkv; log it once per ``where``; re-raise in strict mode."""
    with _lock:
        count = _errors.get(where, 0) + 1
        _errors[where] = count
    if count == 1:
        logger.warning(
            "agentkv: internal error in %s (%s: %s); continuing without it",
            where,
            type(exc).__name__,
            exc,
            exc_info=logger.isEnabledFor(logging.DEBUG),
        )
    if is_strict():
        raise exc


def error_counts() -> dict[str, int]:
    """How many internal errors were contained, by place."""
    with _lock:
        return dict(_errors)


def warn_once(key: str, msg: str, *args: object) -> None:
    """Log ``msg % args`` on logger ``agentkv`` the first time ``key`` is seen."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(msg, *args)


def reset() -> None:
    """Forget the strict override, the error counts and which warnings were given."""
    global _strict
    with _lock:
        _strict = None
        _errors.clear()
        _warned.clear()
