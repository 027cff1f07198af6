"""KV residency policies for the simulator, each a small object.

When a call's answer is done the engine asks the policy what to do with the
trajectory's blocks (:meth:`Policy.after_turn`) and gets an :class:`Action`:

- ``free``: hand them to the free queue (stock vLLM: LRU tail, deepest first);
- ``retain``: ask for a lease until ``ttl_s`` (with a gap ``forecast`` when known);
- ``release``: free them and move them to the head of the free queue (evicted first);
- ``offload``: write them to the lower tier, then release them.

Leases, the pressure override (leases are given up before any call waits or is
preempted for lack of blocks) and admission are not decided here: every replica runs
the policy core, :class:`agentkv.residency.PolicyCore`, the same code as the vLLM plugin,
with the settings the policy names (:meth:`Policy.core_settings`). ``priority`` orders
the pool's free queue for policies that ask for one (``priority_queue = True``): lower
is evicted first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentkv._errors import ConfigError
from agentkv.advice._change import unchanged
from agentkv.gaps._levels import ALL_TOOLS
from agentkv.residency import Forecast, PolicySettings

if TYPE_CHECKING:
    from agentkv.advice._advisor import Advisor
    from agentkv.gaps._model import GapModel
    from agentkv.residency._strategies import Strategies
    from agentkv.sim._prefetch import TierPrefetch
    from agentkv.sim._rewarm import Rewarm

__all__ = [
    "POLICIES",
    "Action",
    "AgentKVLeasePolicy",
    "AgentKVOraclePolicy",
    "AgentKVPolicy",
    "InferCeptPolicy",
    "KVFlowPolicy",
    "LRUPolicy",
    "OraclePolicy",
    "Policy",
    "TTLFixedPolicy",
    "TurnView",
    "make_policy",
]

NEVER = -1e18  # free-queue priority of blocks that will not be used again
_DAY_MS = 86_400_000

#: Core settings of the baselines: leases exactly as asked, no cap, no admission.
BASELINE_CORE = PolicySettings(
    retention="hint",
    admission=False,
    max_retained_fraction=1.0,
    max_ttl_ms=_DAY_MS,
    affinity=False,
)


@dataclass(frozen=True, slots=True)
class Action:
    """What to do with a trajectory's blocks after a call (see the module docstring)."""

    kind: Literal["free", "retain", "release", "offload"] = "free"
    ttl_s: float = 0.0
    priority: float = 0.0  # free-queue priority, for priority_queue policies
    priority_blocks: int = -1  # only the first this many get ``priority``, the rest go first
    request_priority: int = 0  # queue priority of the trajectory's next call (lower first)
    forecast: Forecast | None = None  # expected idle gap, for the core's predicted retention
    # a better forecast that reaches the replica once the tool starts (the client's
    # tool-start event): it replaces ``forecast``, and a context left without a lease
    # is offered one again
    update: Forecast | None = None


@dataclass(frozen=True, slots=True)
class TurnView:
    """What a policy sees when a call finishes.

    ``future_next_use_s`` and ``future_shared_blocks`` are the oracle's knowledge of the
    future (when the next call arrives, how many of these blocks it reuses); other
    policies must not read them.
    """

    now_s: float
    trajectory_id: str
    turn_id: int
    tool_class: str | None
    terminal: bool
    context_tokens: int
    context_blocks: int
    kv_usage: float
    num_waiting: int
    has_lower_tier: bool
    attained_service_s: float
    recompute_s: float  # prefill time of this context from scratch
    load_s: float  # time to load this context back from the lower tier
    used_blocks: int  # blocks referenced on this replica
    future_next_use_s: float | None
    future_shared_blocks: int
    prev_tool_class: str | None = None  # the tool that ran before this call (None: first)


