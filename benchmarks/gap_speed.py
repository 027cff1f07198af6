"""Speed and memory of the gap model: observe, estimate, memory per class, flush.

Targets from the gap-learning issue: ``observe`` median <= 2 us, ``estimate`` <= 5 us,
memory per class <= 20 KB. Timings are per call, from batches of calls (the timer's own
cost is spread over the batch), reported as the median and p99 over batches.

    python benchmarks/gap_speed.py
"""

from __future__ import annotations

import gc
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agentkv import GapModel

BATCH = 200
BATCHES = 1000


def _per_call_us(fn: Callable[[int], None]) -> tuple[float, float, float]:
    """Median, p99 and mean of per-call microseconds, from BATCHES batches of BATCH calls."""
    per_call = []
    clock = time.perf_counter_ns
    for b in range(BATCHES):
        t0 = clock()
        for i in range(BATCH):
            fn(b * BATCH + i)
        per_call.append((clock() - t0) / BATCH / 1000.0)
    per_call.sort()
    return (
        statistics.median(per_call),
        per_call[int(len(per_call) * 0.99)],
        statistics.fmean(per_call),
    )


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096
    except OSError:  # pragma: no cover - not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _line(label: str, figures: tuple[float, float, float], target: str) -> str:
    med, p99, mean = figures
    return f"{label:52} median {med:6.3f} us   p99 {p99:6.3f} us   mean {mean:6.3f} us   ({target})"


def main() -> int:
    """Measure and print the figures."""
    rng = random.Random(0)
    gaps = [rng.lognormvariate(0.0, 1.5) for _ in range(BATCH * BATCHES)]
    classes = ["shell:pytest", "shell:git", "editor", "web:search", "think"]
    gc.collect()

    m = GapModel()
    print("gap model speed (Python", ".".join(map(str, __import__("sys").version_info[:3])) + ")")
    print(
        _line(
            "observe, one class (3 levels: class, parent, all)",
            _per_call_us(lambda i: m.observe("shell:pytest", gaps[i])),
            "target median <= 2 us",
        )
    )
    m2 = GapModel()
    print(
        _line(
            "observe, 5 classes round robin",
            _per_call_us(lambda i: m2.observe(classes[i % 5], gaps[i])),
            "target median <= 2 us",
        )
    )
    print(
        _line(
            "observe, explicit at=",
            _per_call_us(lambda i: m2.observe(classes[i % 5], gaps[i], at=1.8e9 + i)),
            "target median <= 2 us",
        )
    )
    print(
        _line(
            "estimate, unchanged class (cached)",
            _per_call_us(lambda i: m.estimate("shell:pytest")),
            "target <= 5 us",
        )
    )
    print(
        _line(
            "estimate, falls back to parent class (cached)",
            _per_call_us(lambda i: m.estimate("shell:unknown")),
            "target <= 5 us",
        )
    )
    # Right after an observe, estimate() reuses the class's quantiles until the new weight
    # exceeds 0.5% of the total; the worst case recomputes them (forced here).
    print(
        _line(
            "observe + estimate of the same class, per pair",
            _per_call_us(
                lambda i: (m.observe("shell:pytest", gaps[i]), m.estimate("shell:pytest"))
            ),
            "",
        )
    )
    entry = m._entries[("idle", "shell:pytest")]

    def recompute(i: int) -> None:
        m.observe("shell:pytest", gaps[i])
        entry.quantiles = None
        m.estimate("shell:pytest")

    print(
        _line(
            "observe + estimate that recomputes p50/p90/p99", _per_call_us(recompute), "worst case"
        )
    )

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "g.sqlite3"
        pm = GapModel(store=store, flush_every=256)
        print(
            _line(
                "observe with a store (batches include a flush each)",
                _per_call_us(lambda i: pm.observe(classes[i % 5], gaps[i])),
                "mean includes the flushes",
            )
        )
        t0 = time.perf_counter()
        flushes = 50
        for f in range(flushes):
            for i in range(256):
                pm._pending.append(("idle", classes[i % 5], gaps[i], 1.8e9 + f))
            pm.flush()
        print(
            f"{'flush of 256 samples (5 classes, 3 levels)':52} {((time.perf_counter() - t0) / flushes) * 1000:.2f} ms each"
        )
        rows = pm.store.read("default") if pm.store else []
        pm.close()
        print(
            f"{'stored sketch size per class and kind':52} max {max(len(r.sketch) for r in rows)} bytes"
        )

    # memory: many classes, each with a full sketch
    num_classes, per_class = 2000, 2000
    gc.collect()
    before = _rss_bytes()
    big = GapModel(max_classes=num_classes + 10)
    for c in range(num_classes):
        name = f"tool{c}"
        for i in range(per_class):
            big.observe(name, gaps[(c * 7919 + i) % len(gaps)], at=1.8e9)
        big.estimate(name)
    gc.collect()
    after = _rss_bytes()
    per = (after - before) / (num_classes)
    print(
        f"{'memory per tool class (one kind, ' + str(per_class) + ' samples)':52} "
        f"{per / 1024:.1f} KB  (RSS growth over {num_classes} classes; target <= 20 KB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
