"""The advisor: trajectory state + gap estimate + sizes + load -> :class:`CacheAdvice`.

The policy has two layers (policy version :data:`POLICY_VERSION`):

1. The seed's coarse policy. A terminal trajectory is released. Without enough gap
   evidence the advice is ``default`` (the server's own LRU decides). A short predicted
   gap (p90 within ``short_gap_s``) retains, with a TTL from the p99 plus a margin,
   capped at ``max_ttl_ms`` (the TTL bounds the lease, the forecast ranks it: a TTL at
   the p90 let one return in ten find its lease expired). A long gap under pressure offloads where the server has a
   lower tier and releases otherwise.
2. The cost model refines it when the prefix size is known: retaining is kept only while
   ``S·G·M`` (memory held through the gap) costs less than getting the prefix back
   (``min(S/B + A, P)``); a longer gap whose retention is still cheap is retained too
   (bounded by ``max_ttl_ms``). When retention loses and the next step is known,
   prefetch is advised if ``P(next)·avoided_stall > transfer + pollution + wrong-path``.

Priority advice is for resumed turns only and bounded: at most ``max_priority_boost``
below the neutral 0 (vLLM runs lower values first), and none once a trajectory has had
``fairness_service_s`` of model time, so a long program cannot starve others.

Rollout modes: ``observe`` (events only, no advice sent), ``shadow`` (advice computed and
logged but not sent), ``active`` (sent). With ``canary_fraction < 1`` only trajectories
whose id hashes below the fraction are active; the rest run in shadow. The
:class:`ShadowLog` compares logged advice with when the trajectory actually came back.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

from agentkv.advice._costmodel import CostBreakdown, CostModel, LoadSnapshot
from agentkv.advice._shadow import ShadowLog
from agentkv.events._schema import CacheAdvice

__all__ = [
    "POLICY_VERSION",
    "Advisor",
    "LoadSnapshot",
    "Mode",
    "ShadowLog",
    "TrajectoryState",
    "after_call_estimate",
]

logger = logging.getLogger("agentkv")

#: Version tag written into every advice (invariant 7).
POLICY_VERSION = "coarse-2+cost-1"

Mode = Literal["observe", "shadow", "active"]
_MODES: tuple[str, ...] = ("observe", "shadow", "active")


class _GapEstimateLike(Protocol):
    p50: float
    p90: float
    p99: float
    n: int
    confident: bool


class _GapModelLike(Protocol):
    def estimate(self, tool_class: Any, *, kind: str = "idle") -> Any: ...


def after_call_estimate(model: _GapModelLike, tool_class: str) -> Any:
    """The model's forecast of the gap after a call sent once ``tool_class`` ran: its
    ``estimate_after_call`` where it has one (:class:`agentkv.GapModel`), else the
    class's own idle gap."""
    after_call = getattr(model, "estimate_after_call", None)
    if after_call is not None:
        return after_call(tool_class)
    return model.estimate(tool_class, kind="idle")


class _Gap(NamedTuple):
    """A gap forecast in seconds; ``enough``: backed by ``min_evidence`` samples."""

    p50: float
    p90: float
    p99: float
    enough: bool


@dataclass(frozen=True, slots=True)
class TrajectoryState:
    """What the advisor knows about one trajectory at a decision point (pure data)."""

    trajectory_id: str
    turn_id: int
    tool_class: str | None = None  # the tool about to run / running (None: unknown yet)
    # The state is a model call's, taken as it is sent: ``tool_class`` is the tool that ran
    # before it, and the gap to forecast is the one after this call, whose tool its answer
    # has not chosen yet (the gap model's "next" kind).
    at_call: bool = False
    terminal: bool = False  # the trajectory is finished or cancelled
    prefix_tokens: int = 0  # tokens of reusable prefix the trajectory holds on the server
    next_step_known: bool = False  # the harness knows the next prompt prefix
    p_next: float = 1.0  # probability the known next step happens
    resumed: bool = False  # this request resumes after a tool (for priority advice)
    attained_service_s: float = 0.0  # total model time the trajectory has had (fairness)