class Policy:
    """Base policy: stock vLLM behaviour (free everything to the LRU queue)."""

    name = "lru"
    priority_queue = False
    #: The re-warm experiment (:mod:`agentkv.sim._rewarm`), or None.
    rewarm: Rewarm | None = None
    #: Tier prefetch (:mod:`agentkv.sim._prefetch`; acts only with a lower tier), or None.
    tier_prefetch: TierPrefetch | None = None
    #: ``on_resume`` gets the gap a client sees (its answer to its next call), not the
    #: whole pause the server sees (which adds the per-call ``overhead_s``).
    learns_client_gaps = False

    def core_settings(self) -> PolicySettings:
        """Settings of the policy core each replica runs for this policy."""
        return BASELINE_CORE

    def core_strategies(self) -> Strategies | None:
        """The core's victim order, lease sizing and admission (None: the ones
        :meth:`core_settings` names); an experiment overrides this."""
        return None

    def after_turn(self, view: TurnView) -> Action:
        """Decide what happens to the blocks of the call that just finished."""
        return Action("free")

    def on_resume(self, trajectory_id: str, tool_class: str | None, idle_gap_s: float) -> None:
        """Learn from an idle gap that just ended (model call finished -> next call)."""

    def describe(self) -> dict[str, Any]:
        """Parameters of the policy for the results manifest."""
        return {"name": self.name}


class LRUPolicy(Policy):
    """Stock vLLM prefix caching: blocks go to the LRU free queue, deepest first."""


