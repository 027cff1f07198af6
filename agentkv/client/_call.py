"""One model call made inside a trajectory: hints in, accounting out (sans-I/O).

:func:`begin` starts the model call on the current trajectory; :meth:`Call.build`
decides what goes on the request (advice, the backend's fields and headers, the
lifecycle registration) and :meth:`Call.finish` records the :class:`agentkv.TurnRecord`
and the chat span, feeds the cost model and the lifecycle route. Nothing here does I/O;
the drivers in :mod:`agentkv.client._flow` and :mod:`agentkv.client._wrap` do.

Rollout modes (``ClientOptions.mode`` / the advisor's): ``active`` sends everything;
``observe`` and ``shadow`` send only cache identity (the tenant's salt) — no trajectory
id, priority, retain or release field, no lifecycle post — and record events locally;
``shadow`` also logs, on logger ``agentkv.shadow``, the fields it would have sent.

A failure inside any of it is contained (invariant 1): the request goes out as the
caller wrote it. The one deliberate exception is cache identity: a call of a trajectory
with a tenant whose salt cannot be sent raises :class:`agentkv.TenantIsolationError`
unless ``ClientOptions.allow_unsalted`` is set.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agentkv._errors import TenantIsolationError
from agentkv._guard import internal_error, warn_once
from agentkv.advice._advisor import TrajectoryState, after_call_estimate
from agentkv.client import _accounting, _lifecycle
from agentkv.client._load import LoadTracker
from agentkv.client._sdk_span import current_sdk_span
from agentkv.client._state import ClientState
from agentkv.client.backends import BackendAdapter, RequestHints
from agentkv.client.backends._adapters import Api, make_hints
from agentkv.client.backends._request import (
    header_safe,
    parse_cache_write,
    parse_usage,
    response_meta,
    tokens_of,
)
from agentkv.events._context import ModelCall, Trajectory, begin_model_call
from agentkv.events._otel import get_tracer, note_provider
from agentkv.events._schema import CacheAdvice

__all__ = ["Call", "begin"]

logger = logging.getLogger("agentkv")
shadow_logger = logging.getLogger("agentkv.shadow")

#: Request ids: a random process prefix and a counter (unique, and cheaper than uuid4).
_ID_PREFIX = os.urandom(4).hex()
_ids = itertools.count()


def _root_id(traj: Trajectory) -> str:
    root = traj
    while root.parent is not None:
        root = root.parent
    return root.parent_id or root.trajectory_id


#: ``traj.extras`` key of a trajectory's (root id, request id prefix), made once.
_IDS_KEY = "agentkv.hint_ids"
#: (answered turns, their summed completion tokens) of a trajectory: its expected output.
_OUTPUT_KEY = "agentkv.output_tokens"
#: The request fields that bound a call's output, per API.
_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def _expected_output(traj: Trajectory, body: Mapping[str, Any]) -> int | None:
    """The trajectory's mean answer length so far, capped by this request's own output
    limit; None before its first answer that reported usage."""
    seen = traj.extras.get(_OUTPUT_KEY)
    if not seen or seen[0] <= 0:
        return None
    expected = max(1, round(float(seen[1]) / float(seen[0])))
    for name in _OUTPUT_LIMITS:
        limit = body.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return min(expected, int(limit))
    return expected


def _salt_problem(state: ClientState, adapter: BackendAdapter) -> str | None:
    """Why the tenant's salt cannot be sent to this server, or None when it can."""
    if state.salt_rejected:
        return "the server rejected cache_salt"
    if adapter.carries_salt:
        return None
    if state.adapter is None:
        return f"the server's capabilities are unknown ({state.probe_why or 'not probed'})"
    return f"the {adapter.name!r} backend has no cache salt"


