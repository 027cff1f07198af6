"""``wrap_openai`` / ``unwrap_openai``: agentkv at the OpenAI client's request choke point.

The wrapper replaces, on this client instance only, its ``request`` method — the one
path every endpoint takes — with a thin driver of :func:`agentkv.client._flow.call_flow`.
So ``create``, ``parse``, ``stream()``, ``with_raw_response`` and
``with_streaming_response`` of chat completions, completions and responses, sync and
async, all carry hints inside a trajectory and leave a :class:`agentkv.TurnRecord`
(usage, cached tokens, TTFT). Calls outside a trajectory, and every other endpoint, go
straight through. The client's ``copy`` / ``with_options`` give wrapped copies.

Because only the instance's ``request`` changes, other instrumentors that patch the
resource classes (``create``) or the transport keep working, in either order; when one
has made the call's chat span current, agentkv adds its attributes to that span
instead of making a second one. :func:`unwrap_openai` restores the client.

Any failure inside agentkv sends the user's request unchanged (invariant 1); see
:mod:`agentkv.client._call` for the modes and the one deliberate refusal (a tenant's
salt that cannot be sent).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from agentkv._guard import internal_error
from agentkv.advice._advisor import Advisor, Mode
from agentkv.client._flow import PATIENT_PROBE, PROBE, Read, Send, call_flow
from agentkv.client._options import ClientOptions
from agentkv.client._state import ClientState
from agentkv.client.backends._adapters import Api
from agentkv.events._context import resolve_current

__all__ = ["ClientOptions", "unwrap_openai", "wrap_anthropic", "wrap_openai"]

C = TypeVar("C")

#: Request paths of model calls, per API (the SDK's ``options.url``).
MODEL_PATHS: dict[str, Api] = {
    "/chat/completions": "chat",
    "/completions": "completions",
    "/responses": "responses",
}
#: ... and of the Anthropic Messages API.
ANTHROPIC_PATHS: dict[str, Api] = {"/v1/messages": "messages"}
_STATE_ATTR = "_agentkv_state"
_PATCHED = ("request", "copy", "with_options")


def _drive_sync(
    flow: Generator[Any, Any, Any], state: ClientState, send: Callable[..., Any]
) -> Any:
    step = next(flow)
    while True:
        try:
            if isinstance(step, Send):  # first: the common step
                out = send(step)
            elif step in (PROBE, PATIENT_PROBE):
                out = state.probe(patient=step == PATIENT_PROBE)
            elif isinstance(step, Read):
                out = step.response.read()
            else:  # pragma: no cover - the flow yields nothing else
                raise TypeError(step)
        except BaseException as exc:
            try:
                step = flow.throw(exc)
            except StopIteration as done:
                return done.value
            continue
        try:
            step = flow.send(out)
        except StopIteration as done:
            return done.value


async def _drive_async(
    flow: Generator[Any, Any, Any], state: ClientState, send: Callable[..., Any]
) -> Any:
    step = next(flow)
    while True:
        try:
            if isinstance(step, Send):  # first: the common step
                out = await send(step)
            elif step in (PROBE, PATIENT_PROBE):
                out = await state.probe_async(patient=step == PATIENT_PROBE)
            elif isinstance(step, Read):
                out = await step.response.aread()
            else:  # pragma: no cover - the flow yields nothing else
                raise TypeError(step)
        except BaseException as exc:
            try:
                step = flow.throw(exc)
            except StopIteration as done:
                return done.value
            continue
        try:
            step = flow.send(out)
        except StopIteration as done:
            return done.value


def _start(
    state: ClientState, paths: dict[str, Api], options: Any, kwargs: dict[str, Any]
) -> Generator[Any, Any, Any] | None:
    """The flow of a model call made inside a trajectory; None: send it untouched."""
    traj = resolve_current()
    if traj is None:
        return None
    url = getattr(options, "url", None)  # which API (None: not a model call)
    api = paths.get(url) if isinstance(url, str) else None
    if api is None:
        return None
    try:
        return call_flow(
            state,
            api,
            options,
            bool(kwargs.get("stream")),
            kwargs.get("stream_cls"),
            traj,
            state.taken,
        )
    except Exception as exc:
        internal_error("client flow", exc)
        return None


def _sync_request(orig: Callable[..., Any], state: ClientState, paths: dict[str, Api]) -> Any:
    @functools.wraps(orig)
    def request(cast_to: Any, options: Any, **kwargs: Any) -> Any:
        flow = _start(state, paths, options, kwargs)
        if flow is None:
            return orig(cast_to, options, **kwargs)
        return _drive_sync(
            flow,
            state,
            lambda s: orig(cast_to, s.options, **{**kwargs, "stream_cls": s.stream_cls}),
        )

    return request


def _async_request(orig: Callable[..., Any], state: ClientState, paths: dict[str, Api]) -> Any:
    @functools.wraps(orig)
    async def request(cast_to: Any, options: Any, **kwargs: Any) -> Any:
        flow = _start(state, paths, options, kwargs)
        if flow is None:
            return await orig(cast_to, options, **kwargs)
        return await _drive_async(
            flow,
            state,
            lambda s: orig(cast_to, s.options, **{**kwargs, "stream_cls": s.stream_cls}),
        )

    return request


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
    ``copy`` copies) and returned, so it keeps its type. Wrapping twice is a no-op;
    :func:`unwrap_openai` undoes it.

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
    instrument(client, resolved, MODEL_PATHS, wrap_openai)
    return client


def wrap_anthropic(
    client: C,
    *,
    options: ClientOptions | None = None,
    advisor: Advisor | None = None,
    mode: Mode | None = None,
    provider_name: str | None = None,
) -> C:
    """Make ``client`` (``anthropic.Anthropic`` or ``AsyncAnthropic``) cache across gaps.

    Inside a trajectory, each ``messages.create`` / ``stream`` / ``parse`` call (sync or
    async, raw or streaming responses alike) gets ``cache_control`` breakpoints on the
    last tool, the system prompt and the last message, with a TTL of ``5m`` or ``1h``
    chosen from the learned gap before the next call (see
    ``agentkv.client.backends._anthropic``); breakpoints you placed yourself are left as
    they are. It leaves a :class:`agentkv.TurnRecord` (cached tokens from
    ``cache_read_input_tokens``). Changed in place and returned, like
    :func:`wrap_openai`; :func:`unwrap_openai` removes it.

    A trajectory with a ``tenant`` needs ``ClientOptions(allow_unsalted=True)``: the API
    isolates caches per organization, and agentkv has no salt to add.
    """
    given: dict[str, Any] = {"advisor": advisor, "mode": mode, "provider_name": provider_name}
    resolved = dataclasses.replace(
        options or ClientOptions(),
        backend="anthropic",
        **{k: v for k, v in given.items() if v is not None},
    )
    instrument(client, resolved, ANTHROPIC_PATHS, wrap_anthropic)
    return client


def instrument(
    client: Any, options: ClientOptions, paths: dict[str, Api], rewrap: Callable[..., Any]
) -> None:
    """Hook ``client.request`` (and its copies) for the model calls at ``paths``."""
    if getattr(client, "__dict__", {}).get(_STATE_ATTR) is not None:
        return
    state = ClientState(client, options)
    try:
        state.taken = frozenset(str(k).lower() for k in getattr(client, "default_headers", {}))
    except Exception:  # an unusual client: its default headers are not ours to read
        state.taken = frozenset()
    orig = client.request
    make = _async_request if inspect.iscoroutinefunction(orig) else _sync_request
    attrs = vars(client)
    attrs["request"] = make(orig, state, paths)
    copy = getattr(client, "copy", None)
    if callable(copy):

        @functools.wraps(copy)
        def wrapped_copy(*args: Any, **kwargs: Any) -> Any:
            return rewrap(copy(*args, **kwargs), options=options)

        attrs["copy"] = attrs["with_options"] = wrapped_copy
    attrs[_STATE_ATTR] = state


def unwrap_openai(client: C) -> C:
    """Remove :func:`wrap_openai` (or ``wrap_anthropic``) from ``client``; returns it.

    Calls made afterwards go out untouched; copies made while wrapped stay wrapped.
    A client that is not wrapped is returned unchanged.
    """
    attrs = getattr(client, "__dict__", {})
    if attrs.pop(_STATE_ATTR, None) is not None:
        for name in _PATCHED:
            attrs.pop(name, None)
    return client


def is_wrapped(client: Any) -> bool:
    """True when ``client`` is wrapped by agentkv."""
    return getattr(client, "__dict__", {}).get(_STATE_ATTR) is not None
