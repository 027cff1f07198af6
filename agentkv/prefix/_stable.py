"""Stable tool schemas, canonical JSON and fingerprints.

A chat template renders the request's dicts in insertion order (transformers' ``tojson``
does not sort keys), so the bytes — and therefore the tokens — of a prompt's tool block
depend on how the caller happened to build its dicts. Two processes that build the same
tools in a different key order render different prompts, and the server's prefix cache
misses on every request. No eviction policy can repair that, so the fix has to happen
before the request is sent: :func:`stable_tools` rebuilds the tool list with one
canonical key order at every depth.

Rules (the same ones :func:`canonical_json` applies):

- keys of JSON objects are sorted by code point at every depth, except the two wrapper
  levels of a tool, which use the declared Chat Completions order (``type``,
  ``function``; ``name``, ``description``, ``parameters``, ``strict``; other keys after
  them, sorted);
- lists keep their order (``required``, ``enum`` and ``anyOf`` are ordered by meaning);
  the top-level tool list is ordered by tool name;
- tuples become lists; a float with an integral value in the exact range of a double
  (``1.0``, ``-0.0``) becomes an int, so ``1`` and ``1.0`` render alike;
- NaN, infinities, sets, bytes, non-string keys and other non-JSON values are refused.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
import typing
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agentkv._errors import ToolSchemaError

__all__ = ["canonical_json", "fingerprint", "stable_tools", "tool_name"]

# Integral floats within +-2**53 are exactly representable as ints: fold them.
_MAX_EXACT_INT = 2**53
_FUNCTION_KEY_ORDER = ("name", "description", "parameters", "strict")
_FINGERPRINT_DOMAIN = b"agentkv-fingerprint-v1\x00"
# In json.dumps output (default separators), an object key that json may have converted
# from an int, float, bool or None.
_NON_STRING_KEY = re.compile(r'"(?:-?[0-9][0-9.eE+-]*|true|false|null|-?Infinity|NaN)": ')


class _JSONValueError(ValueError):
    """A value that has no single JSON rendering; ``path`` says where it is."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"value at {path} {problem}")
        self.path = path
        self.problem = problem


def _fold_float(text: str) -> float | int:
    value = float(text)
    if value.is_integer() and -_MAX_EXACT_INT <= value <= _MAX_EXACT_INT:
        return int(value)
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(type(value).__name__)


def _fast_normalize(value: Any, path: str) -> Any:
    """:func:`_normalize` at C speed: a sorted json round trip, exact path on failure.

    The round trip sorts keys at every depth, turns tuples into lists and subclasses of
    str/int/float into the plain types, and folds integral floats. Anything it refuses
    (NaN, infinities, sets, objects, keys of mixed types, cycles) is re-walked in Python
    to raise an error that names the place, and so is a value with a key that may have
    been converted from a non-string key.
    """
    try:
        text = json.dumps(value, sort_keys=True, allow_nan=False, default=_json_default)
    except (TypeError, ValueError):
        try:
            return _normalize(value, path)
        except RecursionError:
            raise _JSONValueError(path, "is nested too deeply or refers to itself") from None
    if _NON_STRING_KEY.search(text) is not None:
        # A key that reads like a number or a constant: maybe a str, maybe an int/float/
        # bool/None key that json converted. Only the exact walk can tell; it refuses the
        # latter (their text form would not sort like the original keys).
        return _normalize(value, path)
    return json.loads(text, parse_float=_fold_float)


