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

import contextlib
import functools
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentkv._errors import ConfigError
from agentkv._guard import internal_error
from agentkv.client import _accounting, _lifecycle
from agentkv.client.backends import (
    BACKENDS,
    BackendAdapter,
    GenericAdapter,
    RequestHints,
    VLLMAdapter,
    is_hosted_openai,
    make_adapter,
    probe_adapter,
    probe_adapter_async,
)
from agentkv.client.backends._adapters import Api
from agentkv.client.backends._request import (
    header_safe,
    merge_extras,
    parse_usage,
    tokens_of,
    wrap_async_stream,
    wrap_sync_stream,
)
from agentkv.events import _pipeline
from agentkv.events._context import ModelCall, Trajectory, begin_model_call, current_trajectory
from agentkv.events._schema import CacheAdvice
from agentkv.policy._advisor import Advisor, Mode, TrajectoryState
from agentkv.policy._costmodel import CostModel, LoadTracker

__all__ = ["ClientOptions", "wrap_openai"]

logger = logging.getLogger("agentkv")

C = TypeVar("C")

_TARGETS: tuple[tuple[tuple[str, ...], Api], ...] = (
    (("chat", "completions"), "chat"),
    (("completions",), "completions"),
    (("responses",), "responses"),
)
_STATE_ATTR = "_agentkv_state"


@dataclass(frozen=True)
class ClientOptions:
    """The settings of one wrapped client (see :func:`wrap_openai`)."""

    backend: str = "auto"
    advisor: Advisor | None = None
    mode: Mode | None = None
    tokenizer: Any = None
    block_size: int | None = None
    namespace: Any = None  # agentkv.CacheNamespace for the tenant salt
    salt_secret: str | bytes | None = None
    lifecycle: bool = True
    probe_timeout_s: float = 1.0
    kv_bytes_per_token: int | None = None
    provider_name: str | None = None


class _ClientState:
    """Per-client state: options, the chosen adapter, salts, the default advisor."""

    def __init__(self, client: Any, options: ClientOptions) -> None:
        self.options = options
        self.base_url = str(getattr(client, "base_url", "") or "")
        self.api_key: str | None = getattr(client, "api_key", None)
        self.adapter: BackendAdapter | None = None
        self.body_hints_off = False
        self._lock = threading.Lock()
        self._salts: dict[str, str] = {}
        self._advisor: Advisor | None = None
        self._advisor_gap_id: int | None = None
        self._tracker: LoadTracker | None = None
        self._cost_model: CostModel | None = None
        if options.backend != "auto" and options.backend != "vllm":
            self._set_adapter(make_adapter(options.backend))
        elif options.backend == "auto" and is_hosted_openai(self.base_url):
            self._set_adapter(make_adapter("openai"))

    # --- adapter -------------------------------------------------------------------
    def _set_adapter(self, adapter: BackendAdapter) -> None:
        caps = adapter.capabilities if isinstance(adapter, VLLMAdapter) else {}
        platform = str(caps.get("platform") or ("hosted" if adapter.name == "openai" else "cuda"))
        cm = CostModel(platform=platform, bytes_per_token=self.options.kv_bytes_per_token)
        with contextlib.suppress(TypeError, ValueError):
            cm.set_capacity(
                num_blocks=int(caps.get("num_blocks") or 0),
                block_size=int(caps.get("block_size") or 0),
            )
        self._cost_model = cm
        if adapter.control_url is not None:
            features = caps.get("features")
            lower = bool(features.get("offload")) if isinstance(features, dict) else False
            self._tracker = _lifecycle.get_channel().tracker(
                adapter.control_url, self.auth_headers(), has_lower_tier=lower
            )
        self.adapter = adapter

    def auth_headers(self) -> dict[str, str]:
        key = self.api_key
        return {"Authorization": f"Bearer {key}"} if key and key not in ("-", "EMPTY") else {}

    def get_adapter(self) -> BackendAdapter:
        if self.body_hints_off:
            return GenericAdapter()
        if self.adapter is None:
            with self._lock:
                if self.adapter is None:
                    self._set_adapter(
                        probe_adapter(
                            self.base_url,
                            api_key=self.api_key,
                            timeout_s=self.options.probe_timeout_s,
                            configured=self.options.backend,
                        )
                    )
        assert self.adapter is not None
        return self.adapter

    async def get_adapter_async(self) -> BackendAdapter:
        if self.body_hints_off:
            return GenericAdapter()
        if self.adapter is None:
            adapter = await probe_adapter_async(
                self.base_url,
                api_key=self.api_key,
                timeout_s=self.options.probe_timeout_s,
                configured=self.options.backend,
            )
            if self.adapter is None:
                self._set_adapter(adapter)
        assert self.adapter is not None
        return self.adapter

    # --- advisor, salts, load --------------------------------------------------------
    def advisor(self) -> Advisor:
        if self.options.advisor is not None:
            return self.options.advisor
        gap_model = _pipeline.ensure_gap_model()
        if self._advisor is None or self._advisor_gap_id != id(gap_model):
            self._advisor = Advisor(gap_model, self._cost_model, mode=self.options.mode or "active")
            self._advisor_gap_id = id(gap_model)
        return self._advisor

    def load(self) -> Any:
        return self._tracker.get() if self._tracker is not None else None

    def cache_salt(self, tenant: str | None) -> str | None:
        if tenant is None:
            return None
        salt = self._salts.get(tenant)
        if salt is None:
            from agentkv.prefix._namespace import CacheNamespace

            ns = self.options.namespace or CacheNamespace()
            salt = ns.cache_salt(tenant, secret=self.options.salt_secret)
            self._salts[tenant] = salt
        return salt


