"""Call by call: where a simulated arm's prefix reuse departs from the real one.

A bench arm records, per repetition, every completed call's cached prompt tokens, its
eligible shared prefix, when it was sent and how long it took (``calls_per_rep``:
``"<trajectory index>/<turn position>" -> [cached, eligible, sent_s, latency_s]``, times
in seconds since the replay started). The simulator check replays the same calls and knows what each
one found in its simulated cache. :func:`call_diff` sets the two side by side, grouped
by what usually explains a difference:

- ``first_turn``: turn 0, whose only reusable prefix is the shared system prompt;
- ``same_replica`` / ``other_replica`` (behind a router, when the run recorded every
  call's replica): the trajectory's previous call went to the same replica, or not;
  on one server every later turn is ``same_replica``.

Per group: calls, eligible tokens, real and simulated reuse (cached over eligible), and
how many calls the simulator served at least half of their prefix where the real server
did not (``sim_only``), or the other way round (``real_only``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["call_diff", "real_calls"]

GROUPS = ("first_turn", "same_replica", "other_replica")


def real_calls(trajectories: Sequence[Any]) -> dict[str, list[Any]]:
    """``"<trajectory index>/<turn position>" -> [cached, eligible, sent_s, latency_s]``
    for every completed call of one replay that reported usage."""
    out: dict[str, list[Any]] = {}
    for traj in trajectories:
        for position, turn in enumerate(traj.turns):
            if turn.ok and turn.cached_tokens is not None:
                sent = None if turn.sent_s is None else round(turn.sent_s, 4)
                out[f"{traj.traj_idx}/{position}"] = [
                    min(turn.cached_tokens, turn.eligible_prefix_tokens),
                    turn.eligible_prefix_tokens,
                    sent,
                    round(turn.latency_s, 4),
                ]
    return out


def _group(key: str, replicas: Mapping[str, int] | None) -> str:
    traj, _, turn = key.partition("/")
    position = int(turn)
    if position == 0:
        return "first_turn"
    if not replicas:
        return "same_replica"
    here, before = replicas.get(key), replicas.get(f"{traj}/{position - 1}")
    if here is None or before is None:
        return "same_replica" if here is None and before is None else "other_replica"
    return "same_replica" if here == before else "other_replica"


def call_diff(
    real_per_rep: Sequence[Mapping[str, Sequence[Any]]],
    sim_per_rep: Sequence[Mapping[tuple[str, int], tuple[int, int]]],
    replicas_per_rep: Sequence[Mapping[str, int]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Real against simulated reuse per group, summed over repetitions.

    ``sim_per_rep``: each repetition's simulated calls, ``(trajectory id "t<i>", turn) ->
    (replica, cached tokens)`` (:attr:`agentkv.sim.RunStats.calls`). A repetition with
    no simulated run of its own (the arm was simulated once) is compared with the first.
    """
    sums = {
        g: {"calls": 0, "eligible": 0, "real": 0, "sim": 0, "sim_only": 0, "real_only": 0}
        for g in GROUPS
    }
    for i, real in enumerate(real_per_rep):
        if not sim_per_rep:
            break
        sim = sim_per_rep[min(i, len(sim_per_rep) - 1)]
        routes = replicas_per_rep[i] if replicas_per_rep and i < len(replicas_per_rep) else None
        for key, call in real.items():
            cached, eligible = call[0], call[1]
            traj, _, turn = key.partition("/")
            got = sim.get((f"t{int(traj)}", int(turn)))
            if got is None or eligible <= 0:
                continue
            sim_cached = min(got[1], eligible)
            row = sums[_group(key, routes)]
            row["calls"] += 1
            row["eligible"] += eligible
            row["real"] += cached
            row["sim"] += sim_cached
            half = eligible / 2
            row["sim_only"] += sim_cached >= half > cached
            row["real_only"] += cached >= half > sim_cached
    out: dict[str, dict[str, Any]] = {}
    for name, row in sums.items():
        if not row["calls"]:
            continue
        out[name] = {
            "calls": row["calls"],
            "eligible_tokens": row["eligible"],
            "real_reuse": row["real"] / row["eligible"],
            "sim_reuse": row["sim"] / row["eligible"],
            "sim_only": row["sim_only"],
            "real_only": row["real_only"],
        }
    return out