def _normalize(value: Any, path: str) -> Any:
    """Return ``value`` rebuilt as plain JSON data with sorted object keys."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value
    if kind is int:
        return value
    if kind is float:
        return _normalize_float(value, path)
    if kind is dict or isinstance(value, Mapping):
        return _normalize_object(value, path)
    if kind is list or kind is tuple:
        return [_normalize(item, f"{path}[{i}]") for i, item in enumerate(value)]
    # Subclasses of the JSON scalar types (str/int enums, numpy-free float subclasses).
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _normalize_float(float(value), path)
    if isinstance(value, (set, frozenset)):
        raise _JSONValueError(path, "is a set, whose order is not stable; pass a sorted list")
    raise _JSONValueError(
        path, f"is a {kind.__name__}, which is not a JSON value; convert it to str/int/list/dict"
    )


def _normalize_float(value: float, path: str) -> float | int:
    if not math.isfinite(value):
        raise _JSONValueError(path, f"is {value!r}; JSON has no NaN or infinity")
    if value.is_integer() and -_MAX_EXACT_INT <= value <= _MAX_EXACT_INT:
        return int(value)
    return value


def _normalize_object(value: Mapping[Any, Any], path: str) -> dict[str, Any]:
    for key in value:
        if type(key) is not str:
            raise _JSONValueError(
                f"{path}.{key!r}", f"has a {type(key).__name__} key; JSON object keys are strings"
            )
    return {key: _normalize(value[key], f"{path}.{key}") for key in sorted(value)}


def es_number(value: float) -> str:
    """A finite float in ECMAScript ``Number.prototype.toString`` form (RFC 8785 §3.2.2.3).

    The digits are Python's shortest round-trip ones; only the layout differs from
    ``repr``: plain notation from 1e-6 up to 1e21, otherwise ``d.ddde±x``.
    """
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exp_text = repr(abs(value)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0") or "0"
    # value = 0.digits * 10**point
    point = (
        len(whole.lstrip("0")) + int(exp_text or 0)
        if whole != "0"
        else (int(exp_text or 0) - (len(frac) - len(frac.lstrip("0"))))
    )
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= point <= 21:
        return sign + digits + "0" * (point - k)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * (-point) + digits
    exponent = point - 1
    head = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{head}e{'+' if exponent >= 0 else '-'}{abs(exponent)}"


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _jcs_layout(value: Any, floats: list[str]) -> Any:
    """RFC 8785 details json.dumps does not do: keys in UTF-16 order (they differ from
    code-point order only beside characters above U+FFFF) and ECMAScript float text
    (each such float becomes a placeholder string, replaced after dumping)."""
    if isinstance(value, dict):
        keys = list(value)
        if any(not k.isascii() for k in keys):
            keys.sort(key=_utf16_key)
        return {k: _jcs_layout(value[k], floats) for k in keys}
    if isinstance(value, list):
        return [_jcs_layout(v, floats) for v in value]
    if isinstance(value, float):
        text = es_number(value)
        if text != repr(value):
            floats.append(text)
            return f"\x00{len(floats) - 1}\x00"
    return value


# Why this is written here and not ``rfc8785.dumps`` (the package is a dev dependency only,
# and tests/unit/prefix/test_jcs.py checks these bytes against it on generated values):
# - tool schemas carry integers outside I-JSON's +-(2**53 - 1): an int64 field's
#   ``"maximum": 9223372036854775807`` is a valid schema, and ``rfc8785.dumps`` refuses it
#   (``IntegerDomainError``), which would make ``stable_tools`` fail on a valid tool. Here
#   such an integer is written exactly (the only place the output leaves RFC 8785, which
#   has no text for it);
# - a value JSON cannot express fails with the path to it (``$.tools[2].parameters``) and
#   what to do, where ``rfc8785`` says only "unsupported type";
# - it is ~60 lines on the standard library, and ``import agentkv`` adds no dependency for it.
# For every value inside I-JSON the bytes are RFC 8785's (tests/unit/prefix/test_jcs.py,
# tests/unit/prefix/test_jcs_vectors.py).
def canonical_json(obj: Any) -> bytes:
    """Serialize ``obj`` to canonical JSON bytes: RFC 8785 (JCS).

    Object keys are sorted at every depth (by UTF-16 code units), there is no
    whitespace, strings are UTF-8 (not ``\\u`` escaped), integral floats are written as
    ints and other floats in ECMAScript form. The same logical value gives the same
    bytes in every process, whatever the dicts' insertion order or ``PYTHONHASHSEED``,
    and the same bytes as any other RFC 8785 implementation (integers beyond 2**53,
    which RFC 8785 leaves out, are written exactly).

    Raises:
        ValueError: ``obj`` holds NaN or an infinity.
        TypeError: ``obj`` holds a value JSON cannot express (a set, bytes, an object,
            a non-string key); the message names where it is (``$.a.b[2]``).
    """
    try:
        normalized = _fast_normalize(obj, "$")
    except _JSONValueError as exc:
        error = ValueError if "NaN" in exc.problem else TypeError
        raise error(f"canonical_json: {exc}") from None
    floats: list[str] = []
    normalized = _jcs_layout(normalized, floats)
    text = json.dumps(normalized, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for i, number in enumerate(floats):
        text = text.replace(f'"\\u0000{i}\\u0000"', number, 1)
    return text.encode("utf-8")


def fingerprint(tools: Iterable[Any] | None = None, system: Any | None = None) -> str:
    """Return a sha256 hex digest identifying a tool list and/or a system prompt.

    ``tools`` goes through :func:`stable_tools` first, so the fingerprint of the same
    logical tools does not depend on key order, tool order or input form. ``system`` is
    the system prompt: a string, or any JSON value (a list of content parts). Use the
    fingerprint in events, logs and cache namespaces instead of the content itself.

    Raises:
        TypeError: neither ``tools`` nor ``system`` was given.
        ToolSchemaError: a tool is invalid (see :func:`stable_tools`).
    """
    if tools is None and system is None:
        raise TypeError("fingerprint() needs tools=..., system=... or both")
    payload: dict[str, Any] = {}
    if tools is not None:
        payload["tools"] = stable_tools(tools)
    if system is not None:
        payload["system"] = system
    return hashlib.sha256(_FINGERPRINT_DOMAIN + canonical_json(payload)).hexdigest()


def tool_name(tool: Any) -> str | None:
    """Return the name of a tool in any form :func:`stable_tools` accepts, or ``None``."""
    if isinstance(tool, Mapping):
        function = tool.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool.get("name")
        return name if isinstance(name, str) else None
    if isinstance(tool, type) or callable(tool):
        name = getattr(tool, "__name__", None)
        return name if isinstance(name, str) else None
    return None


def stable_tools(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """Rebuild a tool list so that every process renders it to the same bytes.

    Accepts, in any mix: OpenAI Chat Completions tools
    (``{"type": "function", "function": {...}}``), bare function specs
    (``{"name", "description", "parameters"}``), pydantic model classes (name = class
    name, description = docstring) and plain Python functions (schema derived from the
    signature, type annotations and docstring). Returns new Chat Completions tool dicts,
    ordered by name, with canonical key order at every depth (see the module docstring).
    The input is not modified. ``stable_tools(stable_tools(x)) == stable_tools(x)``.

    Raises:
        ToolSchemaError: a tool has no name, two tools share a name, or a tool holds a
            value with no stable JSON form; the message names the tool and where.
    """
    if isinstance(tools, (Mapping, str, bytes)) or not isinstance(tools, Iterable):
        raise ToolSchemaError(
            f"stable_tools() takes a list of tools, got a {type(tools).__name__}; "
            "wrap a single tool in a list"
        )
    # Validate each tool, then normalize all of them in one C-speed pass; only when that
    # pass refuses a value are the tools re-walked one by one to name the culprit.
    specs: list[tuple[str, Mapping[str, Any], dict[str, Any]]] = []
    for index, tool in enumerate(tools):
        label = _label(index, tool)
        function = _function_spec(tool, label)
        _validate_function(function, label)
        extras = (
            {k: v for k, v in tool.items() if k not in ("type", "function")}
            if isinstance(tool, Mapping) and "function" in tool
            else {}
        )
        specs.append((label, function, extras))
    try:
        normalized = _fast_normalize([[function, extras] for _, function, extras in specs], "$")
    except _JSONValueError:
        for label, function, extras in specs:
            try:
                _fast_normalize(function, "$.function")
                _fast_normalize(extras, "$")
            except _JSONValueError as exc:
                raise ToolSchemaError(f"{label}: {exc}") from None
        raise  # pragma: no cover - the per-tool pass always finds the culprit
    built: dict[str, dict[str, Any]] = {}
    for (label, _, _), (function, extras) in zip(specs, normalized, strict=True):
        name = function["name"]
        if name in built:
            raise ToolSchemaError(
                f"{label}: another tool is also named {name!r}; tool names must be unique"
            )
        ordered = {key: function[key] for key in _FUNCTION_KEY_ORDER if key in function}
        ordered.update((key, value) for key, value in function.items() if key not in ordered)
        built[name] = {"type": "function", "function": ordered, **extras}
    return [built[name] for name in sorted(built)]


def _label(index: int, tool: Any) -> str:
    name = tool_name(tool)
    return f"tool #{index} ({name!r})" if name else f"tool #{index}"


def _function_spec(tool: Any, label: str) -> Mapping[str, Any]:
    """Return the function-level mapping (name, description, parameters, ...)."""
    if isinstance(tool, Mapping):
        if "function" in tool:
            if tool.get("type", "function") != "function":
                raise ToolSchemaError(
                    f"{label}: type is {tool.get('type')!r}; only function tools are supported"
                )
            function = tool["function"]
            if not isinstance(function, Mapping):
                raise ToolSchemaError(f"{label}: 'function' must be an object")
            return function
        return {key: value for key, value in tool.items() if key != "type"}
    if isinstance(tool, type) and _is_pydantic_model(tool):
        return _spec_from_pydantic(tool, label)
    if callable(tool):
        return _spec_from_callable(tool, label)
    raise ToolSchemaError(
        f"{label}: {type(tool).__name__} {tool!r:.40} is not a tool; pass an OpenAI tool dict, a "
        "function spec dict, a pydantic model class or a Python function"
    )


def _validate_function(function: Mapping[str, Any], label: str) -> None:
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ToolSchemaError(f"{label}: missing or empty 'name'; every tool needs a name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolSchemaError(f"{label}: 'description' must be a string")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ToolSchemaError(f"{label}: 'parameters' must be a JSON-schema object")


# --- pydantic models --------------------------------------------------------------------


def _is_pydantic_model(cls: type) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic is a core dependency
        return False
    return issubclass(cls, BaseModel)


def _spec_from_pydantic(model: type, label: str) -> dict[str, Any]:
    try:
        schema = dict(model.model_json_schema())  # type: ignore[attr-defined]
    except Exception as exc:
        raise ToolSchemaError(f"{label}: pydantic could not build a JSON schema: {exc}") from exc
    schema.pop("title", None)
    description = schema.pop("description", None)
    spec: dict[str, Any] = {"name": model.__name__}
    if description:
        spec["description"] = description
    spec["parameters"] = schema
    return spec


# --- plain Python functions ---------------------------------------------------------------

_ARGS_HEADERS = {"args:", "arguments:", "parameters:", "params:", "keyword args:"}
_OTHER_HEADERS = {
    "returns:",
    "return:",
    "raises:",
    "yields:",
    "examples:",
    "example:",
    "notes:",
    "note:",
    "see also:",
    "attributes:",
    "warnings:",
}
_NUMPY_HEADERS = {"parameters", "returns", "raises", "yields", "examples", "notes", "see also"}
_REST_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+):\s*(.*)$")
_GOOGLE_ENTRY = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_ENTRY = re.compile(r"^(\w+)\s*(?::.*)?$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and per-parameter descriptions.

    Understands Google (``Args:``), reST (``:param x:``) and numpy (``Parameters`` +
    dashes) styles. The description is the text before the first section.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, list[str]] = {}
    section = "summary"
    current: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        lowered = stripped.lower()
        next_line = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if lowered in _NUMPY_HEADERS and next_line and set(next_line) == {"-"}:
            section, current = ("numpy" if lowered == "parameters" else "other"), None
            i += 2
            continue
        if lowered in _ARGS_HEADERS:
            section, current = "google", None
        elif lowered in _OTHER_HEADERS or lowered.startswith((":return", ":raises", ":rtype")):
            section, current = "other", None
        elif match := _REST_PARAM.match(stripped):
            section, current = "rest", match.group(1)
            params[current] = [match.group(2)] if match.group(2) else []
        elif section == "summary":
            summary.append(line)
        elif section == "rest" and current and stripped and line[:1].isspace():
            params[current].append(stripped)
        elif section in ("google", "numpy") and stripped:
            indent = len(line) - len(line.lstrip())
            entry = (_GOOGLE_ENTRY if section == "google" else _NUMPY_ENTRY).match(stripped)
            is_entry = entry is not None and (indent <= 4 if section == "google" else indent == 0)
            if is_entry and entry is not None:
                current = entry.group(1).lstrip("*")
                rest = entry.group(2) if section == "google" else ""
                params[current] = [rest] if rest else []
            elif current:
                params[current].append(stripped)
        i += 1
    description = "\n".join(summary).strip()
    return description, {k: " ".join(v).strip() for k, v in params.items() if " ".join(v).strip()}


def _spec_from_callable(func: Callable[..., Any], label: str) -> dict[str, Any]:
    from pydantic import ConfigDict, Field, create_model
    from pydantic.json_schema import GenerateJsonSchema

    name = getattr(func, "__name__", None)
    if not isinstance(name, str) or name == "<lambda>":
        raise ToolSchemaError(f"{label}: the callable has no usable __name__; give it one")
    try:
        signature = inspect.signature(func)
        hints = typing.get_type_hints(func, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise ToolSchemaError(f"{label}: cannot read the signature: {exc}") from exc
    description, param_docs = parse_docstring(inspect.getdoc(func))
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolSchemaError(
                f"{label}: *{param.name} cannot be described as a JSON schema; use named parameters"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        doc = param_docs.get(param.name)
        field = Field(default, description=doc) if doc else Field(default)
        fields[param.name] = (annotation, field)

    class _NoFieldTitles(GenerateJsonSchema):
        def field_title_should_be_set(self, schema: Any) -> bool:
            return False

    try:
        model = create_model(  # type: ignore[call-overload]
            name, __config__=ConfigDict(arbitrary_types_allowed=False), **fields
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # non-JSON defaults are dropped, not fatal
            schema = dict(model.model_json_schema(schema_generator=_NoFieldTitles))
    except Exception as exc:
        raise ToolSchemaError(
            f"{label}: cannot derive a JSON schema from the signature ({exc}); "
            "annotate parameters with JSON-compatible types"
        ) from exc
    schema.pop("title", None)
    schema.pop("description", None)
    schema.setdefault("properties", {})
    spec: dict[str, Any] = {"name": name}
    if description:
        spec["description"] = description
    spec["parameters"] = schema
    return spec
