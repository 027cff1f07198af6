"""``agentkv gaps``: show the learned gap quantiles; ``agentkv gaps learn``: seed them.

``agentkv gaps [--namespace NS] [--kind idle|tool|next|all] [--json]`` prints one row per
tool class level: n, p50, p90, p99, EWMA and the last update. ``agentkv gaps learn
TRACE.jsonl`` learns the gaps of a recorded trace (the agentkv trace format) into the
local store so that a harness starts from recorded runs instead of the prior.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from agentkv.gaps._model import GAP_KINDS, GapEstimate, GapModel

if TYPE_CHECKING:
    from agentkv.traces import Trace

__all__ = ["add_arguments", "format_table", "learn_trace", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``gaps`` options and its ``learn`` sub-command."""
    parser.add_argument(
        "--namespace", default="default", help="application namespace (default: default)"
    )
    parser.add_argument(
        "--store",
        metavar="PATH",
        default=None,
        help="gap store file (default: gaps.sqlite3 under AGENTKV_HOME or ~/.cache/agentkv)",
    )
    parser.add_argument(
        "--kind",
        choices=(*GAP_KINDS, "all"),
        default="all",
        help="idle: model call done -> next call (KV idle); tool: tool duration",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub = parser.add_subparsers(dest="gaps_command", metavar="{learn}")
    learn = sub.add_parser(
        "learn",
        help="learn gaps from a trace file (agentkv trace format)",
        description="Learn idle gaps (tool_gap_s) and tool durations (tool_exec_s) per "
        "tool_name from a trace file into the local gap store.",
    )
    learn.add_argument("trace", metavar="TRACE.jsonl", help="trace file to learn from")
    learn.add_argument("--namespace", default=argparse.SUPPRESS, help="application namespace")
    learn.add_argument("--store", metavar="PATH", default=argparse.SUPPRESS, help="store file")
    learn.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the learned gaps as JSON instead of a table",
    )


def learn_trace(model: GapModel, trace: Trace, *, at: float | None = None) -> dict[str, int]:
    """Learn every gap of ``trace`` into ``model``; return sample counts per ``kind:class``.

    ``tool_gap_s`` teaches the ``"idle"`` kind and ``tool_exec_s`` (when present) the
    ``"tool"`` kind, keyed by ``tool_name``; ``tool_gap_s`` also teaches the ``"next"``
    kind, keyed by the previous turn's ``tool_name`` (``*`` on a trajectory's first
    turn). Traces carry no wall-clock time, so every sample is observed at ``at``
    (default now): all of the same age.
    """
    t = time.time() if at is None else at
    counts: dict[str, int] = {}

    def learn(kind: str, tool_class: str, value: float) -> None:
        model.observe(tool_class, value, at=t, kind=kind)
        key = f"{kind}:{tool_class}"
        counts[key] = counts.get(key, 0) + 1

    for traj in trace.trajectories:
        before = "*"  # the tool the turn's call followed
        for turn in traj.turns:
            if turn.tool_name is None:
                before = "*"
                continue
            if turn.tool_gap_s is not None:
                learn("idle", turn.tool_name, turn.tool_gap_s)
                learn("next", before, turn.tool_gap_s)
            if turn.tool_exec_s is not None:
                learn("tool", turn.tool_name, turn.tool_exec_s)
            before = turn.tool_name
    return counts


def _rows(model: GapModel, kinds: tuple[str, ...]) -> list[tuple[str, str, GapEstimate]]:
    rows = []
    for kind in kinds:
        for level in model.tool_classes(kind):
            rows.append((kind, level, model.estimate(level, kind=kind, fallback=False)))
    return rows


def _seconds(value: float) -> str:
    if value != value:  # NaN
        return "-"
    if value < 1.0:
        return f"{value * 1000:.0f} ms" if value >= 0.0095 else f"{value * 1000:.2f} ms"
    if value < 120.0:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"


def _when(at_s: float | None) -> str:
    if at_s is None or at_s <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at_s))


def format_table(rows: list[tuple[str, str, GapEstimate]]) -> str:
    """Render ``(kind, tool_class, estimate)`` rows as an aligned text table."""
    head = ("kind", "tool class", "n", "p50", "p90", "p99", "ewma", "last update")
    body = [
        (
            kind,
            "* (all tools)" if level == "*" else level,
            str(est.n),
            _seconds(est.p50),
            _seconds(est.p90),
            _seconds(est.p99),
            _seconds(est.ewma),
            _when(est.updated_at_s),
        )
        for kind, level, est in rows
    ]
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    right = {2, 3, 4, 5, 6}

    def line(cells: tuple[str, ...]) -> str:
        out = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(head), line(tuple("-" * w for w in widths)), *map(line, body)])


def _as_json(rows: list[tuple[str, str, GapEstimate]], namespace: str) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "classes": [
            {
                "kind": kind,
                "tool_class": level,
                "n": est.n,
                "p50_s": est.p50,
                "p90_s": est.p90,
                "p99_s": est.p99,
                "ewma_s": est.ewma,
                "updated_at_s": est.updated_at_s,
            }
            for kind, level, est in rows
        ],
    }


def run(args: argparse.Namespace) -> int:
    """Run ``agentkv gaps`` / ``agentkv gaps learn``; return the exit status."""
    from agentkv._errors import TraceFormatError
    from agentkv.gaps._store import GapStore

    try:
        store = GapStore(args.store)
    except Exception as exc:
        print(f"agentkv gaps: cannot open the gap store: {exc}", file=sys.stderr)
        return 1
    model = GapModel(store=store, namespace=args.namespace)
    try:
        if getattr(args, "gaps_command", None) == "learn":
            from agentkv.traces import load_trace

            try:
                trace = load_trace(args.trace)
            except TraceFormatError as exc:
                print(f"agentkv gaps learn: {exc}", file=sys.stderr)
                return 2
            counts = learn_trace(model, trace)
            if not model.flush():
                print("agentkv gaps learn: the gap store could not be written", file=sys.stderr)
                return 1
            if not args.json:
                idle = sum(v for k, v in counts.items() if k.startswith("idle:"))
                tool = sum(v for k, v in counts.items() if k.startswith("tool:"))
                print(
                    f"learned {idle} idle gaps and {tool} tool durations from {args.trace} "
                    f"into namespace {args.namespace!r} ({store.path})\n"
                )
        kinds = GAP_KINDS if args.kind == "all" else (args.kind,)
        rows = _rows(model, kinds)
        if args.json:
            print(json.dumps(_as_json(rows, args.namespace), indent=2))
        elif rows:
            print(format_table(rows))
        else:
            print(
                f"no gaps learned yet in namespace {args.namespace!r} ({store.path}); run an "
                "instrumented harness, or seed with: agentkv gaps learn TRACE.jsonl"
            )
        return 0
    finally:
        model.close()
