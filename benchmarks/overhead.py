"""Per-call overhead of @agentkv.tool, printed as figures (not a test).

Measures, in one process, nanoseconds per call of: a bare function; the same function
under @agentkv.tool inside a trajectory with no sink (gap learning off, then on); with a
MemorySink; with a JsonlSink; and one OpenTelemetry SDK span for scale.

    python benchmarks/overhead.py [--calls N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import agentkv


def measure(fn: Callable[[], object], calls: int, batch: int = 100) -> tuple[float, float]:
    """Median and p99 of per-call nanoseconds, timed in batches to beat clock resolution."""
    for _ in range(batch * 5):
        fn()
    samples = []
    for _ in range(calls // batch):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter_ns() - t0) / batch)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()

    def bare(x: int = 1) -> int:
        return x

    tooled = agentkv.tool(tool_class="bench")(bare)
    rows: list[tuple[str, float, float]] = []
    rows.append(("bare function", *measure(bare, args.calls)))
    rows.append(("@tool outside a trajectory", *measure(tooled, args.calls)))

    agentkv.configure(sinks=[], learn_gaps=False)
    with agentkv.trajectory("bench"):
        rows.append(("@tool in trajectory, no sink", *measure(tooled, args.calls)))
    agentkv.configure(learn_gaps=True)
    with agentkv.trajectory("bench"):
        rows.append(("@tool, no sink, gap learning on", *measure(tooled, args.calls)))
    agentkv.configure(learn_gaps=False)

    memory = agentkv.MemorySink(max_events=10_000)
    agentkv.configure(sinks=[memory])
    with agentkv.trajectory("bench"):
        rows.append(("@tool + MemorySink", *measure(tooled, args.calls)))

    with tempfile.TemporaryDirectory() as tmp:
        jsonl = agentkv.JsonlSink(Path(tmp) / "events.jsonl", max_queue=1_000_000)
        agentkv.configure(sinks=[jsonl])
        with agentkv.trajectory("bench"):
            rows.append(("@tool + JsonlSink (enqueue)", *measure(tooled, args.calls // 4)))
        jsonl.close()
        dropped = jsonl.dropped
    agentkv.configure(sinks=[])

    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("bench")

    def one_span() -> None:
        with tracer.start_as_current_span("execute_tool bench"):
            bare()

    rows.append(("one OpenTelemetry SDK span", *measure(one_span, args.calls // 4)))

    base = rows[0][1]
    print(f"{'case':36} {'median ns':>10} {'p99 ns':>10} {'added ns':>10}")
    for name, med, p99 in rows:
        print(f"{name:36} {med:10.0f} {p99:10.0f} {med - base:10.0f}")
    print(f"JsonlSink dropped {dropped} events (queue bound 1,000,000)")
    print("targets: <= 2000 ns added with no sink; <= 5000 ns with MemorySink or JsonlSink")


if __name__ == "__main__":
    main()