def _family_key(traj: Trajectory) -> str:
    family = traj.metadata.get("cache_family")
    if isinstance(family, str) and family:
        return family
    root = traj
    while root.parent is not None:
        root = root.parent
    return root.parent_id or root.trajectory_id


class _Call:
    """One in-trajectory call: builds the hinted kwargs, then accounts for the answer."""

    def __init__(self, state: _ClientState, api: Api, traj: Trajectory, call: ModelCall) -> None:
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
                tracker = state._tracker or LoadTracker()
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
        cm = state._cost_model
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


def _retry_without_hints(ctx: _Call, exc: BaseException) -> bool:
    """After a failed hinted call: True when the server rejected the hint fields and the
    plain request should be sent; otherwise the call is recorded as failed."""
    if isinstance(exc, Exception) and ctx.added_body and _is_rejection(exc):
        return True
    ctx.finish(error=exc)
    return False


def _note_rejection(state: _ClientState) -> None:
    if not state.body_hints_off:
        state.body_hints_off = True
        logger.warning(
            "agentkv: %s rejected the request with agentkv body fields but accepted it "
            "without them; sending only headers from now on (choose backend= explicitly)",
            state.base_url or "the server",
        )


def _begin(
    state: _ClientState, api: Api, adapter: BackendAdapter | None, kwargs: dict[str, Any]
) -> tuple[_Call | None, dict[str, Any]]:
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
    ctx = _Call(state, api, traj, call)
    try:
        return ctx, ctx.build(adapter, kwargs)
    except Exception as exc:
        internal_error("wrap_openai hints", exc)
        ctx.added_body = False
        return ctx, kwargs


def _make_sync(orig: Callable[..., Any], state: _ClientState, api: Api) -> Callable[..., Any]:
    @functools.wraps(orig)
    def create(*args: Any, **kwargs: Any) -> Any:
        if current_trajectory() is None:
            return orig(*args, **kwargs)
        try:
            adapter: BackendAdapter | None = state.get_adapter()
        except Exception as exc:
            internal_error("wrap_openai backend", exc)
            adapter = None
        ctx, hinted = _begin(state, api, adapter, kwargs)
        if ctx is None:
            return orig(*args, **kwargs)
        try:
            result = orig(*args, **hinted)
        except BaseException as exc:
            if not _retry_without_hints(ctx, exc):
                raise
            try:
                result = orig(*args, **kwargs)
            except BaseException as exc2:
                ctx.finish(error=exc2)
                raise
            _note_rejection(state)
        if ctx.streamed:
            return wrap_sync_stream(ctx, result)
        ctx.finish(result)
        return result

    create.__agentkv_wrapped__ = True  # type: ignore[attr-defined]
    return create


def _make_async(orig: Callable[..., Any], state: _ClientState, api: Api) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def create(*args: Any, **kwargs: Any) -> Any:
        if current_trajectory() is None:
            return await orig(*args, **kwargs)
        try:
            adapter: BackendAdapter | None = await state.get_adapter_async()
        except Exception as exc:
            internal_error("wrap_openai backend", exc)
            adapter = None
        ctx, hinted = _begin(state, api, adapter, kwargs)
        if ctx is None:
            return await orig(*args, **kwargs)
        try:
            result = await orig(*args, **hinted)
        except BaseException as exc:
            if not _retry_without_hints(ctx, exc):
                raise
            try:
                result = await orig(*args, **kwargs)
            except BaseException as exc2:
                ctx.finish(error=exc2)
                raise
            _note_rejection(state)
        if ctx.streamed:
            return wrap_async_stream(ctx, result)
        ctx.finish(result)
        return result

    create.__agentkv_wrapped__ = True  # type: ignore[attr-defined]
    return create


