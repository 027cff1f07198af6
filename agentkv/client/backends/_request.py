"""Request and response plumbing shared by the client wrapper (no policy here).

- :func:`merge_fields` puts agentkv's body fields and headers under the caller's own
  (the request body, ``extra_body``, ``extra_headers`` and the client's default
  headers always win; dict-valued fields such as ``vllm_xargs`` / ``nvext`` are merged
  key by key);
- :func:`header_safe` keeps header values printable ASCII (a hash otherwise);
- :func:`parse_usage` / :func:`response_meta` read token counts and the response's id,
  model and finish reasons from any of the three APIs' answers (objects or JSON);
- :func:`tokens_of` renders a request to token ids with a local tokenizer (never sent).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from agentkv.client.backends._adapters import Api

__all__ = [
    "header_safe",
    "merge_fields",
    "parse_usage",
    "response_meta",
    "tokens_of",
]

Usage = tuple[int | None, int | None, int | None]
Meta = tuple[str | None, str | None, tuple[str, ...]]


def header_safe(value: str) -> str:
    if value.isascii() and value.isprintable():
        return value
    return "h-" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def merge_fields(
    json_data: Mapping[str, Any],
    extra_json: Mapping[str, Any] | None,
    fields: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``extra_json`` to send: agentkv's ``fields`` under the caller's values.

    A key the caller set in the body or in ``extra_body`` keeps the caller's value; for
    dict values set on both sides the keys are merged (the caller's win).
    """
    out: dict[str, Any] = {}
    for key, value in fields.items():
        mine = json_data.get(key)
        if key not in json_data:
            out[key] = value
        elif isinstance(mine, Mapping) and isinstance(value, Mapping):
            out[key] = {**value, **mine}
    for key, value in (extra_json or {}).items():
        ours = out.get(key)
        if isinstance(ours, Mapping) and isinstance(value, Mapping):
            out[key] = {**ours, **value}
        else:
            out[key] = value
    return out


def tokens_of(tokenizer: Any, api: Api, body: Mapping[str, Any]) -> list[int] | None:
    if hasattr(tokenizer, "apply_chat_template"):
        if api == "chat" and "messages" in body:
            extra = {"tools": body["tools"]} if body.get("tools") else {}
            ids: Any = tokenizer.apply_chat_template(
                list(body["messages"]), add_generation_prompt=True, tokenize=True, **extra
            )
        elif api == "completions" and isinstance(body.get("prompt"), str):
            ids = tokenizer.encode(body["prompt"])
        else:
            return None
    else:
        ids = tokenizer(api, dict(body))
    if ids is None:
        return None
    if not isinstance(ids, list) and hasattr(ids, "get"):
        ids = ids.get("input_ids")
    return [int(x) for x in ids] if ids is not None else None


def _get(obj: Any, name: str) -> Any:
    """``obj[name]`` / ``obj.name`` or None (a pydantic model's extras are attributes)."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reader(obj: Any) -> Callable[[str], Any]:
    """``name -> obj[name] / obj.name or None`` for one answer."""
    if isinstance(obj, dict):
        return obj.get
    return lambda name: getattr(obj, name, None)


def parse_cache_write(obj: Any) -> int | None:
    """Tokens written to a prompt cache by this call (Anthropic's
    ``cache_creation_input_tokens``); None where the answer does not report them."""
    usage_obj = _get(obj, "usage")
    if usage_obj is None:
        return None
    return _int(_reader(usage_obj)("cache_creation_input_tokens"))


def parse_usage(obj: Any) -> Usage:
    """(prompt, completion, cached) token counts from an answer (object or JSON dict).

    Anthropic's ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` are added
    to ``input_tokens`` (which excludes them), so prompt tokens mean the same everywhere.
    """
    usage_obj = _get(obj, "usage")
    if usage_obj is None:
        return None, None, None
    usage = _reader(usage_obj)
    # ``_int`` called only for what is not a plain int (the usual figures are).
    prompt = usage("prompt_tokens")
    if type(prompt) is not int:
        prompt = _int(prompt)
        if prompt is None:
            prompt = _int(usage("input_tokens"))
    completion = usage("completion_tokens")
    if type(completion) is not int:
        completion = _int(completion)
        if completion is None:
            completion = _int(usage("output_tokens"))
    details = usage("prompt_tokens_details") or usage("input_tokens_details")
    cached = _get(details, "cached_tokens") if details is not None else None
    if type(cached) is not int:
        cached = _int(cached)
    read = usage("cache_read_input_tokens")
    if read is not None and type(read) is not int:
        read = _int(read)
    if read is not None:  # Anthropic
        created = _int(usage("cache_creation_input_tokens")) or 0
        cached = read
        prompt = (prompt or 0) + read + created
    return prompt, completion, cached


def response_meta(obj: Any) -> Meta:
    """(response id, response model, finish reasons) of an answer or a stream item."""
    get = _reader(obj)
    rid, model = get("id"), get("model")
    reasons: list[str] = []
    for choice in get("choices") or ():
        reason = _get(choice, "finish_reason")
        if isinstance(reason, str):
            reasons.append(reason)
    stop = get("stop_reason")  # Anthropic
    if isinstance(stop, str):
        reasons.append(stop)
    if not reasons and get("object") == "response":
        status = get("status")
        if isinstance(status, str):
            reasons.append(status)
    return (
        rid if isinstance(rid, str) else None,
        model if isinstance(model, str) else None,
        tuple(reasons),
    )