class _Ewma:
    """Per-tool moving average of observed idle gaps (what a server can learn by itself)."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.avg: dict[str, float] = {}

    def observe(self, tool: str | None, gap_s: float) -> None:
        key = tool or "-"
        old = self.avg.get(key)
        self.avg[key] = gap_s if old is None else (1 - self.alpha) * old + self.alpha * gap_s

    def get(self, tool: str | None) -> float | None:
        return self.avg.get(tool or "-")


class TTLFixedPolicy(Policy):
    """Continuum-style: retain for a fixed TTL when the tool's moving-average gap is short.

    Blocks are pinned for ``ttl_s`` when the tool's moving-average duration is under
    ``threshold_s`` (2 s in Continuum's preview code); unseen tools and final answers free.
    """

    name = "ttl-fixed"

    def __init__(self, threshold_s: float = 2.0, ttl_s: float | None = None) -> None:
        self.threshold_s = threshold_s
        self.ttl_s = threshold_s if ttl_s is None else ttl_s
        self._gaps = _Ewma()

    def after_turn(self, view: TurnView) -> Action:
        """Retain when the tool's average gap is under the threshold."""
        if view.terminal:
            return Action("free")
        avg = self._gaps.get(view.tool_class)
        if avg is not None and avg < self.threshold_s:
            return Action("retain", ttl_s=self.ttl_s)
        return Action("free")

    def on_resume(self, trajectory_id: str, tool_class: str | None, idle_gap_s: float) -> None:
        """Update the tool's moving average."""
        self._gaps.observe(tool_class, idle_gap_s)

    def describe(self) -> dict[str, Any]:
        """Threshold and TTL."""
        return {"name": self.name, "threshold_s": self.threshold_s, "ttl_s": self.ttl_s}


class InferCeptPolicy(Policy):
    """InferCept-style: per tool call, discard, preserve or swap by least memory x time waste.

    With ``G`` the tool's moving-average gap, ``C`` the context's blocks and ``U`` the
    blocks in use: preserve wastes ``C * G``; discard wastes ``recompute_s * (U + C)``
    (the batch waits while the context is rebuilt); swap wastes ``2 * load_s * U``
    (only with a lower tier). Final answers free.
    """

    name = "infercept"

    def __init__(self, default_gap_s: float = 1.0) -> None:
        self.default_gap_s = default_gap_s
        self._gaps = _Ewma()

    def after_turn(self, view: TurnView) -> Action:
        """Pick the action of least waste."""
        if view.terminal:
            return Action("free")
        gap = self._gaps.get(view.tool_class)
        gap = self.default_gap_s if gap is None else gap
        waste = {
            "retain": view.context_blocks * gap,
            "release": view.recompute_s * (view.used_blocks + view.context_blocks),
        }
        if view.has_lower_tier:
            waste["offload"] = 2 * view.load_s * max(1, view.used_blocks)
        kind = min(waste, key=lambda k: (waste[k], k))
        if kind == "retain":
            return Action("retain", ttl_s=max(1.0, 4 * gap))
        return Action(kind)  # type: ignore[arg-type]

    def on_resume(self, trajectory_id: str, tool_class: str | None, idle_gap_s: float) -> None:
        """Update the tool's moving-average gap."""
        self._gaps.observe(tool_class, idle_gap_s)


class KVFlowPolicy(Policy):
    """KVFlow-style: evict by steps-to-execution, prefetch from the lower tier ahead of use.

    A single-agent trajectory's next step runs after its tool: the policy predicts when
    (now plus the tool's moving-average gap) and orders the free queue so the block due
    latest is evicted first; finished trajectories go first of all. With a lower tier,
    blocks are offloaded and prefetched back during the gap, so the load is hidden.
    """

    name = "kvflow"
    priority_queue = True
    prefetch = True

    def __init__(self, default_gap_s: float = 1.0) -> None:
        self.default_gap_s = default_gap_s
        self._gaps = _Ewma()

    def after_turn(self, view: TurnView) -> Action:
        """Free with a priority of minus the predicted next use."""
        if view.terminal:
            return Action("release", priority=NEVER)
        gap = self._gaps.get(view.tool_class)
        gap = self.default_gap_s if gap is None else gap
        return Action("free", priority=-(view.now_s + gap))

    def on_resume(self, trajectory_id: str, tool_class: str | None, idle_gap_s: float) -> None:
        """Update the tool's moving-average gap."""
        self._gaps.observe(tool_class, idle_gap_s)


class OraclePolicy(Policy):
    """Belady's rule on blocks: evict the block whose next use lies furthest ahead.

    It reads the future: when each trajectory calls next and how much of its context that
    call shares. Blocks never used again go first, deepest first. This bounds the reuse
    any policy can get from a pool of the same size (on the same request timing).
    """

    name = "oracle"
    priority_queue = True

    def after_turn(self, view: TurnView) -> Action:
        """Free with a priority of minus the true next use."""
        if view.future_next_use_s is None:
            return Action("free", priority=NEVER)
        return Action(
            "free",
            priority=-view.future_next_use_s,
            priority_blocks=view.future_shared_blocks,
        )


def _fresh_gap_model() -> GapModel:
    """A cold gap model as a new client process has one: the shipped per-family priors,
    no decay (the run is short, and weights must not depend on the wall clock)."""
    from agentkv.gaps._model import GapModel
    from agentkv.gaps._priors import default_priors

    return GapModel(half_life_s=None, priors=default_priors())


class AgentKVLeasePolicy(Policy):
    """agentkv's first policy, as the plugin runs it today: short leases from the Advisor.

    The SDK's :class:`agentkv.GapModel` and :class:`agentkv.Advisor` advise retain (a
    lease with a TTL from the gap's p90), release (terminal), offload or default; the
    core runs with the plugin's settings (``retention="hint"``: leases only as advised,
    the retained cap, the TTL clamp, earliest deadline given up first; no admission).
    """

    name = "agentkv-v1"
    learns_client_gaps = True  # the SDK's gap model lives in the client

    def __init__(self, advisor: Advisor | None = None, gap_model: GapModel | None = None) -> None:
        from agentkv.advice._advisor import Advisor

        self.gap_model = gap_model if gap_model is not None else _fresh_gap_model()
        self.advisor = advisor if advisor is not None else Advisor(self.gap_model)
        self.actions: dict[str, int] = {}

    def core_settings(self) -> PolicySettings:
        """The plugin's settings for arm E today (hint retention, cap 0.5, no admission)."""
        return PolicySettings(retention="hint", admission=False, max_retained_fraction=0.5)

    def after_turn(self, view: TurnView) -> Action:
        """Ask the Advisor, as the client wrapper does after each call."""
        from agentkv.advice._advisor import LoadSnapshot, TrajectoryState

        state = TrajectoryState(
            trajectory_id=view.trajectory_id,
            turn_id=view.turn_id,
            tool_class=view.tool_class,
            terminal=view.terminal,
            prefix_tokens=view.context_tokens,
            resumed=not view.terminal,
            attained_service_s=view.attained_service_s,
        )
        load = LoadSnapshot(
            kv_usage=view.kv_usage,
            num_waiting=view.num_waiting,
            has_lower_tier=view.has_lower_tier,
        )
        advice = self.advisor.advise(state, load=load)
        self.actions[advice.action] = self.actions.get(advice.action, 0) + 1
        prio = int(advice.priority or 0)
        if advice.action in ("retain", "prefetch"):
            # prefetch: re-warmed or reloaded during the gap and held until the return;
            # the simulator models it as holding the blocks under the same TTL.
            ttl_s = (advice.ttl_ms or 0) / 1000.0
            return Action("retain", ttl_s=ttl_s, request_priority=prio)
        if advice.action == "release":
            return Action("release", request_priority=prio)
        if advice.action == "offload" and view.has_lower_tier:
            return Action("offload", request_priority=prio)
        return Action("free", request_priority=prio)

    def on_resume(self, trajectory_id: str, tool_class: str | None, idle_gap_s: float) -> None:
        """Teach the gap model the idle gap that just ended."""
        self.gap_model.observe(tool_class or "unknown", idle_gap_s, kind="idle")

    def describe(self) -> dict[str, Any]:
        """The advice mix the Advisor gave during the run."""
        return {"name": self.name, "advice_actions": dict(sorted(self.actions.items()))}


class AgentKVPolicy(Policy):
    """agentkv: retention by predicted next use, with program-level admission.

    After every turn the trajectory's context is offered for a lease with a forecast of
    its idle gap (p50 / p90 / p99 of the tool class, from the SDK's
    :class:`agentkv.GapModel`, learned online); a finished trajectory is released. The
    core (``retention="predicted"``, ``admission=True``) keeps the contexts expected back
    soonest, gives up the one expected back last, declines what the pool cannot keep,
    and holds back turns that would only thrash (see :mod:`agentkv.residency._core`).
    ``settings`` overrides the core's settings, ``strategies`` its parts; ``rewarm`` runs the
    re-warm experiment; ``tier_prefetch`` (an experiment, off by default) loads paused
    contexts back from a lower tier ahead of their return.
    """

    name = "agentkv"
    learns_client_gaps = True  # the SDK's gap model lives in the client

    def __init__(
        self,
        gap_model: GapModel | None = None,
        settings: PolicySettings | None = None,
        rewarm: Rewarm | None = None,
        strategies: Strategies | None = None,
        tier_prefetch: TierPrefetch | None = None,
    ) -> None:
        self.gap_model = gap_model if gap_model is not None else _fresh_gap_model()
        self.settings = settings if settings is not None else PolicySettings()
        self.rewarm = rewarm
        self.strategies = strategies
        self.tier_prefetch = tier_prefetch
        from agentkv.advice._advisor import Advisor

        self._advisor: Advisor = Advisor(self.gap_model)  # the client's TTL rule

    def core_settings(self) -> PolicySettings:
        """Predicted retention and admission (or the settings given)."""
        return self.settings

    def core_strategies(self) -> Strategies | None:
        """The strategies given (None: the ones the settings name)."""
        return self.strategies

    def after_turn(self, view: TurnView) -> Action:
        """Offer the context for a lease; release at the end.

        As the SDK does: the call carried the forecast of the gap that follows a call
        sent after the tool that ran before it (the gap model's ``next`` kind: which
        tool its answer calls is not known when it is sent), and the tool-start event
        brings the forecast of the tool that now runs (``Action.update``), unless it is
        close to the one carried (the client does not post unchanged advice)."""
        if view.terminal:
            return Action("release")
        ttl_s = self._ttl_s(view.prev_tool_class)
        carried = self._forecast(view.prev_tool_class, at_call=True)
        running = self._forecast(view.tool_class)
        # the client posts no event whose advice is close to what the call carried
        same = unchanged(carried.p50_s, running.p50_s) and unchanged(carried.p90_s, running.p90_s)
        return Action("retain", ttl_s=ttl_s, forecast=carried, update=None if same else running)

    def _ttl_s(self, tool_class: str | None) -> float:
        """The lease bound the SDK's advisor sends with the call (its ``retain`` TTL for
        the class, :meth:`agentkv.Advisor.retain_ttl_ms`); the core's cap while the class
        has too little evidence, as the server caps a ``default`` advice's lease."""
        ttl_ms = self._advisor.retain_ttl_ms(tool_class or ALL_TOOLS)
        cap = self.settings.max_ttl_ms
        return (cap if ttl_ms is None else min(ttl_ms, cap)) / 1000.0

    def _forecast(self, tool_class: str | None, *, at_call: bool = False) -> Forecast:
        """The gap forecast the SDK's advisor sends for ``tool_class`` (None: all tools;
        ``at_call``: for the gap after a call sent once ``tool_class`` ran)."""
        cls = tool_class or ALL_TOOLS
        model = self.gap_model
        est = model.estimate_after_call(cls) if at_call else model.estimate(cls, kind="idle")
        return Forecast(est.p50, max(est.p50, est.p90), max(est.p50, est.p90, est.p99))

    def on_resume(self, trajectory_id: str, tool_class: str | None, idle_gap_s: float) -> None:
        """Teach the gap model the idle gap that just ended, as the SDK's model call
        does (its ``idle`` and ``next`` kinds: :meth:`agentkv.GapModel.learn_call`)."""
        self.gap_model.learn_call(trajectory_id, tool_class or "unknown", idle_gap_s * 1000.0, 0)

    def describe(self) -> dict[str, Any]:
        """The core settings the run used."""
        s = self.settings
        return {
            "name": self.name,
            "retention": s.retention,
            "admission": s.admission,
            "max_retained_fraction": s.max_retained_fraction,
            "aging_s": s.aging_s,
            "reserve_fraction": s.reserve_fraction,
            "rewarm_horizon_turns": None if self.rewarm is None else self.rewarm.horizon_turns,
        }


class AgentKVOraclePolicy(AgentKVPolicy):
    """agentkv's core fed with exact return times: the bound of its forecasts.

    The same decisions as :class:`AgentKVPolicy` (predicted retention, admission), with
    each forecast replaced by the true time to the trajectory's next call. The gap
    between the two is what better gap prediction could still win.
    """

    name = "agentkv-oracle"

    def after_turn(self, view: TurnView) -> Action:
        """Offer the context for a lease with its exact return time."""
        if view.terminal or view.future_next_use_s is None:
            return Action("release")
        gap = max(0.0, view.future_next_use_s - view.now_s)
        ttl_s = self.settings.max_ttl_ms / 1000.0
        return Action("retain", ttl_s=ttl_s, forecast=Forecast(gap, gap, gap))


POLICIES: dict[str, Callable[[], Policy]] = {
    "lru": LRUPolicy,
    "agentkv": AgentKVPolicy,
    "agentkv-v1": AgentKVLeasePolicy,
    "agentkv-oracle": AgentKVOraclePolicy,
    "ttl-fixed": TTLFixedPolicy,
    "infercept": InferCeptPolicy,
    "kvflow": KVFlowPolicy,
    "oracle": OraclePolicy,
}


def make_policy(name: str, *, gap_model: GapModel | None = None) -> Policy:
    """Build a fresh policy by name (one of :data:`POLICIES`).

    ``gap_model``: the client's gap model for the policies that learn one (``agentkv``,
    ``agentkv-v1``), e.g. one warmed like ``agentkv bench``'s replays; others ignore
    it. Without it they start cold, with the shipped per-class priors.
    """
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}: choose from {', '.join(POLICIES)}") from None
    if gap_model is not None and factory in (AgentKVPolicy, AgentKVLeasePolicy):
        return factory(gap_model=gap_model)  # type: ignore[call-arg]
    return factory()
