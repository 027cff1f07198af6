"""What the testbed itself costs, measured on each arm's own server before its replays.

A caching gain shows only against what a turn costs when nothing is recomputed, so every
report states the testbed's costs next to its JCTs. Right after a server starts, a few
calibration requests go through the bench's own client path (the wrapped openai client,
streamed token-id prompts, inside a trajectory):

- ``fixed_turn``: a short prompt that is already cached, one output token, one request
  at a time. Its time to first token is the fixed per-turn cost: client, HTTP, API
  server, the hop to the engine core and one engine step that computes a single token.
  vLLM's request histograms split it: ``engine`` is queue + first step (scheduled to
  first token), ``api_server`` the rest of the server's own TTFT (request set-up, the
  ZMQ hops, output processing), ``client`` what the client saw beyond that (building
  and sending the request, HTTP parsing before vLLM stamps the arrival, the first SSE
  chunk's way back).
- ``cached_long_turn``: the same at the workload's typical context (mean prompt): attention
  over a long cached context is not free on a CPU.
- ``prefill``: two uncached prompts of different lengths, the marginal rate being the
  difference of tokens over the difference of times; and the rate of new tokens appended
  to the cached workload-sized context, which is what a resumed turn computes.
- ``decode``: ``k`` output tokens on a short prompt at batch 1 (the floor) and on the
  workload-sized context at batch 1 and at the run's concurrency; a step is
  ``(e2e - ttft) / (k - 1)`` as the client sees it (vLLM's inter-token latency beside).
  Short-context figures understate an agent workload's costs: attention grows with the
  context.

CPU seconds and run-queue waits of the server's processes (API server, engine core,
worker) and of the bench's own process come from ``/proc`` (Linux; absent elsewhere):
a run-queue wait is time a thread was ready to run while the cores were busy, the direct
measure of CPU contention. The same figures are taken around every replay.

The ``compute_*`` and ``parse_*`` functions are pure, :class:`ProcessSampler` reads
``/proc``; the calibration requests are :func:`agentkv.bench.testbed._probe.measure_testbed`,
and the report's table of these figures is :mod:`agentkv.bench.report._testbedtable`.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "HISTOGRAMS",
    "ROLES",
    "CallTiming",
    "ProcessSampler",
    "classify_processes",
    "compute_decode_step_s",
    "compute_histogram_means",
    "compute_prefill_tokens_per_s",
    "compute_turn_split",
    "engine_decode_step_s",
    "load_average",
    "parse_proc_stat",
]

#: vLLM request histograms (seconds) whose means split a turn's time.
HISTOGRAMS = {
    "ttft_s": "vllm:time_to_first_token_seconds",
    "queue_s": "vllm:request_queue_time_seconds",
    "prefill_s": "vllm:request_prefill_time_seconds",
    "decode_s": "vllm:request_decode_time_seconds",
    "itl_s": "vllm:inter_token_latency_seconds",
    "e2e_s": "vllm:e2e_request_latency_seconds",
}

ROLES = ("client", "api_server", "engine_core", "worker")


# --- pure part ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CallTiming:
    """One calibration request as the client saw it."""

    ttft_s: float | None
    e2e_s: float
    output_tokens: int
    cached_tokens: int | None = None


def compute_histogram_means(
    before: Mapping[str, float], after: Mapping[str, float]
) -> dict[str, float | None]:
    """Mean of each :data:`HISTOGRAMS` entry over the requests between two scrapes."""
    out: dict[str, float | None] = {}
    for key, name in HISTOGRAMS.items():
        n = after.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)
        total = after.get(name + "_sum", 0.0) - before.get(name + "_sum", 0.0)
        out[key] = total / n if n > 0 else None
    return out


def compute_turn_split(
    client_ttft_s: float, server: Mapping[str, float | None]
) -> dict[str, float] | None:
    """Split a turn's TTFT into client, API server and engine shares (seconds).

    ``server`` holds histogram means (:func:`compute_histogram_means`); None when the
    server reported no TTFT. Shares are clamped at 0 (the clocks are separate).
    """
    ttft = server.get("ttft_s")
    if ttft is None:
        return None
    engine = (server.get("queue_s") or 0.0) + (server.get("prefill_s") or 0.0)
    return {
        "client_s": max(client_ttft_s - ttft, 0.0),
        "api_server_s": max(ttft - engine, 0.0),
        "engine_s": engine,
    }


def compute_prefill_tokens_per_s(
    short_tokens: int, short_ttft_s: float, long_tokens: int, long_ttft_s: float
) -> float | None:
    """Marginal prefill rate between two uncached prompts; None if not measurable."""
    dt = long_ttft_s - short_ttft_s
    dn = long_tokens - short_tokens
    if dn <= 0 or dt <= 0:
        return None
    return dn / dt


def engine_decode_step_s(
    server_itl_s: float | None, calls: Sequence[CallTiming]
) -> tuple[float | None, str | None]:
    """The decode step and where it came from: vLLM's inter-token latency over ``calls``
    (``"server"``, the engine's own step timestamps) when it reported one, else the
    client's :func:`compute_decode_step_s` (``"client"``).

    The server's figure comes first because the client's can miss the engine entirely:
    on a busy 2-core host the API server can fall behind an engine stepping every 2 ms,
    and then the first streamed chunk arrives with most of the answer, so
    ``e2e - ttft`` is about 0 (seen as 0.02 ms "steps" against a 2.4 ms server ITL).
    """
    if server_itl_s is not None and server_itl_s > 0:
        return server_itl_s, "server"
    client = compute_decode_step_s(calls)
    return client, None if client is None else "client"


def compute_decode_step_s(calls: Sequence[CallTiming]) -> float | None:
    """Median ``(e2e - ttft) / (k - 1)`` over calls with at least two output tokens."""
    steps = [
        (c.e2e_s - c.ttft_s) / (c.output_tokens - 1)
        for c in calls
        if c.ttft_s is not None and c.output_tokens > 1
    ]
    return statistics.median(steps) if steps else None


def parse_proc_stat(text: str) -> tuple[str, int, int]:
    """``(comm, ppid, utime + stime in clock ticks)`` from a ``/proc/PID/stat`` line."""
    left, _, rest = text.rpartition(")")
    comm = left.partition("(")[2]
    fields = rest.split()
    # fields[0] is the state (field 3); ppid is field 4, utime 14, stime 15.
    return comm, int(fields[1]), int(fields[11]) + int(fields[12])


def classify_processes(rows: Sequence[tuple[int, int, str]], root_pid: int) -> dict[str, int]:
    """Roles of a vLLM server's processes from ``(pid, ppid, comm)`` rows.

    The root is the API server; among its descendants, vLLM names the engine core
    ``VLLM::EngineCore`` and model workers ``VLLM::Worker`` (truncated to 15 characters
    by the kernel). Other descendants (resource trackers) have no role.
    """
    children: dict[int, list[tuple[int, str]]] = {}
    for pid, ppid, comm in rows:
        children.setdefault(ppid, []).append((pid, comm))
    out = {"api_server": root_pid}
    stack = [root_pid]
    while stack:
        for pid, comm in children.get(stack.pop(), []):
            stack.append(pid)
            if comm.startswith("VLLM::EngineCor"):
                out.setdefault("engine_core", pid)
            elif comm.startswith("VLLM::Worker"):
                out.setdefault("worker", pid)
    return out


# --- processes (Linux /proc) ----------------------------------------------------------
def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _runqueue_wait_s(pid: int) -> float:
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        text = _read(f"/proc/{pid}/task/{tid}/schedstat")
        if text:
            parts = text.split()
            if len(parts) >= 2 and parts[1].isdigit():
                total += int(parts[1])
    return total / 1e9


class ProcessSampler:
    """CPU seconds and run-queue waits of a server's processes and of this process."""

    def __init__(self, server_pid: int | None) -> None:
        self.pids: dict[str, int] = {}
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        if server_pid is not None and os.path.isdir("/proc"):
            rows: list[tuple[int, int, str]] = []
            for entry in os.listdir("/proc"):
                if entry.isdigit() and (text := _read(f"/proc/{entry}/stat")):
                    try:
                        comm, ppid, _ = parse_proc_stat(text)
                    except (IndexError, ValueError):
                        continue
                    rows.append((int(entry), ppid, comm))
            self.pids = classify_processes(rows, server_pid)
            self.pids["client"] = os.getpid()

    def sample(self) -> dict[str, tuple[float, float]] | None:
        """``{role: (cpu_s, runqueue_wait_s)}`` now; None where ``/proc`` is unavailable."""
        if not self.pids:
            return None
        out: dict[str, tuple[float, float]] = {}
        for role, pid in self.pids.items():
            text = _read(f"/proc/{pid}/stat")
            if text is None:
                continue
            try:
                ticks = parse_proc_stat(text)[2]
            except (IndexError, ValueError):
                continue
            out[role] = (ticks / self._tick, _runqueue_wait_s(pid))
        return out

    @staticmethod
    def delta(
        before: Mapping[str, tuple[float, float]] | None,
        after: Mapping[str, tuple[float, float]] | None,
        per: float = 1.0,
    ) -> dict[str, dict[str, float]] | None:
        """``{"cpu_s": {role: x}, "runqueue_wait_s": {role: y}}`` divided by ``per``."""
        if not before or not after:
            return None
        cpu: dict[str, float] = {}
        wait: dict[str, float] = {}
        for role in ROLES:
            if role in before and role in after:
                cpu[role] = (after[role][0] - before[role][0]) / per
                wait[role] = (after[role][1] - before[role][1]) / per
        return {"cpu_s": cpu, "runqueue_wait_s": wait}
