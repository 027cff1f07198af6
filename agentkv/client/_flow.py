"""The call flow at an SDK client's request choke point, sans-I/O, and its stream classes.

Stainless-generated SDKs (``openai``, ``anthropic``) send every endpoint through one
method, ``client.request(cast_to, options, *, stream, stream_cls)``: ``create``,
``parse``, ``stream()``, ``with_raw_response`` and ``with_streaming_response`` alike.
:func:`call_flow` holds every decision of one such call as a generator; it yields what
needs I/O and receives the outcome:

- :data:`PROBE`: ask the server what it is (the driver returns the adapter);
  :data:`PATIENT_PROBE` asks again with a longer timeout, before a tenant's call would
  fail closed for want of an answer;
- :class:`Send`: send these request options (the driver returns the SDK's result or
  throws its exception into the flow);
- :class:`Read`: read this raw HTTP response's body (``with_streaming_response``).

The sync and async drivers (:mod:`agentkv.client._wrap`) only perform those steps.
Streams are covered by swapping ``stream_cls`` for a subclass (one per stream type,
made once) whose ``__stream__`` observes each item: first-token time, usage from the
last chunk, and the end of the call when the stream is exhausted, fails or is closed —
however the stream object is reached (directly, or later from a raw response's
``parse()``).
"""

from __future__ import annotations

import inspect
import json
import logging
import typing
import weakref
from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from agentkv._errors import TenantIsolationError
from agentkv._guard import internal_error, warn_once
from agentkv.client._call import Call, begin
from agentkv.client._state import ClientState
from agentkv.client.backends import BackendAdapter
from agentkv.client.backends._adapters import Api
from agentkv.client.backends._request import merge_fields
from agentkv.events._context import Trajectory

__all__ = ["PATIENT_PROBE", "PROBE", "Read", "Send", "call_flow", "stream_class"]

logger = logging.getLogger("agentkv")

PROBE = "probe"  # step: ask the server (the driver sends back the adapter)
PATIENT_PROBE = "patient-probe"  # step: ask again with a longer timeout (a tenant waits)
_RAW_HEADER = "X-Stainless-Raw-Response"


@dataclass(slots=True)
class Send:
    """Step: send the request with these options (and stream class)."""

    options: Any
    stream_cls: Any


@dataclass(slots=True)
class Read:
    """Step: read the body of this (not yet read) HTTP response."""

    response: Any


Step = str | Send | Read


def _is_mapping(value: Any) -> bool:
    """``isinstance(value, Mapping)``, without the ABC check for the usual plain dict."""
    return type(value) is dict or isinstance(value, Mapping)


def with_fields(
    options: Any,
    base: tuple[Any, Any],
    fields: Mapping[str, Any],
    headers: Mapping[str, str],
    taken: frozenset[str],
) -> Any:
    """``options`` carrying agentkv's fields and headers under the caller's; returned.

    ``base``: the caller's ``(extra_json, headers)`` as the SDK built them. The options
    object is the one the SDK built for this call alone (it copies it again before
    sending), so it is updated in place rather than copied. ``taken``: header names
    (lower case) the client sets by default; they win too.

    Without a caller's ``extra_body``, the fields go straight into the request body
    (what the SDK's own merge of ``extra_json`` would send, without that merge).
    """
    extra_json, given_headers = base
    json_data = options.json_data
    body = json_data if _is_mapping(json_data) else {}
    if not fields:
        options.extra_json = extra_json
    elif extra_json is None and type(json_data) is dict:
        options.json_data = {**json_data, **merge_fields(json_data, None, fields)}
    else:
        options.extra_json = merge_fields(body, extra_json, fields)
    given = given_headers if _is_mapping(given_headers) else {}
    if headers:
        if given:
            used = taken | {str(k).lower() for k in given}
            ours = {k: v for k, v in headers.items() if k.lower() not in used}
        elif taken:
            ours = {}
            for k, v in headers.items():  # a loop, not a comprehension: no frame of its own
                if k.lower() not in taken:
                    ours[k] = v
        else:
            ours = dict(headers)
        options.headers = ({**ours, **given} if given else ours) if ours else given_headers
    else:
        options.headers = given_headers
    return options


