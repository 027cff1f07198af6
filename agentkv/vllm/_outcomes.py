"""Per-hint outcomes in two phases, as the scheduler plugin records them (pure).

A harness that sends a hint wants to know what became of it. The plugin answers in two
phases, per (tenant-scoped) trajectory and turn:

1. **At the request** (``verdict``), when the plugin reads the hint in ``add_request``:

   - ``accepted``: the server will act on it (``reason`` may note a part it ignores, such
     as an advised priority on a server without priority scheduling);
   - ``rejected``: the hint broke the protocol's rule (``reason`` names the field); the
     request is served as if it carried none;
   - ``unsupported``: the hint is well formed but asks for what this server does not do
     now (``prefetch``; ``offload`` without a lower tier; lifecycle actions with
     lifecycle hints off; any hint while the server's policy mode is ``shadow`` or
     ``off``).

2. **Later** (``result``), for an accepted hint, once its turn's residency is settled:

   - ``applied``: what it asked for happened: the context its turn left under a lease
     was taken up again by the trajectory's next turn, or a ``release`` was done;
   - ``failed``: the server could not hold it: no lease was granted (the retained cap,
     the lease policy declined it, an aborted request, a finished trajectory), or the
     lease gave way to memory pressure;
   - ``expired``: the lease ended unused: its TTL or lifetime ran out, the client ended
     the trajectory (or released it) first, or the trajectory was forgotten.

   A hint whose turn left nothing to settle (``default`` advice and no lease) keeps
   ``result`` None.

:class:`OutcomeLog` keeps the outcomes of the last :data:`MAX_TURNS` turns of at most
:data:`MAX_TRAJECTORIES` trajectories (least recently touched forgotten first). Keys are
the plugin's trajectory keys, MACs of (cache salt, trajectory id)
(:mod:`agentkv.vllm._tenancy`): a caller reads only the outcomes of its own scope, and no
salt or id is kept in clear. :func:`lease_result` maps how a lease ended (the trajectory
book's outcome names) to the second phase. :class:`PluginOutcomes` is the plugin's
collaborator that records them at its hooks. No vLLM import.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from agentkv.protocol._hints import Hint

__all__ = [
    "MAX_TRAJECTORIES",
    "MAX_TURNS",
    "RESULTS",
    "VERDICTS",
    "HintOutcome",
    "OutcomeLog",
    "PluginOutcomes",
    "hint_verdict",
    "lease_result",
]

VERDICTS = ("accepted", "rejected", "unsupported")
RESULTS = ("applied", "failed", "expired")
MAX_TRAJECTORIES = 4096
MAX_TURNS = 16

#: How a lease ended (the book's outcome) -> (result, reason).
_LEASE_END: dict[str, tuple[str, str]] = {
    "reused": ("applied", "the next turn reused the leased context"),
    "expired": ("expired", "the lease's TTL or lifetime ran out before the next turn"),
    "released": ("expired", "the trajectory was released or ended before the next turn"),
    "replaced": ("expired", "a newer lease of the trajectory replaced it"),
    "pressure_released": ("failed", "the lease gave way to memory pressure"),
}


def lease_result(ended_as: str | None) -> tuple[str, str]:
    """The second phase of a hint whose lease ended as ``ended_as`` (the trajectory
    book's outcome name; None: the trajectory was forgotten)."""
    if ended_as is None:
        return "expired", "the trajectory was forgotten (the server's trajectory bound)"
    return _LEASE_END.get(ended_as, ("failed", f"the lease ended as {ended_as}"))


def hint_verdict(
    hint: Hint,
    *,
    mode: str,
    lifecycle: bool,
    lower_tier: bool,
    priorities: bool,
) -> tuple[str, str | None]:
    """The first phase of a well-formed hint: ``(verdict, reason)`` on a server in policy
    ``mode`` with those features."""
    if mode != "act":
        return "unsupported", f"the server's policy mode is {mode}: nothing is applied"
    action = hint.action
    if action == "prefetch":
        return "unsupported", "prefetch is not offered by this server"
    if action == "offload" and not lower_tier:
        return "unsupported", "offload needs a lower KV tier; this server has none"
    if action in ("retain", "release", "offload") and not lifecycle:
        return "unsupported", "lifecycle hints are off on this server"
    if hint.priority is not None and not priorities:
        return "accepted", "the advised priority is ignored: no priority scheduling here"
    return "accepted", None


@dataclass(slots=True)
class HintOutcome:
    """The two phases of one turn's hint (see the module docstring)."""

    turn_id: int | None
    verdict: str
    reason: str | None = None
    result: str | None = None
    result_reason: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """The outcome as the control route answers it (camelCase)."""
        return {
            "turnId": self.turn_id,
            "verdict": self.verdict,
            "verdictReason": self.reason,
            "result": self.result,
            "resultReason": self.result_reason,
        }


class OutcomeLog:
    """Bounded per-trajectory outcomes of the recent turns (see the module docstring).

    ``awaiting`` indexes the outcomes whose result waits for a lease to end (at most one
    per trajectory: a trajectory holds at most one lease).
    """

    def __init__(
        self, max_trajectories: int = MAX_TRAJECTORIES, max_turns: int = MAX_TURNS
    ) -> None:
        self.max_trajectories = max(1, max_trajectories)
        self.max_turns = max(1, max_turns)
        self._by_key: OrderedDict[str, list[HintOutcome]] = OrderedDict()
        self.awaiting: dict[str, HintOutcome] = {}
        self.counts: Counter[str] = Counter()  # verdicts and results, for the stats

    def record(
        self, key: str, turn_id: int | None, verdict: str, reason: str | None = None
    ) -> HintOutcome:
        """The first phase of ``key``'s turn ``turn_id`` (a retried turn replaces it)."""
        outcome = HintOutcome(turn_id, verdict, reason)
        turns = self._by_key.get(key)
        if turns is None:
            turns = self._by_key[key] = []
            while len(self._by_key) > self.max_trajectories:
                old, _ = self._by_key.popitem(last=False)
                self.awaiting.pop(old, None)
        else:
            self._by_key.move_to_end(key)
            turns[:] = [o for o in turns if o.turn_id != turn_id or turn_id is None]
        turns.append(outcome)
        del turns[: -self.max_turns]
        self.counts[verdict] += 1
        return outcome

    def settle(self, outcome: HintOutcome, result: str, reason: str | None = None) -> None:
        """The second phase of ``outcome`` (once: a settled outcome keeps its result)."""
        if outcome.result is None:
            outcome.result, outcome.result_reason = result, reason
            self.counts[result] += 1

    def await_lease(self, key: str, outcome: HintOutcome) -> None:
        """``outcome``'s turn left a lease: its result comes when the lease ends. An
        earlier outcome still waiting on ``key`` was replaced by this lease."""
        earlier = self.awaiting.get(key)
        if earlier is not None and earlier is not outcome:
            self.settle(earlier, *lease_result("replaced"))
        self.awaiting[key] = outcome

    def lease_ended(self, key: str, ended_as: str | None) -> None:
        """``key``'s lease ended as ``ended_as``: settle the outcome waiting on it."""
        outcome = self.awaiting.pop(key, None)
        if outcome is not None:
            self.settle(outcome, *lease_result(ended_as))

    def get(self, key: str) -> list[dict[str, Any]]:
        """``key``'s recorded outcomes, oldest turn first, in wire form."""
        return [o.to_wire() for o in self._by_key.get(key, ())]

    def reset(self, reason: str) -> None:
        """Every lease ended at once (a mode switch, a prefix-cache reset)."""
        for outcome in self.awaiting.values():
            self.settle(outcome, "expired", reason)
        self.awaiting.clear()

    def stats(self) -> dict[str, int]:
        """``hint_<verdict or result>`` counters."""
        return {f"hint_{name}": self.counts.get(name, 0) for name in (*VERDICTS, *RESULTS)}


class PluginOutcomes:
    """The scheduler plugin's collaborator that records outcomes at its hooks.

    ``plugin`` is the :class:`agentkv.vllm._plugin.Plugin` (read: its mode, settings,
    scoper and residency controller; nothing of it is changed here).
    """

    def __init__(self, plugin: Any) -> None:
        self.plugin = plugin
        self.log = OutcomeLog()
        self._leases_ended = 0  # lease endings counted when outcomes were last settled

    def on_request(
        self, salt: str | None, hint: Hint, key: str | None = None
    ) -> HintOutcome | None:
        """The verdict on a request's hint, recorded in its scope; the outcome when it was
        accepted (its result is settled later), else None."""
        if hint.passive:
            return None
        log, plugin = self.log, self.plugin
        if hint.rejected:
            if hint.rejected_id is not None:
                reason = hint.errors[0] if hint.errors else None
                log.record(
                    plugin.scoper.key(salt, hint.rejected_id), hint.turn_id, "rejected", reason
                )
            return None
        verdict, reason = hint_verdict(
            hint,
            mode=plugin.mode,
            lifecycle=plugin.settings.lifecycle,
            lower_tier=plugin.lower_tier,
            priorities=plugin.programs,
        )
        key = plugin.scoper.key(salt, hint.trajectory_id) if key is None else key
        outcome = log.record(key, hint.turn_id, verdict, reason)
        return outcome if verdict == "accepted" else None

    def lease_before(self, key: str) -> Any:
        """``key``'s lease before its turn's finish is decided (None: none)."""
        st = self.plugin.ctl.book.get(key)
        return st.lease if st is not None else None

    def on_finish(
        self, key: str, action: str, outcome: HintOutcome, before: Any, leasable: bool
    ) -> None:
        """After a finished turn's residency was decided: a new lease settles when it
        ends, a release is applied, a retain that got no lease failed."""
        st = self.plugin.ctl.book.get(key)
        if st is not None and st.lease is not None and st.lease is not before:
            self.log.await_lease(key, outcome)
        elif action == "release":
            self.log.settle(outcome, "applied", "the trajectory's own blocks were released")
        elif action == "retain":
            if not leasable:
                why = "the request was aborted or failed"
            elif st is not None and st.closed:
                why = "the trajectory was finished or cancelled"
            elif st is not None and st.last_outcome in ("capped", "declined"):
                why = f"no lease: {st.last_outcome} by the retained cap or the lease policy"
            else:
                why = "no lease was granted"
            self.log.settle(outcome, "failed", why)

    def on_admitted(self, key: str) -> None:
        """A turn of ``key`` was admitted: a lease it took over settles as applied."""
        if key in self.log.awaiting:
            st = self.plugin.ctl.book.get(key)
            if st is not None and st.lease is None:
                self.log.lease_ended(key, st.last_outcome)

    def settle(self) -> None:
        """Settle the outcomes waiting on leases that have ended. A lease's end shows in
        the counters, so a step in which none ended costs a sum."""
        c = self.plugin.ctl.counters
        ended = (c.leases_reused + c.leases_expired + c.leases_released + c.leases_replaced
                 + c.leases_pressure_released + c.trajectories_evicted)  # fmt: skip
        if ended == self._leases_ended:
            return
        self._leases_ended = ended
        book = self.plugin.ctl.book
        for key in list(self.log.awaiting):
            st = book.get(key)
            if st is None or st.lease is None:
                self.log.lease_ended(key, st.last_outcome if st is not None else None)

    def reset(self, reason: str) -> None:
        """Every lease ended at once; the policy starts afresh (counters carry on)."""
        self.log.reset(reason)
        self._leases_ended = 0

    def get(self, salt: str | None, trajectory_id: str) -> list[dict[str, Any]]:
        """The recorded outcomes of ``trajectory_id`` in the scope of ``salt``."""
        self.settle()
        return self.log.get(self.plugin.scoper.key(salt, trajectory_id))
