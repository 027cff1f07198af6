"""Request and response plumbing shared by the client wrapper (no policy here).

- :func:`merge_extras` puts agentkv's fields under the caller's ``extra_body`` /
  ``extra_headers`` / keyword arguments (the caller always wins);
- :func:`header_safe` keeps header values printable ASCII (a hash otherwise);
- :func:`parse_usage` reads prompt, completion and cached tokens from any of the three
  APIs' usage objects;
- :func:`tokens_of` renders a request to token ids with a local tokenizer (never sent);
- :func:`wrap_sync_stream` / :func:`wrap_async_stream` instrument an OpenAI stream in
  place: first-token time, usage from the final chunk, and the end of the model call when
  the stream is exhausted or closed.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from typing import Any, Protocol

from agentkv.client.backends._adapters import Api

__all__ = [
    "header_safe",
    "hook_close",
    "merge_extras",
    "parse_usage",
    "tokens_of",
    "wrap_async_stream",
    "wrap_sync_stream",
]


class _CallLike(Protocol):
    def observe_item(self, item: Any) -> None: ...

    def finish(
        self, result: Any = None, *, outcome: str = "ok", error: BaseException | None = None
    ) -> None: ...


def header_safe(value: str) -> str:
    if all(" " <= ch <= "~" for ch in value):
        return value
    return "h-" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def merge_extras(
    kwargs: dict[str, Any], body: dict[str, Any], headers: dict[str, str]
) -> dict[str, Any]:
    """Our fields under the caller's: the caller's extra_body / extra_headers / kwargs win."""
    out = dict(kwargs)
    if body:
        caller = kwargs.get("extra_body")
        merged: dict[str, Any] = {k: v for k, v in body.items() if k not in kwargs}
        if isinstance(caller, Mapping):
            for key, value in caller.items():
                mine = merged.get(key)
                if isinstance(mine, dict) and isinstance(value, Mapping):
                    merged[key] = {**mine, **value}  # vllm_xargs / nvext: keys merged
                else:
                    merged[key] = value
            out["extra_body"] = merged
        elif caller is None:
            out["extra_body"] = merged
    if headers:
        caller_h = kwargs.get("extra_headers")
        if caller_h is None or isinstance(caller_h, Mapping):
            taken = {str(k).lower() for k in (caller_h or {})}
            merged_h: dict[str, Any] = {k: v for k, v in headers.items() if k.lower() not in taken}
            merged_h.update(caller_h or {})
            out["extra_headers"] = merged_h
    return out


def tokens_of(tokenizer: Any, api: Api, kwargs: dict[str, Any]) -> list[int] | None:
    if hasattr(tokenizer, "apply_chat_template"):
        if api == "chat" and "messages" in kwargs:
            extra = {"tools": kwargs["tools"]} if kwargs.get("tools") else {}
            ids: Any = tokenizer.apply_chat_template(
                list(kwargs["messages"]), add_generation_prompt=True, tokenize=True, **extra
            )
        elif api == "completions" and isinstance(kwargs.get("prompt"), str):
            ids = tokenizer.encode(kwargs["prompt"])
        else:
            return None
    else:
        ids = tokenizer(api, kwargs)
    if ids is None:
        return None
    if not isinstance(ids, list) and hasattr(ids, "get"):
        ids = ids.get("input_ids")
    return [int(x) for x in ids] if ids is not None else None


def parse_usage(obj: Any) -> tuple[int | None, int | None, int | None]:
    """Read (prompt, completion, cached) token counts from a response, raw or parsed."""
    if (
        getattr(obj, "usage", None) is None
        and hasattr(obj, "http_response")
        and callable(getattr(obj, "parse", None))
    ):
        # A ``with_raw_response`` result (what langchain-openai uses); openai caches
        # ``parse()``, so the caller parsing it again costs nothing.
        obj = obj.parse()
    usage = getattr(obj, "usage", None)
    if usage is None:
        return None, None, None
    prompt = getattr(usage, "prompt_tokens", None)
    if prompt is None:
        prompt = getattr(usage, "input_tokens", None)
    completion = getattr(usage, "completion_tokens", None)
    if completion is None:
        completion = getattr(usage, "output_tokens", None)
    details = getattr(usage, "prompt_tokens_details", None) or getattr(
        usage, "input_tokens_details", None
    )
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return (
        int(prompt) if isinstance(prompt, int) else None,
        int(completion) if isinstance(completion, int) else None,
        int(cached) if isinstance(cached, int) else None,
    )


def wrap_sync_stream(ctx: _CallLike, result: Any) -> Any:
    inner = getattr(result, "_iterator", None)
    if inner is None:
        ctx.finish(result)
        return result

    def instrumented() -> Any:
        done = False
        try:
            for item in inner:
                ctx.observe_item(item)
                yield item
            done = True
        except BaseException as exc:
            ctx.finish(
                error=exc if not isinstance(exc, GeneratorExit) else None, outcome="incomplete"
            )
            raise
        finally:
            ctx.finish(outcome="ok" if done else "incomplete")

    result._iterator = instrumented()
    hook_close(ctx, result)
    return result


def hook_close(ctx: _CallLike, result: Any) -> None:
    """A stream closed before it is exhausted ends the model call as ``incomplete``."""
    close = getattr(result, "close", None)
    if close is None:
        return
    if inspect.iscoroutinefunction(close):

        async def aclose() -> Any:
            try:
                return await close()
            finally:
                ctx.finish(outcome="incomplete")

        result.close = aclose
    else:

        def sclose() -> Any:
            try:
                return close()
            finally:
                ctx.finish(outcome="incomplete")

        result.close = sclose


def wrap_async_stream(ctx: _CallLike, result: Any) -> Any:
    inner = getattr(result, "_iterator", None)
    if inner is None:
        ctx.finish(result)
        return result

    async def instrumented() -> Any:
        done = False
        try:
            async for item in inner:
                ctx.observe_item(item)
                yield item
            done = True
        except BaseException as exc:
            ctx.finish(
                error=exc if not isinstance(exc, GeneratorExit) else None, outcome="incomplete"
            )
            raise
        finally:
            ctx.finish(outcome="ok" if done else "incomplete")

    result._iterator = instrumented()
    hook_close(ctx, result)
    return result
