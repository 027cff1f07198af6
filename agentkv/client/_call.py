"""One model call made inside a trajectory: hints in, accounting out.

:func:`begin` starts the model call on the current trajectory and lets :class:`Call`
build the hinted request (advice, backend fields, lifecycle registration); when the
answer is complete, :meth:`Call.finish` records the :class:`agentkv.TurnRecord`, feeds
the cost model and the lifecycle route, and records a chat span. A failure inside any
of it is contained (invariant 1): the request goes out as the caller wrote it.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from agentkv._guard import internal_error
from agentkv.client import _accounting, _lifecycle
from agentkv.client._state import ClientState
from agentkv.client.backends import BackendAdapter, RequestHints
from agentkv.client.backends._adapters import Api
from agentkv.client.backends._request import header_safe, merge_extras, parse_usage, tokens_of
from agentkv.events._context import ModelCall, Trajectory, begin_model_call, current_trajectory
from agentkv.events._schema import CacheAdvice
from agentkv.policy._advisor import TrajectoryState
from agentkv.policy._costmodel import LoadTracker

__all__ = ["Call", "begin", "note_rejection", "retry_without_hints"]

logger = logging.getLogger("agentkv")


def _family_key(traj: Trajectory) -> str:
    family = traj.metadata.get("cache_family")
    if isinstance(family, str) and family:
        return family
    root = traj
    while root.parent is not None:
        root = root.parent
    return root.parent_id or root.trajectory_id


class Call:
    """One in-trajectory call: builds the hinted kwargs, then accounts for the answer."""

    def __init__(self, state: ClientState, api: Api, traj: Trajectory, call: ModelCall) -> None:
        self.state = state
        self.api = api
        self.traj = traj
        self.call = call
        self.model: str | None = None
        self.streamed = False
        self.added_body = False
        self.backend = "generic"
        self.mode: str = "observe"
        self.advice: CacheAdvice | None = None
        self.advice_sent = False
        self.expected_prefix: int | None = None
        self.started_at_ms = time.time_ns() // 1_000_000
        self.first_token_ns: int | None = None
        self.usage: tuple[int | None, int | None, int | None] = (None, None, None)
        self.finished = False

    def build(self, adapter: BackendAdapter, kwargs: dict[str, Any]) -> dict[str, Any]:
        state, traj, turn = self.state, self.traj, self.call.turn_id
        model = kwargs.get("model")
        self.model = model if isinstance(model, str) else None
        self.streamed = kwargs.get("stream") is True
        self.backend = adapter.name
        opts = state.options
        if opts.tokenizer is not None:
            ids = tokens_of(opts.tokenizer, self.api, kwargs)
            if ids is not None:
                from agentkv.prefix._blockhash import matched_prefix_tokens

                prev = traj.extras.get("agentkv.prev_token_ids")
                block = opts.block_size or int(
                    getattr(adapter, "capabilities", {}).get("block_size") or 16
                )
                self.expected_prefix = matched_prefix_tokens(prev, ids, block) if prev else 0
                traj.extras["agentkv.prev_token_ids"] = ids
        advisor = state.advisor()
        self.mode = advisor.mode_for(traj.trajectory_id)
        last: _accounting.TurnRecord | None = traj.extras.get("agentkv.last_turn")
        prefix_tokens = (last.prompt_tokens or 0) + (last.completion_tokens or 0) if last else 0
        if self.mode != "observe":
            st = TrajectoryState(
                trajectory_id=traj.trajectory_id,
                turn_id=turn,
                tool_class=traj.last_tool_class,
                prefix_tokens=prefix_tokens,
                resumed=turn > 0,
                attained_service_s=traj.attained_service_s,
            )
            self.advice = advisor.advise(st, load=state.load())
            advisor.shadow_log.record(self.advice, mode=self.mode)
            self.advice_sent = self.mode == "active"
        tid = header_safe(traj.trajectory_id)
        hints = RequestHints(
            trajectory_id=traj.trajectory_id,
            turn_id=turn,
            request_id=f"agentkv-{tid}-{turn}-{uuid.uuid4().hex[:8]}",
            api=self.api,
            parent_id=traj.parent_id,
            tenant=traj.tenant,
            cache_salt=state.cache_salt(traj.tenant),
            family_key=_family_key(traj),
            advice=self.advice if self.advice_sent else None,
        )
        body: dict[str, Any] = {}
        headers: dict[str, str] = {}
        adapter.apply(hints, body, headers)
        headers = {k: header_safe(v) for k, v in headers.items()}
        self.added_body = bool(body)
        if adapter.control_url is not None and opts.lifecycle:
            channel = _lifecycle.get_channel()
            route = channel.route(traj.trajectory_id)
            if route is None:
                tracker = state.tracker or LoadTracker()
                route = _lifecycle.TrajectoryRoute(
                    adapter.control_url, state.auth_headers(), advisor, tracker
                )
                channel.register(traj.trajectory_id, route)
            route.prefix_tokens = prefix_tokens
            route.attained_service_s = traj.attained_service_s
            route.last_advice = self.advice if self.advice_sent else None
        return merge_extras(kwargs, body, headers)

    # --- the answer --------------------------------------------------------------
    def observe_item(self, item: Any) -> None:
        if self.first_token_ns is None:
            self.first_token_ns = time.monotonic_ns()
        if getattr(item, "usage", None) is not None:
            self.usage = parse_usage(item)
        elif getattr(item, "type", None) == "response.completed":
            self.usage = parse_usage(getattr(item, "response", None))

    def finish(
        self, result: Any = None, *, outcome: str = "ok", error: BaseException | None = None
    ) -> None:
        if self.finished:
            return
        self.finished = True
        end_ns = time.monotonic_ns()
        try:
            self.call.end("ok" if error is None else "error")
            if result is not None and not self.streamed:
                self.usage = parse_usage(result)
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
        rec = _accounting.TurnRecord(
            trajectory_id=traj.trajectory_id,
            turn_id=self.call.turn_id,
            api=self.api,
            model=self.model,
            backend=self.backend,
            mode=self.mode,
            started_at_ms=self.started_at_ms,
            latency_ms=(end_ns - self.call.started_ns) / 1e6,
            outcome=outcome,
            streamed=self.streamed,
            ttft_ms=ttft_ms,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            expected_prefix_tokens=self.expected_prefix,
            eligible_prefix_tokens=eligible,
            advice=self.advice,
            advice_sent=self.advice_sent,
            error_type=type(error).__qualname__ if error is not None else None,
        )
        if outcome == "ok":
            traj.extras["agentkv.last_turn"] = rec
        _accounting.record_turn(rec)
        cm = state.cost_model
        if cm is not None and ttft_ms is not None and prompt is not None:
            cm.observe_prefill(prompt - (cached or 0), ttft_ms / 1000.0)
        channel = _lifecycle.get_channel()
        route = channel.route(traj.trajectory_id) if self.backend == "vllm" else None
        if route is not None and prompt is not None:
            route.prefix_tokens = prompt + (completion or 0)
            route.attained_service_s = traj.attained_service_s
        _accounting.record_chat_span(
            rec,
            provider_name=state.options.provider_name
            or ("openai" if self.backend == "openai" else self.backend),
            start_ns=_accounting.wall_ns_from_monotonic(self.call.started_ns),
            end_ns=_accounting.wall_ns_from_monotonic(end_ns),
        )


def _is_rejection(exc: BaseException) -> bool:
    return getattr(exc, "status_code", None) in (400, 422)


def retry_without_hints(ctx: Call, exc: BaseException) -> bool:
    """After a failed hinted call: True when the server rejected the hint fields and the
    plain request should be sent; otherwise the call is recorded as failed."""
    if isinstance(exc, Exception) and ctx.added_body and _is_rejection(exc):
        return True
    ctx.finish(error=exc)
    return False


def note_rejection(state: ClientState) -> None:
    if not state.body_hints_off:
        state.body_hints_off = True
        logger.warning(
            "agentkv: %s rejected the request with agentkv body fields but accepted it "
            "without them; sending only headers from now on (choose backend= explicitly)",
            state.base_url or "the server",
        )


def begin(
    state: ClientState, api: Api, adapter: BackendAdapter | None, kwargs: dict[str, Any]
) -> tuple[Call | None, dict[str, Any]]:
    traj = current_trajectory()
    if traj is None or adapter is None:
        return None, kwargs
    try:
        call = begin_model_call(
            traj, model=kwargs.get("model") if isinstance(kwargs.get("model"), str) else None
        )
    except Exception as exc:
        internal_error("wrap_openai begin", exc)
        return None, kwargs
    ctx = Call(state, api, traj, call)
    try:
        return ctx, ctx.build(adapter, kwargs)
    except Exception as exc:
        internal_error("wrap_openai hints", exc)
        ctx.added_body = False
        return ctx, kwargs