def wrap_openai(
    client: C,
    *,
    backend: str = "auto",
    advisor: Advisor | None = None,
    mode: Mode | None = None,
    tokenizer: Any = None,
    block_size: int | None = None,
    namespace: Any = None,
    salt_secret: str | bytes | None = None,
    lifecycle: bool = True,
    probe_timeout_s: float = 1.0,
    kv_bytes_per_token: int | None = None,
    provider_name: str | None = None,
) -> C:
    """Make ``client`` (``OpenAI`` or ``AsyncOpenAI``) send agentkv hints inside trajectories.

    The client is changed in place (only this instance and its ``with_options`` /
    ``copy`` copies) and returned, so it keeps its type. Wrapping twice is a no-op.

    Args:
        backend: ``"auto"`` (probe the server once: agentkv-served vLLM, stock vLLM,
            hosted OpenAI, else headers only with one warning), ``"vllm"``,
            ``"openai"``, ``"dynamo"`` or ``"generic"``.
        advisor: the :class:`agentkv.Advisor` to use (default: one over the process's
            learned gap model and a cost model for the server's platform).
        mode: rollout mode of the default advisor: ``"observe"``, ``"shadow"``,
            ``"active"`` (default).
        tokenizer: optional; a Hugging Face tokenizer (``apply_chat_template``) or a
            callable ``(api, kwargs) -> token ids`` used locally to compute each turn's
            expected reusable prefix. Token ids never leave the process.
        block_size: KV block size for that prefix (default: the server's, else 16).
        namespace: a :class:`agentkv.CacheNamespace` for tenant salts.
        salt_secret: secret mixed into tenant salts (see ``CacheNamespace.cache_salt``).
        lifecycle: post tool and trajectory events to the server's control route.
        probe_timeout_s: timeout of the capability probe.
        kv_bytes_per_token: the served model's KV size per token
            (:func:`agentkv.kv_bytes_per_token`), for the cost model.
        provider_name: ``gen_ai.provider.name`` on chat spans (default: the backend).

    Raises:
        ConfigError: an unknown ``backend`` or ``mode``.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if mode is not None and mode not in ("observe", "shadow", "active"):
        raise ConfigError(f"mode must be 'observe', 'shadow' or 'active', got {mode!r}")
    if getattr(client, "__dict__", {}).get(_STATE_ATTR) is not None:
        return client
    options = ClientOptions(
        backend=backend,
        advisor=advisor,
        mode=mode,
        tokenizer=tokenizer,
        block_size=block_size,
        namespace=namespace,
        salt_secret=salt_secret,
        lifecycle=lifecycle,
        probe_timeout_s=probe_timeout_s,
        kv_bytes_per_token=kv_bytes_per_token,
        provider_name=provider_name,
    )
    state = _ClientState(client, options)
    obj: Any = client
    for path, api in _TARGETS:
        try:
            resource = functools.reduce(getattr, path, obj)
        except Exception:
            continue  # an older client without this API
        orig = getattr(resource, "create", None)
        if orig is None or getattr(orig, "__agentkv_wrapped__", False):
            continue
        is_async = inspect.iscoroutinefunction(inspect.unwrap(orig))
        wrapper = (_make_async if is_async else _make_sync)(orig, state, api)
        resource.create = wrapper
        for name in ("with_raw_response", "with_streaming_response"):
            vars(resource).pop(name, None)  # rebuilt lazily around the wrapper
    for name in ("with_raw_response", "with_streaming_response"):
        vars(obj).pop(name, None)
    copy = getattr(obj, "copy", None)
    if callable(copy):

        @functools.wraps(copy)
        def wrapped_copy(*args: Any, **kwargs: Any) -> Any:
            return wrap_openai(copy(*args, **kwargs), **_option_kwargs(options))

        obj.copy = wrapped_copy
        obj.with_options = wrapped_copy
    setattr(obj, _STATE_ATTR, state)
    return client


def _option_kwargs(options: ClientOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in ClientOptions.__dataclass_fields__}
