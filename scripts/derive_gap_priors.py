"""Derive agentkv's per-tool-family gap priors from one trace and check them on another.

    python3 scripts/derive_gap_priors.py DERIVE_TRACE CHECK_TRACE [--write]

Idle gaps (``tool_gap_s``) of DERIVE_TRACE are grouped by tool family
(:func:`agentkv.gaps._priors.family_of`: generic words in the tool's name, nothing
fitted); a family with at least ``--min-samples`` gaps gets p50/p90/p99. The check
replays CHECK_TRACE's gaps in order through a cold :class:`agentkv.GapModel` with and
without those priors and scores each forecast made *before* its gap was learned (pinball
loss at q = 0.5 and 0.9, and how often the gap fell under the forecast p90), over the
cold phase (the first ``min_samples`` gaps of each class) and over everything.
``--write`` stores the priors, their provenance and the check in
``agentkv/gaps/data/gap_priors.json``. The two traces are evaluation data too: derive
from one, check on the other, and say which.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from agentkv.gaps._model import GapModel
from agentkv.gaps._priors import ClassPriors, family_of
from agentkv.traces import load_trace

OUT = Path(__file__).resolve().parent.parent / "agentkv" / "gaps" / "data" / "gap_priors.json"


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def derive(path: str, min_samples: int) -> dict[str, dict[str, float]]:
    """p50/p90/p99 of the idle gap per family with at least ``min_samples`` gaps."""
    by_family: dict[str, list[float]] = defaultdict(list)
    for tool, gap_s in load_trace(path).tool_gaps():
        family = family_of(tool)
        if family is not None and family != "finish":  # a finish has no next call to wait for
            by_family[family].append(max(0.0, gap_s))
    out: dict[str, dict[str, float]] = {}
    for family, gaps in sorted(by_family.items()):
        if len(gaps) < min_samples:
            continue
        floor = 0.001  # a prior needs positive quantiles
        p50, p90, p99 = (max(floor, _quantile(gaps, q)) for q in (0.5, 0.9, 0.99))
        out[family] = {
            "p50_s": round(p50, 4),
            "p90_s": round(max(p50, p90), 4),
            "p99_s": round(max(p50, p90, p99), 4),
            "n": len(gaps),
        }
    return out


def _pinball(y: float, pred: float, q: float) -> float:
    return max(q * (y - pred), (q - 1) * (y - pred))


def check(path: str, priors: ClassPriors | None, cold_n: int) -> dict[str, float]:
    """Score forecasts made before each gap of ``path`` is learned (cold model)."""
    model = GapModel(half_life_s=None, min_samples=cold_n, priors=priors)
    seen: dict[str, int] = defaultdict(int)
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for tool, gap_s in load_trace(path).tool_gaps():
        y = max(0.0, gap_s)
        est = model.estimate(tool)
        phase = "cold" if seen[tool] < cold_n else "warm"
        for key in (phase, "all"):
            s = sums[key]
            s[0] += _pinball(y, est.p50, 0.5)
            s[1] += _pinball(y, est.p90, 0.9)
            s[2] += 1.0 if y <= est.p90 else 0.0
            s[3] += 1
        seen[tool] += 1
        model.observe(tool, y, at=0.0)
    out: dict[str, float] = {}
    for key, (l50, l90, cov, n) in sums.items():
        out[f"{key}_n"] = int(n)
        out[f"{key}_pinball_p50"] = round(l50 / max(n, 1), 4)
        out[f"{key}_pinball_p90"] = round(l90 / max(n, 1), 4)
        out[f"{key}_p90_coverage"] = round(cov / max(n, 1), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("derive_trace")
    p.add_argument("check_trace")
    p.add_argument("--min-samples", type=int, default=30, help="gaps a family needs (30)")
    p.add_argument("--cold-n", type=int, default=20, help="the gap model's min_samples (20)")
    p.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(OUT.parents[3])}")
    args = p.parse_args(argv)
    families = derive(args.derive_trace, args.min_samples)
    priors = ClassPriors.from_json({"families": families})
    result = {
        "what": "idle gap after a tool call (model answer -> next call sent), seconds, by tool "
        "family (agentkv.gaps._priors.family_of); used until a class has its own samples",
        "derived_from": Path(args.derive_trace).name,
        "checked_on": Path(args.check_trace).name,
        "derived_by": "scripts/derive_gap_priors.py --min-samples "
        f"{args.min_samples} --cold-n {args.cold_n}",
        "license": "the traces are MIT (OpenHands project); these are aggregate quantiles",
        "check": {
            "with_priors": check(args.check_trace, priors, args.cold_n),
            "global_prior_only": check(args.check_trace, None, args.cold_n),
        },
        "families": families,
    }
    text = json.dumps(result, indent=2, sort_keys=False) + "\n"
    if args.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text, "utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
