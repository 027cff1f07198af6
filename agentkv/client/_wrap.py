"""``wrap_openai``: attach agentkv hints to OpenAI-client calls made inside a trajectory.

The wrapper replaces, on this client instance only, the ``create`` methods of
``chat.completions``, ``completions`` and ``responses`` (sync or async, streaming or
not). Inside a trajectory each call:

1. begins a model call (``model_started``, the turn advances) and ends it when the
   answer is complete (for a stream: when it is exhausted or closed);
2. computes advice (:class:`agentkv.Advisor`) and lets the backend adapter write ids and
   hints into ``extra_body`` / ``extra_headers``, merged under the caller's own values;
3. records a :class:`agentkv.TurnRecord` (cached tokens, eligible prefix, TTFT) and
   registers the trajectory with the lifecycle channel when the server has a control
   route.

Outside a trajectory the call goes through untouched. Any failure inside agentkv sends
the user's request unchanged (invariant 1); if the server rejects the hinted request
with HTTP 400/422 and the unhinted one succeeds, body hints are switched off for this
client. openai 3.x talks HTTP through httpx2; nothing here depends on transport hooks.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from agentkv._guard import internal_error
from agentkv.client._call import begin, note_rejection, retry_without_hints
from agentkv.client._options import ClientOptions
from agentkv.client._state import ClientState
from agentkv.client.backends import BackendAdapter
from agentkv.client.backends._adapters import Api
from agentkv.client.backends._request import wrap_async_stream, wrap_sync_stream
from agentkv.events._context import current_trajectory
from agentkv.policy._advisor import Advisor, Mode

__all__ = ["ClientOptions", "wrap_openai"]

C = TypeVar("C")

_TARGETS: tuple[tuple[tuple[str, ...], Api], ...] = (
    (("chat", "completions"), "chat"),
    (("completions",), "completions"),
    (("responses",), "responses"),
)
_STATE_ATTR = "_agentkv_state"
_WRAPPERS = ("with_raw_response", "with_streaming_response")


def _make_sync(orig: Callable[..., Any], state: ClientState, api: Api) -> Callable[..., Any]:
    @functools.wraps(orig)
    def create(*args: Any, **kwargs: Any) -> Any:
        if current_trajectory() is None:
            return orig(*args, **kwargs)
        try:
            adapter: BackendAdapter | None = state.get_adapter()
        except Exception as exc:
            internal_error("wrap_openai backend", exc)
            adapter = None
        ctx, hinted = begin(state, api, adapter, kwargs)
        if ctx is None:
            return orig(*args, **kwargs)
        try:
            result = orig(*args, **hinted)
        except BaseException as exc:
            if not retry_without_hints(ctx, exc):
                raise
            try:
                result = orig(*args, **kwargs)
            except BaseException as exc2:
                ctx.finish(error=exc2)
                raise
            note_rejection(state)
        if ctx.streamed:
            return wrap_sync_stream(ctx, result)
        ctx.finish(result)
        return result

    create.__agentkv_wrapped__ = True  # type: ignore[attr-defined]
    return create


def _make_async(orig: Callable[..., Any], state: ClientState, api: Api) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def create(*args: Any, **kwargs: Any) -> Any:
        if current_trajectory() is None:
            return await orig(*args, **kwargs)
        try:
            adapter: BackendAdapter | None = await state.get_adapter_async()
        except Exception as exc:
            internal_error("wrap_openai backend", exc)
            adapter = None
        ctx, hinted = begin(state, api, adapter, kwargs)
        if ctx is None:
            return await orig(*args, **kwargs)
        try:
            result = await orig(*args, **hinted)
        except BaseException as exc:
            if not retry_without_hints(ctx, exc):
                raise
            try:
                result = await orig(*args, **kwargs)
            except BaseException as exc2:
                ctx.finish(error=exc2)
                raise
            note_rejection(state)
        if ctx.streamed:
            return wrap_async_stream(ctx, result)
        ctx.finish(result)
        return result

    create.__agentkv_wrapped__ = True  # type: ignore[attr-defined]
    return create


def wrap_openai(
    client: C,
    *,
    options: ClientOptions | None = None,
    backend: str | None = None,
    advisor: Advisor | None = None,
    mode: Mode | None = None,
    tokenizer: Any = None,
    block_size: int | None = None,
    namespace: Any = None,
    salt_secret: str | bytes | None = None,
    lifecycle: bool | None = None,
    probe_timeout_s: float | None = None,
    kv_bytes_per_token: int | None = None,
    provider_name: str | None = None,
) -> C:
    """Make ``client`` (``OpenAI`` or ``AsyncOpenAI``) send agentkv hints inside trajectories.

    The client is changed in place (only this instance and its ``with_options`` /
    ``copy`` copies) and returned, so it keeps its type. Wrapping twice is a no-op.

    ``options`` holds the settings (:class:`agentkv.ClientOptions`, whose docstring
    explains each one); every other keyword is a shorthand for the option of the same
    name and, when given (not None), overrides it::

        agentkv.wrap_openai(client, options=ClientOptions(backend="vllm"), mode="shadow")

    Raises:
        ConfigError: an unknown ``backend`` or ``mode``.
    """
    given = {
        "backend": backend,
        "advisor": advisor,
        "mode": mode,
        "tokenizer": tokenizer,
        "block_size": block_size,
        "namespace": namespace,
        "salt_secret": salt_secret,
        "lifecycle": lifecycle,
        "probe_timeout_s": probe_timeout_s,
        "kv_bytes_per_token": kv_bytes_per_token,
        "provider_name": provider_name,
    }
    resolved = dataclasses.replace(
        options or ClientOptions(), **{k: v for k, v in given.items() if v is not None}
    )
    if getattr(client, "__dict__", {}).get(_STATE_ATTR) is not None:
        return client
    _instrument(client, ClientState(client, resolved))
    return client


def _instrument(client: Any, state: ClientState) -> None:
    """Wrap the ``create`` methods of ``client``'s APIs and its copies (see the module doc)."""
    for path, api in _TARGETS:
        try:
            resource = functools.reduce(getattr, path, client)
        except Exception:
            continue  # an older client without this API
        orig = getattr(resource, "create", None)
        if orig is None or getattr(orig, "__agentkv_wrapped__", False):
            continue
        is_async = inspect.iscoroutinefunction(inspect.unwrap(orig))
        resource.create = (_make_async if is_async else _make_sync)(orig, state, api)
        for name in _WRAPPERS:
            vars(resource).pop(name, None)  # rebuilt lazily around the wrapper
    for name in _WRAPPERS:
        vars(client).pop(name, None)
    copy = getattr(client, "copy", None)
    if callable(copy):
        options = state.options

        @functools.wraps(copy)
        def wrapped_copy(*args: Any, **kwargs: Any) -> Any:
            return wrap_openai(copy(*args, **kwargs), options=options)

        client.copy = wrapped_copy
        client.with_options = wrapped_copy
    setattr(client, _STATE_ATTR, state)