_IDLE = LoadSnapshot()  # frozen: one shared instance for "no load known"

#: A decision: (action, reason, ttl_ms, gap forecast).
_Decision = tuple[str, str, int | None, "_Gap | None"]


def _ms(x: float) -> float:
    return round(max(x, 0.0) * 1000.0, 3)


def _finite(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


class Advisor:
    """Turns trajectory state into :class:`CacheAdvice` (deterministic; never raises).

    ``gap_model`` predicts idle gaps per tool class (``None``: the advisor has no
    evidence and answers ``default``); ``cost_model`` refines the coarse policy when the
    prefix size is known. ``max_ttl_ms`` caps every retain TTL. See the module docstring
    for the policy, the modes and the canary.

    Each call decides afresh: the settings are plain attributes, read when used.
    """

    def __init__(
        self,
        gap_model: Any | None = None,
        cost_model: CostModel | None = None,
        *,
        max_ttl_ms: int = 600_000,
        mode: Mode = "active",
        canary_fraction: float = 1.0,
        short_gap_s: float = 30.0,
        pressure_kv_usage: float = 0.8,
        ttl_margin: float = 2.0,
        ttl_slack_ms: int = 500,
        min_evidence: int = 3,
        max_priority_boost: int = 1,
        fairness_service_s: float = 120.0,
        prefetch_pollution_weight: float = 1.0,
    ) -> None:
        if mode not in _MODES:
            from agentkv._errors import ConfigError

            raise ConfigError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
        if not 0.0 <= canary_fraction <= 1.0:
            from agentkv._errors import ConfigError

            raise ConfigError(f"canary_fraction must be within [0, 1], got {canary_fraction!r}")
        if max_ttl_ms <= 0:
            from agentkv._errors import ConfigError

            raise ConfigError(f"max_ttl_ms must be positive, got {max_ttl_ms!r}")
        self.gap_model = gap_model
        self.cost_model = cost_model
        self.max_ttl_ms = int(max_ttl_ms)
        self.mode: Mode = mode
        self.canary_fraction = float(canary_fraction)
        self.short_gap_s = float(short_gap_s)
        self.pressure_kv_usage = float(pressure_kv_usage)
        self.ttl_margin = float(ttl_margin)
        self.ttl_slack_ms = int(ttl_slack_ms)
        self.min_evidence = int(min_evidence)
        self.max_priority_boost = max(0, int(max_priority_boost))
        self.fairness_service_s = float(fairness_service_s)
        self.prefetch_pollution_weight = float(prefetch_pollution_weight)
        self.shadow_log = ShadowLog()

    def __repr__(self) -> str:
        return (
            f"Advisor(mode={self.mode!r}, canary_fraction={self.canary_fraction}, "
            f"max_ttl_ms={self.max_ttl_ms}, policy={POLICY_VERSION!r})"
        )

    # --- rollout ----------------------------------------------------------------------
    def mode_for(self, trajectory_id: str) -> Mode:
        """The effective mode for one trajectory (the canary is chosen by id hash)."""
        if self.mode != "active" or self.canary_fraction >= 1.0:
            return self.mode
        digest = hashlib.sha256(trajectory_id.encode("utf-8", "surrogatepass")).digest()
        bucket = int.from_bytes(digest[:8], "big") / 2.0**64
        return "active" if bucket < self.canary_fraction else "shadow"

    # --- the policy -------------------------------------------------------------------
    def advise(self, state: TrajectoryState, *, load: LoadSnapshot | None = None) -> CacheAdvice:
        """Advice for ``state`` under ``load``; odd input gives ``default`` advice."""
        try:
            return self._advise(state, load or _IDLE)
        except Exception as exc:  # the policy must never break a caller
            logger.debug("agentkv: advisor fell back to default (%r)", exc)
            tid = getattr(state, "trajectory_id", None)
            return CacheAdvice.model_construct(
                trajectory_id=tid if isinstance(tid, str) and tid else "unknown",
                action="default",
                ttl_ms=None,
                priority=None,
                reason="insufficient_evidence",
                policy_version=POLICY_VERSION,
                turn_id=None,
                predicted_gap_ms=None,
            )

    def _make(
        self,
        state: TrajectoryState,
        action: str,
        reason: str,
        *,
        ttl_ms: int | None = None,
        gap: _Gap | None = None,
        priority: int | None = None,
    ) -> CacheAdvice:
        fields: dict[str, Any] = {
            "trajectory_id": state.trajectory_id,
            "action": action,
            "ttl_ms": ttl_ms,
            "priority": priority,
            "reason": reason,
            "policy_version": POLICY_VERSION,
            "turn_id": max(int(state.turn_id), 0),
            "predicted_gap_ms": None if gap is None else _ms(gap.p50),
            "predicted_gap_p90_ms": None if gap is None else _ms(gap.p90),
            "predicted_gap_p99_ms": None if gap is None else _ms(gap.p99),
        }
        return CacheAdvice.model_validate(fields)

    def compute_priority(self, state: TrajectoryState) -> int | None:
        """Bounded priority for a resumed turn (lower runs sooner in vLLM), else None."""
        if not state.resumed or self.max_priority_boost == 0:
            return None
        if _finite(state.attained_service_s) >= self.fairness_service_s:
            return 0
        return -self.max_priority_boost

    def _estimate(self, tool_class: str | None, at_call: bool = False) -> _Gap | None:
        """The gap forecast (p50 <= p90 <= p99, seconds), or None when the model has
        none; ``enough`` is false while it rests on fewer than ``min_evidence`` samples
        (a prior, or a class just seen): the forecast still travels, the advice is
        ``default``. ``at_call``: the gap after a model call sent once ``tool_class``
        ran (:attr:`TrajectoryState.at_call`), not ``tool_class``'s own."""
        model = self.gap_model
        if model is None:
            return None
        cls = tool_class or "*"  # "*": all tool classes
        est = after_call_estimate(model, cls) if at_call else model.estimate(cls, kind="idle")
        n = int(getattr(est, "n", 0) or 0)
        enough = n >= self.min_evidence or bool(getattr(est, "confident", False))
        p50, p90, p99 = (
            getattr(est, "p50", None),
            getattr(est, "p90", None),
            getattr(est, "p99", None),
        )
        # A finite float (what a GapModel answers) as it is; anything else through _finite.
        if not (type(p50) is float and p50 - p50 == 0.0):
            p50 = _finite(p50, -1.0)
        if not (type(p90) is float and p90 - p90 == 0.0):
            p90 = _finite(p90, -1.0)
        if not (type(p99) is float and p99 - p99 == 0.0):
            p99 = _finite(p99, -1.0)
        if p50 < 0 or p90 < 0:
            return None
        p90 = max(p90, p50)
        return _Gap(p50, p90, max(p99, p90), enough)

    def _ttl_ms(self, high_gap_s: float) -> int:
        ttl = high_gap_s * 1000.0 * self.ttl_margin + self.ttl_slack_ms
        return int(min(max(ttl, 1.0), self.max_ttl_ms))

    def retain_ttl_ms(self, tool_class: str | None) -> int | None:
        """The TTL a ``retain`` for a pause in ``tool_class`` carries: the gap's p99
        times ``ttl_margin`` plus ``ttl_slack_ms``, capped at ``max_ttl_ms``. None while
        the forecast rests on too little evidence (the advice is then ``default``, and a
        server bounds the lease by its own cap). A model call's retain
        (:attr:`TrajectoryState.at_call`) is bounded by the TTL of the tool that ran
        before it, though it forecasts the gap after the call."""
        gap = self._estimate(tool_class)
        if gap is None or not gap.enough:
            return None
        return self._ttl_ms(gap.p99)

    def _advise(self, state: TrajectoryState, load: LoadSnapshot) -> CacheAdvice:
        if not isinstance(state.trajectory_id, str) or not state.trajectory_id:
            raise ValueError("trajectory_id must be a non-empty string")
        priority = self.compute_priority(state)
        if state.terminal:
            return self._make(state, "release", "terminal_state")
        tokens = max(int(state.prefix_tokens), 0)
        gap = self._estimate(state.tool_class, bool(state.at_call))
        action, reason, ttl_ms, gap = self._decide(state, load, tokens, gap)
        if action == "retain" and state.at_call:
            # The bound stays the previous tool's own (p99 x margin + slack, as tuned):
            # the gap-after-call quantiles mix slow tools into every call's bound, and
            # in the simulator's fast-prefill grid that cost c4 and the open loop
            # (docs/lab/tail-cost-grid.md, December 4 evening).
            ttl_ms = self.retain_ttl_ms(state.tool_class) or ttl_ms
        return self._make(state, action, reason, ttl_ms=ttl_ms, gap=gap, priority=priority)

    def _decide(
        self, state: TrajectoryState, load: LoadSnapshot, tokens: int, gap: _Gap | None
    ) -> _Decision:
        """The policy for a non-terminal trajectory: (action, reason, ttl_ms, gap).

        A pure function of the gap forecast, ``tokens`` (when there is a cost model),
        the next step's probability, ``load``, the settings and the cost model's figures:
        and nothing else.
        """
        if gap is None or not gap.enough:
            return ("default", "insufficient_evidence", None, gap)
        g50, g90 = gap.p50, gap.p90
        pressured = load.kv_usage >= self.pressure_kv_usage or load.num_waiting > 0
        short = g90 <= self.short_gap_s
        fits_ttl = g90 * 1000.0 <= self.max_ttl_ms
        cm = self.cost_model
        if cm is None or tokens == 0:
            # The coarse policy alone.
            if short:
                return self._retain(gap)
            if pressured:
                return self._drop(state, load, gap, None)
            return ("default", "insufficient_evidence", None, gap)
        bd = cm.compute(tokens, g50, load)
        if bd.retain_cost_s <= bd.rebuild_s and fits_ttl:
            return self._retain(gap)
        if short and not pressured:
            return self._retain(gap)
        if pressured:
            return self._drop(state, load, gap, bd)
        return ("default", "insufficient_evidence", None, gap)

    def _retain(self, gap: _Gap) -> _Decision:
        # The TTL only bounds the lease (a crashed client's ends when it said it would);
        # the forecast ranks it, so the bound covers the tail, not the p90.
        return ("retain", "short_tool_gap", self._ttl_ms(gap.p99), gap)

    def _drop(
        self,
        state: TrajectoryState,
        load: LoadSnapshot,
        gap: _Gap,
        bd: CostBreakdown | None,
    ) -> _Decision:
        if bd is not None and state.next_step_known and self.should_prefetch(state, bd, load):
            # Hold the re-warmed (or reloaded) prefix until the expected return.
            return ("prefetch", "next_step_known", self._ttl_ms(gap.p50), gap)
        if load.has_lower_tier and (
            bd is None or bd.reload_s is None or bd.reload_s < bd.recompute_s
        ):
            return ("offload", "capacity_pressure", None, gap)
        return ("release", "capacity_pressure", None, gap)

    def should_prefetch(
        self, state: TrajectoryState, bd: CostBreakdown, load: LoadSnapshot
    ) -> bool:
        """``P(next)·avoided_stall > transfer + pollution + wrong-path cost``.

        Transfer is a reload from the lower tier, or on a server without one a re-warm
        (recomputing the known prefix during the gap), weighted by how busy the server is;
        pollution is the memory held from the start of the prefetch to the return (the
        transfer time plus a tenth of the gap for the uncertainty of the return); the
        wrong path pays the transfer for nothing with probability ``1 - P(next)``.
        """
        p = min(max(_finite(state.p_next, 0.0), 0.0), 1.0)
        avoided_stall = bd.rebuild_s
        transfer_time = bd.reload_s if bd.reload_s is not None else bd.recompute_s
        transfer = transfer_time * bd.pressure
        hold_s = transfer_time + 0.1 * bd.gap_s
        per_s = bd.retain_cost_s / bd.gap_s if bd.gap_s > 0 else 0.0
        pollution = self.prefetch_pollution_weight * per_s * hold_s
        wrong_path = (1.0 - p) * transfer_time
        return p * avoided_stall > transfer + pollution + wrong_path
