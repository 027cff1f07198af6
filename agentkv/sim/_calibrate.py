"""Fit the simulator's cost model and pool from an ``agentkv bench`` ``results.json``.

What a bench run gives, best first:

1. Per-call samples, ``arms.<ARM>.turn_samples``: a list of ``{prompt_tokens,
   cached_tokens, output_tokens, ttft_s, latency_s}``, one per model call. Prefill is
   fitted to ``ttft_s ~ n / prefill_tokens_per_s + attention_s_per_token2 * n *
   (c + n / 2)`` with ``n`` computed and ``c`` cached
   tokens, on the lower envelope of the samples (a TTFT also holds queueing, which the
   simulator models itself; see :func:`_fit_prefill`), and decode is the median of
   ``(latency_s - ttft_s) / (output_tokens - 1)``.
2. Only the aggregates every bench ``results.json`` has (``prefill_tokens``,
   ``ttft_p50_s`` per arm, ``manifest.trace.num_turns``): a coarse prefill rate
   (mean computed tokens per call over the median TTFT), no attention term, and the
   default decode time. :attr:`Calibration.method` says ``aggregates`` and
   :attr:`Calibration.notes` says what is missing.
3. Explicit figures (``prefill_tokens_per_s`` and ``decode_s_per_token``, optionally
   ``attention_s_per_token2``) in ``manifest.calibration``, a top-level
   ``calibration`` or an arm: taken as they are.

The block size and pool size come from ``manifest.pools[0]`` (``block_size``,
``pool_blocks``) when the bench recorded them, and the bench's workload (its scaling and
its arrivals) from ``manifest.scaling`` and ``manifest.arrival``, so that ``agentkv sim
--calibrate`` replays the same trajectories, turns and arrivals as the bench did.

A measured per-token decode time is the step time at the batch the bench ran: it
becomes the simulator's ``step_base_s`` (``decode_s_per_token`` 0). With per-call
samples, the fixed latency of a call (``overhead_s``: client, API server, contention) is
the TTFT left after prefill over calls that computed few tokens, at their 5th percentile:
under load most calls wait behind others' prefill, a wait the simulator models itself, so
the middle of those figures is queueing, not a fixed cost (with 12 trajectories in flight
on the tiny CPU testbed the median was 0.3-0.5 s where the testbed's own fixed-turn
measurement is 0.03 s).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError
from agentkv.sim._config import SimCost

__all__ = ["Calibration", "calibrate", "fit_calibration"]

_EXPLICIT = ("prefill_tokens_per_s", "decode_s_per_token")
MIN_FIT_TOKENS = 256  # calls computing fewer tokens are dominated by fixed latency
# The quantile taken as "a call that did not wait": under load most calls queue behind
# others, so the service time is the lower tail of what the calls saw, not their middle.
LOW_QUANTILE = 0.05
SAMPLE_KEYS = ("prompt_tokens", "cached_tokens", "output_tokens", "ttft_s", "latency_s")


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted cost model plus the pool the bench ran with (``None`` where unknown)."""

    cost: SimCost
    block_size: int | None = None
    pool_blocks: int | None = None
    method: str = "explicit"  # turn_samples | aggregates | explicit
    num_samples: int = 0
    arms: tuple[str, ...] = ()
    fit: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    scaling: dict[str, Any] | None = None  # the bench's Scaling, as recorded
    arrival: dict[str, Any] | None = None  # the bench's arrivals, as recorded

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (for the results manifest and the CLI)."""
        c = self.cost
        return {
            "method": self.method,
            "arms": list(self.arms),
            "num_samples": self.num_samples,
            "prefill_tokens_per_s": round(c.prefill_tokens_per_s, 3),
            "attention_s_per_token2": c.attention_s_per_token2,
            "overhead_s": round(c.overhead_s, 6),
            "decode_s_per_token": round(c.decode_s_per_token, 6),
            "step_base_s": round(c.step_base_s, 6),
            "block_size": self.block_size,
            "pool_blocks": self.pool_blocks,
            "fit": {k: round(v, 6) for k, v in self.fit.items()},
            "notes": list(self.notes),
        }


def _solve(rows: list[list[float]], ys: list[float]) -> list[float] | None:
    """Least squares by the normal equations (tiny systems); None when singular."""
    k = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(k)]
    for col in range(k):  # Gauss-Jordan with partial pivoting
        piv = max(range(col, k), key=lambda i: abs(a[i][col]))
        if abs(a[piv][col]) < 1e-300:
            return None
        a[col], a[piv] = a[piv], a[col]
        b[col], b[piv] = b[piv], b[col]
        for i in range(k):
            if i != col:
                f = a[i][col] / a[col][col]
                a[i] = [x - f * y for x, y in zip(a[i], a[col], strict=True)]
                b[i] -= f * b[col]
    return [b[i] / a[i][i] for i in range(k)]


def _fit_prefill(samples: list[dict[str, Any]]) -> tuple[SimCost, dict[str, float], list[str]]:
    """Service time, not queueing: the simulator models the queue itself.

    A TTFT holds the call's own prefill plus any wait behind other calls, so the rate
    comes from the lower envelope: start from the :data:`LOW_QUANTILE` of ``ttft_s / n`` over
    calls that computed at least :data:`MIN_FIT_TOKENS` tokens, then fit rate and
    attention term (least squares through the origin) on the calls within 10% of the
    envelope, a few times over; the attention term is kept only with a positive sign.
    """
    notes: list[str] = []
    pts = []
    for s in samples:
        n = max(0, int(s["prompt_tokens"]) - int(s["cached_tokens"] or 0))
        if n > 0 and s["ttft_s"] is not None:
            pts.append((n, int(s["cached_tokens"] or 0), float(s["ttft_s"])))
    big = [p for p in pts if p[0] >= MIN_FIT_TOKENS] or pts
    if len(big) < 3:
        raise ConfigError(f"only {len(big)} usable turn samples (need 3 with ttft_s)")
    s_per_token = _quantile([t / n for n, _, t in big], LOW_QUANTILE)
    attn, near = 0.0, big
    for _ in range(4):  # refit on the calls within 10% of the current envelope
        near = [
            (n, c, t) for n, c, t in big if t <= 1.1 * (s_per_token * n + attn * n * (c + n / 2))
        ]
        coef = _solve([[n, n * (c + n / 2)] for n, c, _ in near], [t for _, _, t in near])
        if len(near) < 3 or coef is None or coef[0] <= 0 or coef[1] < 0:
            break
        s_per_token, attn = coef
    if attn == 0.0:
        notes.append("attention term not identifiable from these samples: fitted without it")
    cost = SimCost(prefill_tokens_per_s=1.0 / s_per_token, attention_s_per_token2=attn)
    ys = [t for _, _, t in pts]
    err = [t - cost.prefill_s(n, c) for n, c, t in pts]
    fit = {
        "num_prefill_samples": float(len(big)),
        "num_envelope_samples": float(len(near)),
        "ttft_median_excess_s": _quantile(err, 0.5),  # queueing and fixed latency
        "ttft_median_s": _quantile(ys, 0.5),
    }
    return cost, fit, notes


def _measured(prefill: SimCost, decode_latency_s: float, overhead_s: float = 0.0) -> SimCost:
    """A cost model from measured figures: a step costs the measured decode latency."""
    return SimCost(
        prefill_tokens_per_s=prefill.prefill_tokens_per_s,
        attention_s_per_token2=prefill.attention_s_per_token2,
        decode_s_per_token=0.0,
        step_base_s=decode_latency_s,
        overhead_s=overhead_s,
    )


def _fit_overhead(samples: list[dict[str, Any]], cost: SimCost) -> float | None:
    """TTFT beyond prefill over calls that computed few tokens, at :data:`LOW_QUANTILE`
    (the fixed latency of a call that did not wait)."""
    small = [
        float(s["ttft_s"]) - cost.prefill_s(n, int(s["cached_tokens"] or 0))
        for s in samples
        if s.get("ttft_s") is not None
        and 0 < (n := int(s["prompt_tokens"]) - int(s["cached_tokens"] or 0)) < MIN_FIT_TOKENS
    ]
    return max(0.0, _quantile(small, LOW_QUANTILE)) if len(small) >= 3 else None


def _quantile(values: list[float], q: float) -> float:
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _fit_decode(samples: list[dict[str, Any]]) -> float | None:
    per = [
        (float(s["latency_s"]) - float(s["ttft_s"])) / (int(s["output_tokens"]) - 1)
        for s in samples
        if s.get("latency_s") is not None
        and s.get("ttft_s") is not None
        and int(s["output_tokens"]) > 1
    ]
    return statistics.median(per) if per else None


def _load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read benchmark results {p}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: not an `agentkv bench` results.json (expected an object)")
    return data


def _recorded(data: dict[str, Any]) -> Calibration:
    """What the bench recorded besides costs: its pool, its scaling and its arrivals."""
    manifest = data.get("manifest") or {}
    pools = manifest.get("pools") or []
    pool = pools[0] if pools and isinstance(pools[0], dict) else {}
    scaling = manifest.get("scaling")
    arrival = manifest.get("arrival")
    return Calibration(
        SimCost(),
        int(pool["block_size"]) if "block_size" in pool else None,
        int(pool["pool_blocks"]) if "pool_blocks" in pool else None,
        scaling=scaling if isinstance(scaling, dict) else None,
        arrival=arrival if isinstance(arrival, dict) else None,
    )


def _from_samples(base: Calibration, chosen: dict[str, Any], samples: list[Any]) -> Calibration:
    cost, fit, notes = _fit_prefill(samples)
    decode = _fit_decode(samples)
    if decode is None:
        notes.append("no sample with 2+ output tokens: default decode step kept")
        decode = SimCost().step_s(1, [])
    overhead = _fit_overhead(samples, cost)
    if overhead is None:
        notes.append("fewer than 3 calls computed few tokens: no fixed latency fitted")
    return replace(
        base,
        cost=_measured(cost, decode, overhead or 0.0),
        method="turn_samples",
        num_samples=len(samples),
        arms=tuple(a for a, v in chosen.items() if v.get("turn_samples")),
        fit=fit,
        notes=tuple(notes),
    )


def fit_calibration(path: str | Path, *, arm: str | None = None) -> Calibration:
    """Fit a :class:`Calibration` from a bench ``results.json`` (see the module docstring).

    ``arm`` limits the fit to one arm's samples; by default every run arm's samples are
    used (prefill and decode speed are the server's, whatever the arm).
    """
    data = _load(path)
    manifest = data.get("manifest") or {}
    arms: dict[str, Any] = {
        k: v for k, v in (data.get("arms") or {}).items() if isinstance(v, dict)
    }
    if arm is not None and arm not in arms:
        raise ConfigError(f"{path}: no arm {arm!r}; arms there: {', '.join(arms) or 'none'}")
    chosen = {arm: arms[arm]} if arm is not None else arms
    base = _recorded(data)
    explicit = [manifest.get("calibration") or {}, data.get("calibration") or {}]
    for c in [*chosen.values(), *explicit]:
        if isinstance(c, dict) and all(k in c for k in _EXPLICIT):
            prefill = SimCost(
                prefill_tokens_per_s=float(c["prefill_tokens_per_s"]),
                attention_s_per_token2=float(c.get("attention_s_per_token2", 0.0)),
            )
            cost = _measured(prefill, float(c["decode_s_per_token"]))
            return replace(base, cost=cost, method="explicit", arms=tuple(chosen))

    samples = [s for a in chosen.values() for s in a.get("turn_samples") or []]
    bad = [k for k in SAMPLE_KEYS if samples and k not in samples[0]]
    if bad:
        raise ConfigError(f"{path}: turn_samples lack {', '.join(bad)}")
    if samples:
        return _from_samples(base, chosen, samples)

    num_turns = (manifest.get("trace") or {}).get("num_turns")
    rates = []
    for name, a in chosen.items():
        if a.get("prefill_tokens") and a.get("ttft_p50_s") and num_turns:
            rates.append((name, a["prefill_tokens"] / num_turns / a["ttft_p50_s"]))
    if rates:
        coarse = (
            "coarse: no per-call samples (arms.<ARM>.turn_samples); prefill rate = mean "
            "computed tokens per call / median TTFT, no attention term, default decode time",
        )
        return replace(
            base,
            cost=SimCost(prefill_tokens_per_s=statistics.median(r for _, r in rates)),
            method="aggregates",
            arms=tuple(n for n, _ in rates),
            notes=coarse,
        )
    raise ConfigError(
        f"{path}: found no calibration: it needs arms.<ARM>.turn_samples (per-call "
        f"{', '.join(SAMPLE_KEYS)}), or an arm's prefill_tokens and ttft_p50_s with "
        "manifest.trace.num_turns, or prefill_tokens_per_s and decode_s_per_token in "
        "manifest.calibration; or pass --prefill-tokens-per-s and --decode-s-per-token"
    )


def calibrate(path: str | Path, *, arm: str | None = None) -> SimCost:
    """The cost model of :func:`fit_calibration` (for callers that need only that)."""
    return fit_calibration(path, arm=arm).cost
