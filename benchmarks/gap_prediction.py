"""How well do learned gap quantiles predict future gaps? (real traces, train / test split)

For each shared trace: trajectories in file order are taken as time order and laid end
to end on a clock. The gap model learns the KV idle gaps (``tool_gap_s``, keyed by
``tool_name``) of the first half, then predicts the second half. Per tool class:

- coverage of the predicted p90: the fraction of future gaps at or below it (0.90 is
  right; lower means the tail is under-predicted, KV released too early);
- pinball loss at q=0.9 (seconds; lower is better), the proper score for a p90.

Three predictors: the gap model (per-class decayed sketch with fallback), EWMA only
(the class's EWMA used as the prediction), and global only (one sketch for all tools).
A second table scores them online: each future gap is predicted, then learned.

    python benchmarks/gap_prediction.py [TRACE.jsonl ...]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from agentkv import GapModel
from agentkv.gaps._model import ALL_TOOLS
from agentkv.traces import load_trace

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
DEFAULT_TRACES = [
    TRACE_DIR / "openhands_swebv_claude35.jsonl",
    TRACE_DIR / "openhands_v1_sdk_conversations.jsonl",
]
Q = 0.9
START_S = 1_800_000_000.0


def _samples(path: Path) -> list[list[tuple[str, float, float]]]:
    """Per trajectory, ``(tool_name, gap_s, at_s)`` with trajectories laid end to end."""
    trace = load_trace(path)
    out = []
    clock = START_S
    for traj in trace.trajectories:
        rows = []
        for turn in traj.turns:
            if turn.tool_name is not None and turn.tool_gap_s is not None:
                rows.append((turn.tool_name, turn.tool_gap_s, clock + turn.arrival_s))
        last = traj.turns[-1]
        clock += last.arrival_s + (last.tool_gap_s or 0.0) + 1.0
        out.append(rows)
    return out


def pinball(y: float, pred: float, q: float = Q) -> float:
    """The pinball (quantile) loss of predicting ``pred`` for the ``q`` quantile of ``y``."""
    d = y - pred
    return q * d if d >= 0 else (q - 1.0) * d


class _Ewma:
    """EWMA-only baseline: one EWMA per class, the same alpha as the gap model."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.values: dict[str, float] = {}

    def observe(self, cls: str, y: float) -> None:
        for key in (cls, ALL_TOOLS):
            prev = self.values.get(key)
            self.values[key] = y if prev is None else prev + self.alpha * (y - prev)

    def predict(self, cls: str) -> float:
        return self.values.get(cls, self.values.get(ALL_TOOLS, 0.0))


Predictors = dict[str, Callable[[str], float]]


def _score(
    test: list[tuple[str, float, float]], predict: Predictors
) -> dict[str, dict[str, list[float]]]:
    """Per class and predictor: [covered count, pinball sum, n]."""
    stats: dict[str, dict[str, list[float]]] = defaultdict(
        lambda: {k: [0.0, 0.0, 0.0] for k in predict}
    )
    for cls, y, _ in test:
        for name, fn in predict.items():
            p = fn(cls)
            for key in (cls, "all classes"):
                s = stats[key][name]
                s[0] += y <= p
                s[1] += pinball(y, p)
                s[2] += 1
    return stats


def evaluate(path: Path) -> tuple[list[str], list[str]]:
    """Return the static and online table lines for one trace."""
    trajs = _samples(path)
    half = len(trajs) // 2
    train = [s for t in trajs[:half] for s in t]
    test = [s for t in trajs[half:] for s in t]
    model, ewma, pooled = GapModel(), _Ewma(), GapModel()
    n_train: dict[str, int] = defaultdict(int)
    for cls, y, at in train:
        model.observe(cls, y, at=at)
        ewma.observe(cls, y)
        pooled.observe(ALL_TOOLS, y, at=at)
        n_train[cls] += 1
    predictors: Predictors = {
        "gap model": lambda c: model.quantile(c, Q),
        "ewma only": ewma.predict,
        "global only": lambda c: pooled.quantile(ALL_TOOLS, Q),
    }
    static = _score(test, predictors)
    # online: predict each future gap, then learn it
    online_stats: dict[str, list[float]] = {k: [0.0, 0.0, 0.0] for k in predictors}
    for cls, y, at in test:
        for name, fn in predictors.items():
            p = fn(cls)
            s = online_stats[name]
            s[0] += y <= p
            s[1] += pinball(y, p)
            s[2] += 1
        model.observe(cls, y, at=at)
        ewma.observe(cls, y)
        pooled.observe(ALL_TOOLS, y, at=at)
    name = path.name
    lines = []
    for cls in sorted(static, key=lambda c: (c == "all classes", -static[c]["gap model"][2])):
        row = static[cls]
        n_test = int(row["gap model"][2])
        cov = " ".join(f"{row[k][0] / row[k][2]:6.3f}" for k in predictors)
        loss = " ".join(f"{row[k][1] / row[k][2]:7.3f}" for k in predictors)
        ntr = sum(n_train.values()) if cls == "all classes" else n_train.get(cls, 0)
        lines.append(f"{name[:36]:36} {cls[:20]:20} {ntr:6d} {n_test:6d}   {cov}   {loss}")
    on = " ".join(f"{online_stats[k][0] / online_stats[k][2]:6.3f}" for k in predictors)
    on_loss = " ".join(f"{online_stats[k][1] / online_stats[k][2]:7.3f}" for k in predictors)
    online = [f"{name[:36]:36} {'all classes':20} {len(test):13d}   {on}   {on_loss}"]
    return lines, online


def main(argv: list[str]) -> int:
    """Print the prediction tables for the given traces (default: the shared ones)."""
    paths = [Path(a) for a in argv] or DEFAULT_TRACES
    head = (
        f"{'trace':36} {'tool class':20} {'train':>6} {'test':>6}   "
        f"{'coverage of predicted p90':^20}   {'pinball loss q=0.9 (s)':^23}\n"
        f"{'':36} {'':20} {'':6} {'':6}   {'gap':>6} {'ewma':>6} {'global':>6}   "
        f"{'gap':>7} {'ewma':>7} {'global':>7}"
    )
    static_lines, online_lines = [], []
    for p in paths:
        s, o = evaluate(p)
        static_lines += s
        online_lines += o
    print("KV idle gap prediction: train on the first half of trajectories, predict the second")
    print(head)
    print("\n".join(static_lines))
    print("\nonline (predict each future gap, then learn it):")
    print(head.replace("tool class", "          ").replace(" train   test", "         test"))
    print("\n".join(online_lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