def _error_text(exc: BaseException) -> str:
    return f"{exc} {getattr(exc, 'body', '')}"


def wants_stream_usage(api: Api, stream: bool, options: Any, state: ClientState) -> bool:
    """True when agentkv should ask for this stream's usage itself.

    Chat and text completions streams carry usage only when the request sets
    ``stream_options.include_usage`` (vLLM, like OpenAI, sends it in one extra chunk with
    no choices); many callers (ChatOpenAI and the Agents SDK off OpenAI's host) do not.
    Not for ``with_streaming_response``, whose caller reads the raw bytes (the extra
    chunk could not be taken out again), nor once a server refused the field.
    """
    if not stream or api not in ("chat", "completions") or state.stream_usage_refused:
        return False
    body = options.json_data
    if not _is_mapping(body):
        return False
    given = body.get("stream_options")
    if _is_mapping(given) and given.get("include_usage") is True:
        return False  # the caller asked: the chunk is theirs
    headers = options.headers
    return not (_is_mapping(headers) and headers.get(_RAW_HEADER) == "stream")


def _with_stream_usage(json_data: Mapping[str, Any]) -> dict[str, Any]:
    given: Any = json_data.get("stream_options")
    merged = {**given, "include_usage": True} if _is_mapping(given) else {"include_usage": True}
    return {**json_data, "stream_options": merged}


def _defer_to_sdk_span(ctx: Call, options: Any) -> None:
    """Find the SDK's span of this call from the request's ``post_parser``, which the SDK
    runs while that span is current (wrapping any parser of the SDK's own)."""
    given = getattr(options, "post_parser", None)

    def post_parser(parsed: Any) -> Any:
        if callable(given):
            parsed = given(parsed)
        try:
            ctx.adopt_sdk_span(parsed)
        except Exception as exc:
            internal_error("sdk span", exc)
        return parsed

    options.post_parser = post_parser


class _Attempts:
    """What the flow sends, and what it falls back to when the server refuses fields."""

    def __init__(
        self,
        ctx: Call,
        adapter: BackendAdapter,
        options: Any,
        taken: frozenset[str],
        stream_usage: bool = False,
    ):
        self.ctx = ctx
        self.adapter = adapter
        self.options = options
        self.base = (options.extra_json, options.headers)
        self.base_json = options.json_data
        self.taken = taken
        self.headers: dict[str, str] = {}
        self.identity_only = False
        self.refused_fields = False
        self.stream_usage = stream_usage
        self.fields: dict[str, Any] = {}

    def first(self) -> Any:
        ctx = self.ctx
        try:
            fields, self.headers = ctx.build(self.adapter)
        except TenantIsolationError as exc:
            ctx.finish(error=exc)
            raise
        except Exception as exc:
            internal_error("client hints", exc)
            ctx.added_body = False
            return self.options
        self.fields = fields
        if ctx.defer_span:
            _defer_to_sdk_span(ctx, self.options)
        self.identity_only = ctx.state.body_hints_off or ctx.mode != "active"
        if ctx.rewrites and isinstance(self.options.json_data, Mapping):
            self.options.json_data = {**self.options.json_data, **ctx.rewrites}
            ctx.added_body = True
        if self.stream_usage:
            self.options.json_data = _with_stream_usage(self.options.json_data)
            ctx.added_body = ctx.strip_usage_chunk = True
        if not fields and not self.headers:
            return self.options
        return with_fields(self.options, self.base, fields, self.headers, self.taken)

    def after(self, exc: Exception) -> Any:
        """The next options to try after ``exc``, or None (the error is the caller's)."""
        ctx, state = self.ctx, self.ctx.state
        if getattr(exc, "status_code", None) not in (400, 422) or not ctx.added_body:
            return None
        self.options.json_data = self.base_json  # the caller's request, as written
        ctx.strip_usage_chunk = False
        if self.stream_usage and (self.identity_only or "stream_options" in _error_text(exc)):
            # Perhaps the server does not take stream_options: the caller's request with
            # the same hints, never asking this server for stream usage again.
            self.stream_usage = False
            state.stream_usage_refused = True
            ctx.added_body = bool(self.fields) or bool(ctx.rewrites)
            if ctx.rewrites and isinstance(self.options.json_data, Mapping):
                self.options.json_data = {**self.options.json_data, **ctx.rewrites}
            return with_fields(self.options, self.base, self.fields, self.headers, self.taken)
        if ctx.salted and "cache_salt" in _error_text(exc):
            state.salt_rejected = True
            if ctx.traj.tenant is not None and not state.options.allow_unsalted:
                raise TenantIsolationError(
                    f"agentkv: the server at {state.base_url or '?'} rejected cache_salt, so "
                    f"tenant {ctx.traj.tenant!r}'s calls cannot be isolated; the call was not "
                    "sent without it. Pass wrap_openai(client, "
                    "options=ClientOptions(allow_unsalted=True)) to send them unisolated."
                ) from exc
            warn_once(
                "unsalted:" + state.base_url,
                "agentkv: %s rejected cache_salt; sending without it (allow_unsalted=True)",
                state.base_url or "the server",
            )
            ctx.salted = ctx.added_body = False
            return with_fields(self.options, self.base, {}, self.headers, self.taken)
        if self.identity_only:
            return None  # only the salt (or nothing of ours) was sent: the caller's error
        self.identity_only = self.refused_fields = True
        fields: dict[str, Any] = {}
        self.adapter.apply(ctx.identity_hints(), fields, {})
        ctx.added_body = bool(fields)
        return with_fields(self.options, self.base, fields, self.headers, self.taken)

    def note_success(self) -> None:
        """After a success: if only the reduced request went through, stay on it."""
        state = self.ctx.state
        if self.refused_fields and not state.body_hints_off:
            state.body_hints_off = True
            logger.warning(
                "agentkv: %s rejected the request with agentkv body fields but accepted it "
                "without them; sending only the cache salt and headers from now on "
                "(choose backend= explicitly)",
                state.base_url or "the server",
            )


