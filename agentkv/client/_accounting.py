"""Per-turn accounting: what each model call reused, and what the process saved.

Each model call that ``wrap_openai`` sees inside a trajectory leaves a
:class:`TurnRecord`: prompt tokens, cached tokens (``usage.prompt_tokens_details.
cached_tokens``, or ``input_tokens_details`` for the Responses API), the prefix the turn
could have reused, TTFT when streaming, the advice sent and the outcome.
:func:`stats` aggregates them:

- *eligible* prefix of a turn: the tokens it shares with what the trajectory already
  prefilled. With a tokenizer configured it is the block-aligned common prefix of this
  prompt and the previous one (``agentkv.matched_prefix_tokens``); without one it is
  estimated as ``min(prompt_tokens, previous prompt_tokens)``. The first turn of a
  trajectory has none.
- ``prefix_reuse_ratio = reused / eligible`` with ``reused = min(cached, eligible)``;
- ``rebuild_tax = recomputed prefix / total prefill``: the share of the prefill work
  spent recomputing a prefix the trajectory had already paid for.

OpenAI usage reports one ``cached_tokens`` figure, whether the blocks were still on the
GPU or loaded back from an offload tier. The split (GPU-local and lower-tier hits,
recomputed tokens, bytes moved and the bandwidth achieved) comes from the servers
themselves: the lifecycle channel hands each ``/agentkv/v1/stats`` answer it reads for the
load to :mod:`agentkv.client._tier`, and :func:`stats` reports the servers' counters since
this process first saw each server (``None`` with ``tier_split_reason`` where no server
has a lower tier or serves the split). The counters are per server, not per turn, so the
records carry no split. The records hold no prompt text. When ``opentelemetry`` is in use by the
application, a ``chat`` span is recorded per call with
``gen_ai.usage.cache_read.input_tokens`` (and ``gen_ai.usage.cache_write.input_tokens``
where the API reports cache writes). A client SDK that traces its own calls to the same
provider (``anthropic`` 2) makes the one chat span of each call; agentkv then adds its
attributes to that span instead of making a second one (:mod:`agentkv.client._sdk_span`).
"""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict, deque
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from agentkv.client import _tier
from agentkv.events._metrics import record_model_call
from agentkv.events._otel import get_tracer
from agentkv.events._schema import CacheAdvice

__all__ = [
    "ChatSpan",
    "HintOutcome",
    "Stats",
    "TurnRecord",
    "apply_hint_outcomes",
    "end_chat_span",
    "expect_hint_outcome",
    "get_records",
    "make_turn_record",
    "record_hint_lag",
    "record_turn",
    "reset",
    "start_chat_span",
    "stats",
]


@dataclass(slots=True)
class HintOutcome:
    """What an agentkv server made of one turn's hint, in two phases (docs/protocol.md,
    "Hint outcomes"). Filled in as the server's answers arrive on the lifecycle channel;
    None where not heard yet.

    ``verdict``, at the request: ``accepted``, ``rejected`` (it broke the protocol; the
    request was served as if it carried none) or ``unsupported`` (this server does not
    do what it asked, or its policy is in shadow or off mode). ``result``, later, for an
    accepted hint: ``applied`` (the leased context served the next turn, or a release was
    done), ``failed`` (no lease was granted, or it gave way to memory pressure) or
    ``expired`` (the lease ended unused); it stays None while the lease is held and
    where the turn left nothing to settle. The reasons are the server's words.
    """

    verdict: str | None = None
    verdict_reason: str | None = None
    result: str | None = None
    result_reason: str | None = None


