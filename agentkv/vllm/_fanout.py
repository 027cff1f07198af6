"""One control-route operation over several engines, and one answer from several.

A vLLM server started with ``--data-parallel-size N`` runs N engine cores behind one API
server. vLLM's own ``call_utility_async`` reaches only the first of them (or, with its
internal load balancer, calls all and returns the first answer), so the control route
would see one rank's trajectories and counters. Here:

- :func:`engine_targets` lists the engines a utility call can be addressed to (empty
  when the server has one engine, or when vLLM's client lacks per-engine calls);
- :func:`call_engines` sends one operation to the rank a request names (the
  ``X-data-parallel-rank`` header, the same one vLLM uses to pin a request), or to every
  rank when it names none, and returns every answer;
- :func:`combine_answers` folds the answers into one: counters summed (see
  :func:`combine_stats`), a trajectory from the rank that knows it, events accepted by
  the rank that holds them.

:func:`combine_stats` is also how :class:`~agentkv.ReplicaSet` adds up its replicas.
The combining functions are pure.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DP_RANK_HEADER",
    "HISTOGRAMS",
    "NOT_ADDITIVE",
    "call_engines",
    "combine_answers",
    "combine_stats",
    "engine_targets",
    "parse_rank",
]

#: vLLM's request header that pins a request to one data-parallel engine.
DP_RANK_HEADER = "X-data-parallel-rank"

#: Stats that are not sums over parts: ratios and quantiles (combined separately).
NOT_ADDITIVE = frozenset({"kv_usage", "hint_lag_ms_p50", "return_lag_ms"})
#: Quantile stats combined as the largest part's (an upper bound).
_LARGEST = ("hint_lag_ms_p50", "return_lag_ms")
#: Cumulative histograms (``{"buckets": [[le, n], ...], "sum_s", "count"}``): summed.
HISTOGRAMS = ("hint_lag_seconds",)


def _numbers(stats: Mapping[str, Any]) -> dict[str, float | int]:
    return {
        k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def combine_stats(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Add up the ``/agentkv/v1/stats`` answers of several engines or replicas (pure).

    Every counter and additive gauge (``leases_*``, ``events_*``, ``num_blocks``,
    ``free_blocks``, ``num_waiting``, ``trajectories_tracked``, ...) is summed.
    ``kv_usage`` is the pool-weighted mean of the parts' (each part counts blocks held
    only by leases as free, and so does the mean). Medians cannot be added: the total's
    ``hint_lag_ms_p50`` and ``return_lag_ms`` are the largest part's, an upper bound.
    Histograms with the same buckets are summed. A part without numbers (an error
    answer) is skipped and counted in ``parts_missing``.
    """
    total: dict[str, Any] = {}
    usage_weighted = 0.0
    usage_blocks = 0.0
    largest: dict[str, float] = {}
    hists: dict[str, dict[str, Any]] = {}
    unreadable: set[str] = set()
    missing = 0
    for stats in parts:
        numbers = _numbers(stats)
        if not numbers:
            missing += 1
            continue
        for key, value in numbers.items():
            if key not in NOT_ADDITIVE:
                total[key] = total.get(key, 0) + value
        if "kv_usage" in numbers:
            weight = float(numbers.get("num_blocks", 1) or 1)
            usage_weighted += float(numbers["kv_usage"]) * weight
            usage_blocks += weight
        for key in _LARGEST:
            if key in numbers:
                largest[key] = max(largest.get(key, 0.0), float(numbers[key]))
        for key in HISTOGRAMS:
            if key in stats and key not in unreadable:
                merged = _add_histograms(hists.get(key), stats[key])
                if merged is None:  # another bucket layout: no total is honest
                    unreadable.add(key)
                    hists.pop(key, None)
                else:
                    hists[key] = merged
    if usage_blocks:
        total["kv_usage"] = usage_weighted / usage_blocks
    total.update(largest)
    total.update(hists)
    total["parts_reporting"] = len(parts) - missing
    total["parts_missing"] = missing
    return total