def call_flow(
    state: ClientState,
    api: Api,
    options: Any,
    stream: bool,
    stream_cls: Any,
    traj: Trajectory,
    taken: frozenset[str] = frozenset(),
) -> Generator[Step, Any, Any]:
    """Every decision of one model call; see the module doc for the steps it yields."""
    adapter = state.adapter or state.ready_adapter()
    if adapter is None:
        adapter = yield PROBE
    if (
        state.adapter is None
        and traj.tenant is not None
        and not state.options.allow_unsalted
        and state.patient_probe_due()
    ):
        # The probe failed transiently, and without an answer a tenant's call fails
        # closed: ask once more, patiently, before refusing it (once per back-off
        # window, so a slow server costs one call the wait, not every call).
        adapter = yield PATIENT_PROBE
    body = options.json_data if _is_mapping(options.json_data) else {}
    ctx = begin(state, api, adapter, body, traj)
    if ctx is None:
        return (yield Send(options, stream_cls))
    if _is_mapping(options.extra_json):
        ctx.extra_body = options.extra_json
    attempts = _Attempts(
        ctx, adapter, options, taken, wants_stream_usage(api, stream, options, state)
    )
    send = attempts.first()
    swapped = stream_class(stream_cls) if stream and stream_cls is not None else stream_cls
    while True:
        try:
            result = yield Send(send, swapped)
            break
        except Exception as exc:
            try:
                send = attempts.after(exc)
            except TenantIsolationError as err:
                ctx.finish(error=err)
                raise
            if send is None:
                ctx.finish(error=exc)
                raise
        except BaseException as exc:
            ctx.finish(error=exc)
            raise
    if attempts.refused_fields:
        attempts.note_success()
    if swapped is stream_cls and BaseModel in type(result).__mro__:
        ctx.finish(result)  # a parsed answer (the usual call): what _complete does
        return result
    return (yield from _complete(ctx, result, swapped is not stream_cls))


def _http_response(result: Any) -> Any:
    """The raw HTTP response behind a raw-response result; None for a parsed answer.

    A parsed answer is a pydantic model: asking it for a missing attribute goes through
    pydantic's ``__getattr__`` and an exception, a cost paid on every call otherwise.
    """
    if BaseModel in type(result).__mro__:  # isinstance, without the ABC's Python frame
        return None
    return getattr(result, "http_response", None)


