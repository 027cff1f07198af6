"""Per-replica figures of a run behind vllm-router: the results' ``replicas`` section of
each arm and the report's replica table.

Each repetition kept every replica's counter deltas (read from the replicas directly,
see :func:`agentkv.bench.testbed._scrape.read_counters`), the trajectory -> replica
placement the replicas' plugins knew, the replica that answered each call, and the
router's own counters; here they are summed over an arm's repetitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentkv.bench.report._simtable import fmt

__all__ = ["replica_lines", "summarize_replicas"]


def summarize_replicas(reps: Sequence[Any]) -> dict[str, Any] | None:
    """Per-replica figures of one arm's repetitions (router mode), or None.

    Per replica: prompt and cached prompt tokens, preemptions, lifecycle events received
    and those for a trajectory that replica never served (``events_unknown_trajectory``);
    the trajectories each replica held (from the plugin, where the arm runs it); the
    router's Program-scheduling counters (``vllm_router_*_total``; its gauges are left
    out), summed over repetitions.
    """
    if not any(r.per_replica for r in reps):
        return None
    n = max(len(r.per_replica) for r in reps)
    keys = {
        "prompt_tokens": ("vllm", "vllm:prompt_tokens_total"),
        "cached_tokens": ("vllm", "vllm:prompt_tokens_cached_total"),
        "preemptions": ("vllm", "vllm:num_preemptions_total"),
        "events_received": ("agentkv", "events_received"),
        "events_unknown_trajectory": ("agentkv", "events_unknown_trajectory"),
    }
    per: list[dict[str, float]] = [dict.fromkeys(keys, 0.0) for _ in range(n)]
    held = [0] * n
    for r in reps:
        for i, part in enumerate(r.per_replica):
            for name, (side, key) in keys.items():
                per[i][name] += float(part[side].get(key, 0.0))
        for replica in r.placement.values():
            held[replica] += 1
    router: dict[str, float] = {}
    for r in reps:
        for key, value in r.router.items():
            # only counters add up; a gauge's before/after difference (queue depth,
            # live sessions) means nothing and can be negative
            if key.endswith("_total"):
                router[key] = router.get(key, 0.0) + value
    first: dict[str, int] = next((r.placement for r in reps if r.placement), {})
    return {
        "per_replica": per,
        "trajectories_held": held if any(held) else None,
        # trajectory index (bench order) -> replica, from the first repetition that knew
        "placement_by_index": {tid.rsplit("-", 1)[-1]: i for tid, i in first.items()} or None,
        # per repetition: "<trajectory index>/<turn position>" -> the replica that served it
        "call_replicas_per_rep": [r.call_replicas for r in reps]
        if any(r.call_replicas for r in reps)
        else None,
        "events_received": sum(p["events_received"] for p in per),
        "events_unknown_trajectory": sum(p["events_unknown_trajectory"] for p in per),
        "router_counters": {k: v for k, v in router.items() if v},
    }


def replica_lines(results: dict[str, Any]) -> list[str]:
    """The report's "Replicas" section (empty for a run on one server per arm)."""
    setup = results.get("replicas")
    if not setup:
        return []
    lines = [
        "",
        f"## Replicas ({setup['replicas']} behind vllm-router, routing {setup['routing']})",
        "",
        "| arm | prompt tokens per replica | cached per replica | trajectories held "
        "| lifecycle events | to a replica not holding the trajectory |",
        "|---|---|---|---|---|---|",
    ]
    for name, arm in results["arms"].items():
        rep = arm.get("replicas") if "not_run" not in arm else None
        if not rep:
            continue
        per = rep["per_replica"]
        lines.append(
            f"| {name} | {' / '.join(fmt(p['prompt_tokens'], '.0f') for p in per)} "
            f"| {' / '.join(fmt(p['cached_tokens'], '.0f') for p in per)} "
            f"| {' / '.join(str(h) for h in rep['trajectories_held'] or []) or '–'} "
            f"| {fmt(rep['events_received'], '.0f')} | {fmt(rep['events_unknown_trajectory'], '.0f')} |"
        )
    return lines