def _add_histograms(a: Any, b: Any) -> dict[str, Any] | None:
    """The sum of two cumulative histograms with the same buckets (None: unreadable)."""
    try:
        bb = [[str(le), int(n)] for le, n in b["buckets"]]
        if a is None:
            return {"buckets": bb, "sum_s": float(b["sum_s"]), "count": int(b["count"])}
        if [le for le, _ in a["buckets"]] != [le for le, _ in bb]:
            return None
        return {
            "buckets": [[le, n + m] for (le, n), (_, m) in zip(a["buckets"], bb, strict=True)],
            "sum_s": a["sum_s"] + float(b["sum_s"]),
            "count": a["count"] + int(b["count"]),
        }
    except (KeyError, TypeError, ValueError):
        return None


def _status(answer: Any) -> int:
    if isinstance(answer, dict) and "status" in answer:
        try:
            return int(answer["status"])
        except (TypeError, ValueError):
            return 500
    return 200


def combine_answers(op: str, answers: Sequence[Any]) -> Any:
    """One answer for ``op`` from the answers of several engines (pure).

    - ``stats``: :func:`combine_stats` plus ``data_parallel_size`` and the per-rank
      answers under ``per_rank``;
    - ``trajectory``: the answer of a rank that knows the trajectory (the one with the
      most live requests, then cached blocks, if several do), else the first 404;
    - ``events``: the answer of the rank that accepted the most (every rank validates
      alike; only the holder has anything to act on);
    - ``outcomes``: the answer of the rank with the most recorded turns;
    - ``capabilities``: the first rank's, with ``data_parallel_size``.

    An operation every rank failed returns the first failure.
    """
    if len(answers) == 1:
        return answers[0]
    ok = [a for a in answers if _status(a) == 200]
    if not ok:
        return answers[0]
    if op == "stats":
        out = combine_stats(ok)
        out.pop("parts_reporting", None)
        out["ranks_missing"] = out.pop("parts_missing") + len(answers) - len(ok)
        out["data_parallel_size"] = len(answers)
        out["per_rank"] = [dict(a) if isinstance(a, dict) else a for a in answers]
        return out
    if op == "trajectory":
        return max(
            ok,
            key=lambda a: (int(a.get("live_requests") or 0), int(a.get("cached_blocks") or 0)),
        )
    if op == "events":
        return max(ok, key=lambda a: int(a.get("accepted") or 0))
    if op == "outcomes":
        return max(ok, key=lambda a: len(a.get("turns") or ()))
    first = dict(ok[0])
    first["data_parallel_size"] = len(answers)
    return first


def parse_rank(value: str | None, size: int) -> int | None:
    """The rank a request names in ``X-data-parallel-rank``, or None (absent, not an
    integer, or out of range: then every rank is asked)."""
    if value is None:
        return None
    try:
        rank = int(value.strip())
    except ValueError:
        return None
    return rank if 0 <= rank < size else None


def engine_targets(core: Any) -> list[Any]:
    """The engines of a data-parallel server's client that a utility call can address.

    Empty for a single engine, or when the client has no per-engine call (then the
    client's own ``call_utility_async`` is the only way in).
    """
    engines = getattr(core, "core_engines", None)
    if not isinstance(engines, list) or len(engines) < 2:
        return []
    if not callable(getattr(core, "_call_utility_async", None)):
        return []
    return list(engines)


async def call_engines(
    core: Any, method: str, payload: str, *, rank_header: str | None, timeout_s: float
) -> list[Any]:
    """Call ``method(payload)`` on the engine ``rank_header`` names, or on every engine.

    Answers are decoded from JSON. One engine: vLLM's ``call_utility_async``. Several:
    vLLM's per-engine call, concurrently. A timeout raises ``TimeoutError``.
    """
    engines = engine_targets(core)
    if not engines:
        raw = await asyncio.wait_for(core.call_utility_async(method, payload), timeout=timeout_s)
        return [json.loads(raw)]
    rank = parse_rank(rank_header, len(engines))
    chosen = [engines[rank]] if rank is not None else engines
    calls = [core._call_utility_async(method, payload, engine=engine) for engine in chosen]
    raws = await asyncio.wait_for(asyncio.gather(*calls), timeout=timeout_s)
    return [json.loads(raw) for raw in raws]