def _complete(ctx: Call, result: Any, streaming: bool) -> Generator[Step, Any, Any]:
    if streaming:
        if isinstance(result, _StreamBase):
            vars(result)["_agentkv_call"] = ctx
        else:
            http = _http_response(result)
            if http is None:
                ctx.finish(outcome="incomplete")
                return result
            _PENDING[http] = ctx  # its parse() makes one of our stream classes
        return result
    http = _http_response(result)
    if http is None:
        ctx.finish(result)
        return result
    try:
        if http.request.headers.get(_RAW_HEADER) == "stream":
            yield Read(http)
        answer = json.loads(http.content)
    except Exception as exc:
        ctx.finish(error=exc if not isinstance(exc, ValueError) else None)
        if not isinstance(exc, ValueError):
            raise
        return result
    ctx.finish(answer if isinstance(answer, dict) else None)
    return result


# --- stream classes -------------------------------------------------------------------
_PENDING: weakref.WeakKeyDictionary[Any, Call] = weakref.WeakKeyDictionary()
_CLASSES: dict[Any, type] = {}


class _StreamBase:
    """Marker base of agentkv's stream subclasses."""


def _take(stream: Any) -> Call | None:
    attrs = vars(stream)
    ctx: Call | None = attrs.get("_agentkv_call")
    if ctx is None:
        ctx = _PENDING.pop(stream.response, None)
        attrs["_agentkv_call"] = ctx
    return ctx


def _usage_only(item: Any) -> bool:
    """The chunk ``include_usage`` adds: usage and no choices."""
    return not getattr(item, "choices", True) and getattr(item, "usage", None) is not None


def _failed(ctx: Call, exc: BaseException) -> None:
    if isinstance(exc, GeneratorExit):
        ctx.finish(outcome="incomplete")
    else:
        ctx.finish(error=exc, outcome="incomplete")


def _sync_stream_class(base: Any) -> type:
    class AgentKVStream(base, _StreamBase):  # type: ignore[misc, valid-type]
        def __stream__(self) -> Iterator[Any]:
            ctx = _take(self)
            if ctx is None:
                yield from super().__stream__()
                return
            try:
                for item in super().__stream__():
                    ctx.observe_item(item)
                    if not (ctx.strip_usage_chunk and _usage_only(item)):
                        yield item
            except BaseException as exc:
                _failed(ctx, exc)
                raise
            ctx.finish()

        def close(self) -> None:
            try:
                super().close()
            finally:
                ctx = _take(self)
                if ctx is not None:
                    ctx.finish(outcome="incomplete")

    return AgentKVStream


def _async_stream_class(base: Any) -> type:
    class AgentKVAsyncStream(base, _StreamBase):  # type: ignore[misc, valid-type]
        async def __stream__(self) -> AsyncIterator[Any]:
            ctx = _take(self)
            if ctx is None:
                async for item in super().__stream__():
                    yield item
                return
            try:
                async for item in super().__stream__():
                    ctx.observe_item(item)
                    if not (ctx.strip_usage_chunk and _usage_only(item)):
                        yield item
            except BaseException as exc:
                _failed(ctx, exc)
                raise
            ctx.finish()

        async def close(self) -> None:
            try:
                await super().close()
            finally:
                ctx = _take(self)
                if ctx is not None:
                    ctx.finish(outcome="incomplete")

    return AgentKVAsyncStream


def stream_class(stream_cls: Any) -> Any:
    """agentkv's subclass of an SDK stream class (made once per stream type)."""
    cls = _CLASSES.get(stream_cls)
    if cls is None:
        origin = typing.get_origin(stream_cls) or stream_cls
        if not isinstance(origin, type) or not hasattr(origin, "__stream__"):
            warn_once("stream-class", "agentkv: unknown stream class %r; not observed", origin)
            return stream_cls
        asynchronous = inspect.isasyncgenfunction(origin.__stream__)
        cls = (_async_stream_class if asynchronous else _sync_stream_class)(stream_cls)
        _CLASSES[stream_cls] = cls
    return cls