@dataclass(frozen=True)
class TurnRecord:
    """One model call of a trajectory, as the client saw it (no content).

    ``cached_tokens`` is None when the server did not report it (vLLM needs
    ``--enable-prompt-tokens-details``; the wrapper asks for stream usage itself where
    the caller did not).
    ``outcome`` is ``ok``, ``error`` or ``incomplete`` (a stream closed early).
    ``hint`` is what the server made of the turn's hint (:class:`HintOutcome`, updated in
    place as the server's answers arrive; None where no hint went to an agentkv server).

    There is no GPU-local / lower-tier split per turn: usage reports one cached figure,
    and the server counts the split per server over every request it admitted (read at
    most once a second), which cannot be attributed to one call exactly. The split is in
    :func:`stats` (``reused_gpu_tokens``, ``reused_offloaded_tokens``).
    """

    trajectory_id: str
    turn_id: int
    api: str
    model: str | None
    backend: str
    mode: str
    started_at_ms: int
    latency_ms: float
    outcome: str
    streamed: bool = False
    ttft_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None  # written to a prompt cache (Anthropic)
    expected_prefix_tokens: int | None = None  # from a tokenizer, when configured
    eligible_prefix_tokens: int = 0  # the prefix this turn could have reused
    advice: CacheAdvice | None = None  # the advice computed for this call
    advice_sent: bool = False  # False in observe / shadow mode
    error_type: str | None = None
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: tuple[str, ...] = ()
    hint: HintOutcome | None = field(default=None, compare=False)  # filled in later

    @property
    def reused_prefix_tokens(self) -> int:
        """Eligible prefix tokens the server actually served from cache."""
        return min(self.cached_tokens or 0, self.eligible_prefix_tokens)

    @property
    def recomputed_prefix_tokens(self) -> int:
        """Eligible prefix tokens the server prefilled again (the rebuild)."""
        if self.cached_tokens is None:
            return 0
        return max(self.eligible_prefix_tokens - self.cached_tokens, 0)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the advice in its wire form)."""
        out = {k: v for k, v in asdict(self).items() if k != "advice"}
        out["advice"] = self.advice.to_wire() if self.advice is not None else None
        return out


def make_turn_record(fields: dict[str, Any]) -> TurnRecord:
    """``TurnRecord(**fields)``."""
    return TurnRecord(**fields)


@dataclass(frozen=True, slots=True)
class Stats:
    """Process-wide accounting since start (or the last :func:`reset`).

    The client's own figures come from the turn records. The tier fields
    (``reused_gpu_tokens``, ``reused_offloaded_tokens``, ``tier_recomputed_tokens``,
    ``offload_*``) are the servers' counters instead: differences since this process
    first read each server's stats, summed over servers, and covering every request those
    servers admitted (other clients' too). They are None, with ``tier_split_reason``
    saying why, where no server has a lower tier or serves the split; the reason also
    names servers left out of a sum.
    """

    num_turns: int
    num_turns_with_usage: int
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int  # prompt tokens the server computed (prompt - cached)
    eligible_prefix_tokens: int
    reused_prefix_tokens: int
    recomputed_prefix_tokens: int
    prefix_reuse_ratio: float | None  # reused / eligible
    rebuild_tax: float | None  # recomputed prefix / total prefill
    reused_gpu_tokens: int | None  # the servers' GPU prefix-cache hits (tokens)
    reused_offloaded_tokens: int | None  # the servers' hits in a lower tier (tokens)
    ttft_ms_p50: float | None
    advice_sent: dict[str, int] = field(default_factory=dict)  # action -> count
    outcomes: dict[str, int] = field(default_factory=dict)
    hint_lag_ms_p50: float | None = None  # lifecycle event -> server acknowledgement
    hint_lag_ms_p95: float | None = None
    lifecycle: dict[str, int] = field(default_factory=dict)  # posted / dropped / failed
    #: per-hint outcomes heard from servers: verdicts (accepted / rejected / unsupported)
    #: and results (applied / failed / expired), each a count of turns
    hint_outcomes: dict[str, int] = field(default_factory=dict)
    tier_recomputed_tokens: int | None = None  # prompt tokens the servers computed
    offload_load_bytes: int | None = None  # lower tier -> GPU
    offload_store_bytes: int | None = None  # GPU -> lower tier
    offload_load_bytes_per_s: float | None = None  # achieved: bytes / transfer time
    offload_store_bytes_per_s: float | None = None
    tier_split_reason: str | None = None  # why the tier fields are None (or partial)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


class _Ledger:
    """The process's turn records and their totals.

    A record is appended under the lock; its figures are folded into the totals in
    batches (:meth:`fold`, at every read and every ``FOLD_EVERY`` records), so a model
    call pays for one append. Readers fold first: what they see is always current.
    """

    FOLD_EVERY = 64

    def __init__(self, max_records: int = 10_000) -> None:
        self.lock = threading.Lock()
        self.records: deque[TurnRecord] = deque(maxlen=max_records)
        self.unfolded: list[TurnRecord] = []  # appended, not yet in the totals
        self.totals: Counter[str] = Counter()
        self.advice: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.ttft_ms: deque[float] = deque(maxlen=4096)
        self.hint_lag_ms: deque[float] = deque(maxlen=4096)
        self.lifecycle: Counter[str] = Counter()
        # turns whose hint outcome is not settled yet, by (salt, trajectory id, turn)
        self.hints: OrderedDict[tuple[str | None, str, int], HintOutcome] = OrderedDict()
        self.max_hints = max_records
        self.hint_counts: Counter[str] = Counter()

    def add(self, rec: TurnRecord) -> None:
        with self.lock:
            self.records.append(rec)
            unfolded = self.unfolded
            unfolded.append(rec)
            if len(unfolded) >= self.FOLD_EVERY:
                self.fold()

    def fold(self) -> None:
        """Add the unfolded records' figures to the totals (the caller holds the lock)."""
        batch, self.unfolded = self.unfolded, []
        t = self.totals
        for rec in batch:
            t["turns"] += 1
            self.outcomes[rec.outcome] += 1
            if rec.advice_sent and rec.advice is not None:
                self.advice[rec.advice.action] += 1
            if rec.ttft_ms is not None:
                self.ttft_ms.append(rec.ttft_ms)
            if rec.prompt_tokens is None or rec.cached_tokens is None:
                continue
            t["with_usage"] += 1
            t["prompt"] += rec.prompt_tokens
            t["cached"] += rec.cached_tokens
            t["prefill"] += max(rec.prompt_tokens - rec.cached_tokens, 0)
            eligible, cached = rec.eligible_prefix_tokens, rec.cached_tokens
            t["eligible"] += eligible
            t["reused"] += min(cached, eligible)  # rec.reused_prefix_tokens
            t["recomputed"] += max(eligible - cached, 0)  # rec.recomputed_prefix_tokens


_ledger = _Ledger()


def record_turn(rec: TurnRecord) -> None:
    """Add one turn record to the process ledger (used by the client wrapper)."""
    _ledger.add(rec)


def record_hint_lag(lag_ms: float) -> None:
    """Record one lifecycle hint's lag (event time -> server acknowledgement)."""
    if math.isfinite(lag_ms):
        with _ledger.lock:
            _ledger.hint_lag_ms.append(max(lag_ms, 0.0))


def count_lifecycle(what: str, n: int = 1) -> None:
    """Count lifecycle channel outcomes (``posted``, ``dropped``, ``failed``, ...)."""
    with _ledger.lock:
        _ledger.lifecycle[what] += n


def expect_hint_outcome(salt: str | None, trajectory_id: str, turn_id: int) -> HintOutcome:
    """A holder for the outcome of the hint a call sent in scope ``salt`` (filled in by
    :func:`apply_hint_outcomes`; at most ``max_records`` are awaited, oldest dropped)."""
    holder = HintOutcome()
    key = (salt, trajectory_id, turn_id)
    with _ledger.lock:
        hints = _ledger.hints
        hints[key] = holder
        hints.move_to_end(key)
        while len(hints) > _ledger.max_hints:
            hints.popitem(last=False)
    return holder


def apply_hint_outcomes(salt: str | None, trajectory_id: str, turns: Any) -> int:
    """Fold a server's per-hint outcomes of ``trajectory_id`` (scope ``salt``; the wire
    form of ``hintOutcomes[].turns``) into the awaiting turns' records and the counts;
    returns how many records changed. Input that is not the protocol is ignored."""
    if not isinstance(turns, list):
        return 0
    changed = 0
    with _ledger.lock:
        hints, counts = _ledger.hints, _ledger.hint_counts
        for item in turns:
            if not isinstance(item, dict) or not isinstance(item.get("turnId"), int):
                continue
            key = (salt, trajectory_id, item["turnId"])
            holder = hints.get(key)
            if holder is None:
                continue
            verdict, result = item.get("verdict"), item.get("result")
            if holder.verdict is None and verdict in _VERDICTS:
                holder.verdict, holder.verdict_reason = verdict, _text(item.get("verdictReason"))
                counts[verdict] += 1
                changed += 1
            if holder.result is None and result in _RESULTS and holder.verdict == "accepted":
                holder.result, holder.result_reason = result, _text(item.get("resultReason"))
                counts[result] += 1
                changed += 1
            if holder.result is not None or holder.verdict in ("rejected", "unsupported"):
                del hints[key]  # settled: nothing more to hear
    return changed


_VERDICTS = frozenset({"accepted", "rejected", "unsupported"})
_RESULTS = frozenset({"applied", "failed", "expired"})


def _text(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None


def get_records(trajectory_id: str | None = None) -> list[TurnRecord]:
    """The retained turn records (the latest 10,000), optionally of one trajectory."""
    with _ledger.lock:
        recs = list(_ledger.records)
    if trajectory_id is None:
        return recs
    return [r for r in recs if r.trajectory_id == trajectory_id]


def stats() -> Stats:
    """Aggregate reuse figures of every model call seen so far in this process."""
    with _ledger.lock:
        _ledger.fold()
        t = dict(_ledger.totals)
        ttft = list(_ledger.ttft_ms)
        lag = list(_ledger.hint_lag_ms)
        advice = dict(_ledger.advice)
        outcomes = dict(_ledger.outcomes)
        lifecycle = dict(_ledger.lifecycle)
        hint_outcomes = dict(_ledger.hint_counts)
    tier = _tier.get_ledger().split()
    eligible = t.get("eligible", 0)
    prefill = t.get("prefill", 0)
    return Stats(
        num_turns=t.get("turns", 0),
        num_turns_with_usage=t.get("with_usage", 0),
        prompt_tokens=t.get("prompt", 0),
        cached_tokens=t.get("cached", 0),
        prefill_tokens=prefill,
        eligible_prefix_tokens=eligible,
        reused_prefix_tokens=t.get("reused", 0),
        recomputed_prefix_tokens=t.get("recomputed", 0),
        prefix_reuse_ratio=t.get("reused", 0) / eligible if eligible else None,
        rebuild_tax=t.get("recomputed", 0) / prefill if prefill else None,
        reused_gpu_tokens=tier.local_hit_tokens,
        reused_offloaded_tokens=tier.tier_hit_tokens,
        ttft_ms_p50=_quantile(ttft, 0.5),
        advice_sent=advice,
        outcomes=outcomes,
        hint_lag_ms_p50=_quantile(lag, 0.5),
        hint_lag_ms_p95=_quantile(lag, 0.95),
        lifecycle=lifecycle,
        hint_outcomes=hint_outcomes,
        tier_recomputed_tokens=tier.recomputed_tokens,
        offload_load_bytes=tier.load_bytes,
        offload_store_bytes=tier.store_bytes,
        offload_load_bytes_per_s=tier.load_bytes_per_s,
        offload_store_bytes_per_s=tier.store_bytes_per_s,
        tier_split_reason=tier.reason,
    )


def reset() -> None:
    """Forget every record and counter (tests, or between benchmark arms); the tier
    split starts again from each server's next stats answer."""
    global _ledger
    _ledger = _Ledger()
    _tier.reset()


# --- OpenTelemetry chat spans -----------------------------------------------------------
_CHAT_OPS = {"chat", "text_completion", "generate_content", "chat.completions"}


def _foreign_chat_span(trace: Any) -> Any:
    """The current span when another instrumentor already made one for this call."""
    span = trace.get_current_span()
    if not span.is_recording():
        return None
    attrs = getattr(span, "attributes", None) or {}
    if attrs.get("gen_ai.operation.name") in _CHAT_OPS or "gen_ai.system" in attrs:
        return span
    if getattr(span, "kind", None) == trace.SpanKind.CLIENT and "llm.request.type" in attrs:
        return span
    return None


class ChatSpan:
    """agentkv's ``chat`` span of one call, or another instrumentor's that it annotates."""

    __slots__ = ("owned", "span")

    def __init__(self, span: Any, owned: bool) -> None:
        self.span = span
        self.owned = owned


def start_chat_span(
    *,
    api: str,
    model: str | None,
    provider_name: str,
    base_url: str,
    trajectory_id: str,
    agent_name: Any = None,
) -> ChatSpan | None:
    """Start the call's ``chat`` span (a child of the current span: the trajectory's
    ``invoke_agent``), or take the chat span another instrumentor already made current.

    None while the application does not use OpenTelemetry (see
    :func:`agentkv.events._otel.get_tracer`).
    """
    tracer = get_tracer()
    if tracer is None:
        return None
    from opentelemetry import trace

    foreign = _foreign_chat_span(trace)
    if foreign is not None:
        return ChatSpan(foreign, owned=False)
    op = "text_completion" if api == "completions" else "chat"
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "gen_ai.provider.name": provider_name,
        "gen_ai.conversation.id": trajectory_id,
    }
    if model:
        attrs["gen_ai.request.model"] = model
    if isinstance(agent_name, str) and agent_name:
        attrs["gen_ai.agent.name"] = agent_name
    parts = urlsplit(base_url)
    if parts.hostname:
        attrs["server.address"] = parts.hostname
        attrs["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
    name = f"{op} {model}" if model else op
    span = tracer.start_span(name, kind=trace.SpanKind.CLIENT, attributes=attrs)
    return ChatSpan(span, owned=True)


def end_chat_span(handle: ChatSpan, rec: TurnRecord) -> None:
    """Add the turn's attributes (agentkv's, usage, response) and end an owned span."""
    span = handle.span
    try:
        if not span.is_recording():
            return
        attrs: dict[str, Any] = {
            "gen_ai.request.stream": rec.streamed,
            "agentkv.trajectory.id": rec.trajectory_id,
            "agentkv.turn.id": rec.turn_id,
            "agentkv.backend": rec.backend,
            "agentkv.mode": rec.mode,
            "agentkv.prefix.eligible_tokens": rec.eligible_prefix_tokens,
        }
        if handle.owned:
            if rec.prompt_tokens is not None:
                attrs["gen_ai.usage.input_tokens"] = rec.prompt_tokens
            if rec.completion_tokens is not None:
                attrs["gen_ai.usage.output_tokens"] = rec.completion_tokens
            if rec.response_id:
                attrs["gen_ai.response.id"] = rec.response_id
            if rec.response_model:
                attrs["gen_ai.response.model"] = rec.response_model
            if rec.finish_reasons:
                attrs["gen_ai.response.finish_reasons"] = list(rec.finish_reasons)
        if rec.cached_tokens is not None:
            attrs["gen_ai.usage.cache_read.input_tokens"] = rec.cached_tokens
        if rec.cache_write_tokens is not None:
            attrs["gen_ai.usage.cache_write.input_tokens"] = rec.cache_write_tokens
        if not handle.owned and "gen_ai.conversation.id" not in (
            getattr(span, "attributes", None) or {}
        ):
            attrs["gen_ai.conversation.id"] = rec.trajectory_id
        if rec.ttft_ms is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = rec.ttft_ms / 1000.0
        if rec.advice is not None:
            attrs["agentkv.advice.action"] = rec.advice.action
            attrs["agentkv.advice.reason"] = rec.advice.reason
            attrs["agentkv.advice.sent"] = rec.advice_sent
        span.set_attributes(attrs)
        if handle.owned and rec.error_type is not None:
            from opentelemetry import trace

            span.set_attribute("error.type", rec.error_type)
            span.set_status(trace.Status(trace.StatusCode.ERROR))
    finally:
        if handle.owned:
            span.end()


def record_call_metrics(rec: TurnRecord, api: str, provider_name: str, base_url: str) -> None:
    """Record the call's GenAI metrics (duration, token usage); a no-op without a meter."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "text_completion" if api == "completions" else "chat",
        "gen_ai.provider.name": provider_name,
        "gen_ai.request.model": rec.model,
        "gen_ai.response.model": rec.response_model,
        "error.type": rec.error_type,
    }
    parts = urlsplit(base_url)
    if parts.hostname:
        attrs["server.address"] = parts.hostname
        attrs["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
    record_model_call(attrs, rec.latency_ms / 1000.0, rec.prompt_tokens, rec.completion_tokens)