class Call:
    """One in-trajectory call: builds the hinted fields, then accounts for the answer."""

    # Defaults every call starts from, read from the class until a call sets its own (the
    # values are immutable or only ever replaced, never changed in place).
    added_body = False
    salt: str | None = None
    salted = False
    backend = "generic"
    mode: str = "observe"
    advice: CacheAdvice | None = None
    advice_sent = False
    expected_prefix: int | None = None
    first_token_ns: int | None = None
    usage: tuple[int | None, int | None, int | None] = (None, None, None)
    meta: tuple[str | None, str | None, tuple[str, ...]] = (None, None, ())
    span: Any = None
    rewrites: Mapping[str, Any] = MappingProxyType({})  # request fields the adapter replaces
    extra_body: Mapping[str, Any] = MappingProxyType({})  # the caller's extra_body
    provider_name = "generic"  # gen_ai.provider.name of this call's span and metrics
    strip_usage_chunk = False  # agentkv asked for stream usage: hide its chunk from the caller
    defer_span = False  # the SDK makes this call's chat span: agentkv annotates it
    cache_write: int | None = None  # tokens written to the prompt cache (Anthropic)
    gap: tuple[float | None, float | None] = (None, None)
    finished = False

    def __init__(
        self,
        state: ClientState,
        api: Api,
        traj: Trajectory,
        call: ModelCall,
        body: Mapping[str, Any],
    ) -> None:
        self.state = state
        self.api = api
        self.traj = traj
        self.call = call
        model = body.get("model")
        self.model: str | None = model if isinstance(model, str) else None
        self.streamed = body.get("stream") is True
        self.body = body
        self.started_at_ms = time.time_ns() // 1_000_000

    # --- the request ---------------------------------------------------------------
    def _expected_prefix(self, adapter: BackendAdapter) -> None:
        opts, traj = self.state.options, self.traj
        ids = tokens_of(opts.tokenizer, self.api, self.body)
        if ids is None:
            return
        from agentkv.prefix._blockhash import matched_prefix_tokens

        prev = traj.extras.get("agentkv.prev_token_ids")
        block = opts.block_size or int(getattr(adapter, "capabilities", {}).get("block_size") or 16)
        self.expected_prefix = matched_prefix_tokens(prev, ids, block) if prev else 0
        traj.extras["agentkv.prev_token_ids"] = ids

    def _advise(self, prefix_tokens: int) -> None:
        state, traj = self.state, self.traj
        advisor = state.advisor()
        self.mode = mode = advisor.mode_for(traj.trajectory_id)
        if mode != "observe":
            st = TrajectoryState(
                trajectory_id=traj.trajectory_id,
                turn_id=self.call.turn_id,
                tool_class=traj.last_tool_class,
                prefix_tokens=prefix_tokens,
                resumed=self.call.turn_id > 0,
                attained_service_s=traj.attained_service_s,
                at_call=True,
            )
            self.advice = advisor.advise(st, load=state.load())
            self.advice_sent = mode == "active"
        # How the previous advice turned out (the idle gap), then this call's advice.
        advisor.shadow_log.turn(traj.trajectory_id, self.call.idle_gap_ms, self.advice, mode)

    def _hints(self, salt: str | None, scheduling: bool) -> RequestHints:
        traj, turn = self.traj, self.call.turn_id
        ids = traj.extras.get(_IDS_KEY)
        if ids is None:  # once per trajectory: its ids do not change
            ids = traj.extras[_IDS_KEY] = (
                _root_id(traj),
                f"agentkv-{header_safe(traj.trajectory_id)}-",
            )
        root_id = ids[0]
        family = traj.metadata.get("cache_family")  # read per call: metadata may change
        return make_hints(
            {
                "trajectory_id": traj.trajectory_id,
                "turn_id": turn,
                "request_id": f"{ids[1]}{turn}-{_ID_PREFIX}{next(_ids):x}",
                "api": self.api,
                "parent_id": traj.parent_id,
                "critical_path": traj.critical_path,
                "tenant": traj.tenant,
                "cache_salt": salt,
                "family_key": family if isinstance(family, str) and family else root_id,
                "advice": self.advice if scheduling else None,
                "scheduling": scheduling,
                "session_type": traj.metadata.get("session_type")
                or traj.metadata.get("agent_name"),
                "final": bool(traj.extras.get("agentkv.final_turn")),
                "model": self.model,
                "gap_p50_s": self.gap[0],
                "gap_p90_s": self.gap[1],
                "expected_output_tokens": _expected_output(traj, self.body),
                "root_id": root_id,
                # router session keys are scoped by the tenant's salt, sent or not
                "session_scope": self.state.cache_salt(traj.tenant),
            }
        )

    def build(self, adapter: BackendAdapter) -> tuple[dict[str, Any], dict[str, str]]:
        """The body fields and headers for this call (merged under the caller's later).

        Raises:
            TenantIsolationError: the trajectory has a tenant whose salt cannot be sent.
        """
        state, traj, opts = self.state, self.traj, self.state.options
        self.backend = adapter.name
        salt = state.cache_salt(traj.tenant)
        problem = _salt_problem(state, adapter) if salt is not None else None
        if problem is not None:
            if not opts.allow_unsalted:
                raise TenantIsolationError(
                    f"agentkv: trajectory {traj.trajectory_id!r} has tenant {traj.tenant!r}, "
                    f"but its cache salt cannot be sent: {problem}. The call was not sent, "
                    "so the tenant's prompt cannot be cached where other tenants can hit it. "
                    "Serve it with vLLM (agentkv serve), or pass "
                    "wrap_openai(client, options=ClientOptions(allow_unsalted=True)) to send "
                    "tenants' calls without cache isolation."
                )
            warn_once(
                "unsalted:" + state.base_url,
                "agentkv: sending tenant calls without a cache salt (%s; allow_unsalted=True)",
                problem,
            )
            salt = None
        self.salt = salt
        if opts.tokenizer is not None:
            self._expected_prefix(adapter)
        last: _accounting.TurnRecord | None = traj.extras.get("agentkv.last_turn")
        prefix_tokens = (last.prompt_tokens or 0) + (last.completion_tokens or 0) if last else 0
        self._advise(prefix_tokens)
        active = self.mode == "active"
        body: dict[str, Any] = {}
        headers: dict[str, str] = {}
        rewrite = getattr(adapter, "rewrite", None)
        if active and rewrite is not None and not state.body_hints_off:
            # a server that refused agentkv's body fields gets the caller's request as written
            self.gap = self._gap_quantiles()
            request = {**self.body, **self.extra_body} if self.extra_body else self.body
            self.rewrites = rewrite(self._hints(salt, True), request)
        if active and not state.body_hints_off:
            hints = self._hints(salt, True)
            adapter.apply(hints, body, headers)
            state.route_keys.apply(hints, body, headers)  # router affinity (scale-out.md)
            yield_to = getattr(adapter, "yield_to_caller", None)
            if yield_to is not None:  # settings the caller made themselves stand alone
                yield_to({**self.body, **self.extra_body}, body)
        else:
            adapter.apply(self._hints(salt, False), body, {})  # cache identity only
            if active:  # the server refused our body fields: headers still go
                hints = self._hints(None, True)
                adapter.apply(hints, {}, headers)
                state.route_keys.apply(hints, {}, headers)
            elif self.mode == "shadow":
                self._log_shadow(adapter, salt)
        self.salted = salt is not None and bool(body)
        self.added_body = bool(body)
        if active and adapter.control_url is not None and opts.lifecycle:
            self._register(adapter.control_url, prefix_tokens)
        for name, value in headers.items():
            if not (value.isascii() and value.isprintable()):
                headers[name] = header_safe(value)
        return body, headers

    def _gap_quantiles(self) -> tuple[float | None, float | None]:
        """The learned gap before this trajectory's next call: (median, p90) seconds."""
        model = self.state.advisor().gap_model
        if model is None:
            return None, None
        est = after_call_estimate(model, self.traj.last_tool_class or "*")
        p50, p90 = getattr(est, "p50", None), getattr(est, "p90", None)
        return (
            float(p50) if isinstance(p50, (int, float)) else None,
            float(p90) if isinstance(p90, (int, float)) else None,
        )

    def identity_hints(self) -> RequestHints:
        """Hints carrying only cache identity (the salt), for a server refusing the rest."""
        return self._hints(self.salt, False)

    def _log_shadow(self, adapter: BackendAdapter, salt: str | None) -> None:
        if not shadow_logger.isEnabledFor(logging.INFO):
            return
        body: dict[str, Any] = {}
        headers: dict[str, str] = {}
        adapter.apply(self._hints(salt, True), body, headers)
        body.pop("cache_salt", None)
        shadow_logger.info(
            "agentkv shadow: trajectory %s turn %d would send body %s headers %s",
            self.traj.trajectory_id,
            self.call.turn_id,
            sorted(body),
            sorted(headers),
            extra={"agentkv_body": body, "agentkv_headers": headers},
        )

    def _register(self, control_url: str, prefix_tokens: int) -> None:
        state, traj = self.state, self.traj
        channel = _lifecycle.get_channel()
        route = channel.route(traj.trajectory_id, traj.tenant)
        if route is None:
            route = _lifecycle.TrajectoryRoute(
                control_url,
                state.auth_headers(),
                state.advisor(),
                state.tracker or LoadTracker(),
                keys=state.route_keys,
            )
            channel.register(traj.trajectory_id, route, traj.tenant)
        route.prefix_tokens = prefix_tokens
        route.attained_service_s = traj.attained_service_s
        route.last_advice = self.advice if self.advice_sent else None
        route.cache_salt = self.salt
        route.session_scope = state.cache_salt(traj.tenant)

    # --- the answer --------------------------------------------------------------
    def observe_item(self, item: Any) -> None:
        if self.first_token_ns is None:
            self.first_token_ns = time.monotonic_ns()
        kind = getattr(item, "type", None)
        if kind == "message_start":  # Anthropic: input and cached tokens come first
            message = getattr(item, "message", None)
            self.usage, self.meta = parse_usage(message), response_meta(message)
            self.cache_write = parse_cache_write(message)
        elif kind == "message_stop" and self.defer_span and self.span is not None:
            self.finish()  # now, while the SDK's span is open (it ends with the body)
        elif kind == "message_delta":  # ... and output tokens and the stop reason last
            out = parse_usage(item)[1]
            reason = getattr(getattr(item, "delta", None), "stop_reason", None)
            self.usage = (self.usage[0], out if out is not None else self.usage[1], self.usage[2])
            if isinstance(reason, str):
                self.meta = (self.meta[0], self.meta[1], (reason,))
        elif getattr(item, "usage", None) is not None:
            self.usage = parse_usage(item)
            self.meta = response_meta(item)
        else:
            if kind in ("response.completed", "response.incomplete"):
                response = getattr(item, "response", None)
                self.usage = parse_usage(response)
                self.meta = response_meta(response)
            elif self.meta[0] is None and getattr(item, "id", None) is not None:
                self.meta = response_meta(item)
            if getattr(item, "choices", None):
                rid, model, reasons = response_meta(item)
                if reasons:
                    self.meta = (self.meta[0] or rid, self.meta[1] or model, reasons)

    def adopt_sdk_span(self, parsed: Any) -> None:
        """Take the SDK's current call span as this call's chat span (see
        :mod:`agentkv.client._sdk_span`); a parsed answer finishes the call now, while
        the span is open."""
        span = current_sdk_span()
        if span is None or self.finished or self.span is not None:
            return
        self.span = _accounting.ChatSpan(span, owned=False)
        if getattr(parsed, "__stream__", None) is None:  # not a stream: the whole answer
            self.finish(parsed)

    def finish(
        self, result: Any = None, *, outcome: str = "ok", error: BaseException | None = None
    ) -> None:
        """End the call: record the turn (``result``: the parsed answer or its JSON)."""
        if self.finished:
            return
        self.finished = True
        end_ns = time.monotonic_ns()
        try:
            self.call.end("ok" if error is None else "error")
            if result is not None:
                self.usage = parse_usage(result)
                self.meta = response_meta(result)
                self.cache_write = parse_cache_write(result)
            self._account(end_ns, "error" if error is not None else outcome, error)
        except Exception as exc:
            internal_error("wrap_openai accounting", exc)

    def _account(self, end_ns: int, outcome: str, error: BaseException | None) -> None:
        traj, state = self.traj, self.state
        prompt, completion, cached = self.usage
        last: _accounting.TurnRecord | None = traj.extras.get("agentkv.last_turn")
        if self.expected_prefix is not None:
            eligible = self.expected_prefix
        elif last is not None and last.prompt_tokens is not None and prompt is not None:
            eligible = min(prompt, last.prompt_tokens)
        else:
            eligible = 0
        ttft_ms = (
            (self.first_token_ns - self.call.started_ns) / 1e6 if self.first_token_ns else None
        )
        route = _lifecycle.route_of(traj.trajectory_id, traj.tenant) if self.advice_sent else None
        hint = None
        if route is not None and self.added_body:  # the hint went to an agentkv server
            hint = _accounting.expect_hint_outcome(self.salt, traj.trajectory_id, self.call.turn_id)
        rec = _accounting.make_turn_record(
            {
                "trajectory_id": traj.trajectory_id,
                "turn_id": self.call.turn_id,
                "api": self.api,
                "model": self.model,
                "backend": self.backend,
                "mode": self.mode,
                "started_at_ms": self.started_at_ms,
                "latency_ms": (end_ns - self.call.started_ns) / 1e6,
                "outcome": outcome,
                "streamed": self.streamed,
                "ttft_ms": ttft_ms,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "cached_tokens": cached,
                "cache_write_tokens": self.cache_write,
                "expected_prefix_tokens": self.expected_prefix,
                "eligible_prefix_tokens": eligible,
                "advice": self.advice,
                "advice_sent": self.advice_sent,
                "error_type": type(error).__qualname__ if error is not None else None,
                "response_id": self.meta[0],
                "response_model": self.meta[1],
                "finish_reasons": self.meta[2],
                "hint": hint,
            }
        )
        if outcome == "ok":
            traj.extras["agentkv.last_turn"] = rec
            if completion is not None and completion >= 0:
                n, total = traj.extras.get(_OUTPUT_KEY) or (0, 0)
                traj.extras[_OUTPUT_KEY] = (n + 1, total + completion)
        _accounting.record_turn(rec)
        cm = state.cost_model
        if cm is not None and ttft_ms is not None and prompt is not None:
            cm.observe_prefill(prompt - (cached or 0), ttft_ms / 1000.0)
        if route is not None and prompt is not None:
            route.prefix_tokens = prompt + (completion or 0)
            route.attained_service_s = traj.attained_service_s
        if self.span is not None:
            _accounting.end_chat_span(self.span, rec)
        _accounting.record_call_metrics(rec, self.api, self.provider_name, state.base_url)


def begin(
    state: ClientState,
    api: Api,
    adapter: BackendAdapter,
    body: Mapping[str, Any],
    traj: Trajectory,
) -> Call | None:
    """Start a model call on ``traj`` (None on failure: the call goes out untouched)."""
    model = body.get("model")
    try:
        call = begin_model_call(traj, model=model if isinstance(model, str) else None)
    except Exception as exc:
        internal_error("wrap_openai begin", exc)
        return None
    ctx = Call(state, api, traj, call, body)
    ctx.provider_name = state.options.provider_name or adapter.name
    try:
        if get_tracer() is None:  # the application does not use OpenTelemetry: no span
            return ctx
        if state.sdk_traces():  # the SDK's span is the call's chat span: annotate it
            ctx.defer_span = True
            note_provider(traj.trajectory_id, ctx.provider_name)
            return ctx
        ctx.span = _accounting.start_chat_span(
            api=api,
            model=ctx.model,
            provider_name=ctx.provider_name,
            base_url=state.base_url,
            trajectory_id=traj.trajectory_id,
            agent_name=traj.metadata.get("agent_name"),
        )
        note_provider(traj.trajectory_id, ctx.provider_name)
    except Exception as exc:
        internal_error("wrap_openai chat span", exc)
    return ctx
