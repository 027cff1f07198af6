"""Added latency of a wrapped OpenAI call vs a bare one (target: <= 0.2 ms median).

Measurements, alternating wrapped and bare calls so both see the same noise:

1. against a local HTTP server on 127.0.0.1 in a process of its own (a real socket round
   trip; the server's parsing of the extra headers runs elsewhere, as with vLLM);
2. the same server in a thread of this process (the old set-up: the server's parsing
   competes for this process's GIL and shows up as client overhead);
3. in-process through an httpx2 ``MockTransport`` (no network: agentkv's own cost shows);
4. agentkv's call flow alone, and the Python function calls a wrapped request adds
   (deterministic: it does not move with the machine's load).

The wrapped client runs inside a trajectory with ``backend="vllm"`` (every hint field,
the envelope, a turn record); the lifecycle channel is off so only the request path is
timed. Usage: ``python benchmarks/client_overhead.py [--calls N]``.

The process's gap learner persists to a temporary ``AGENTKV_HOME`` (removed at the end),
so the run leaves the user's gap store alone. That store starts seeded with
:data:`SEED_GAPS` idle gaps of this loop's size (bare call times measured first): what a
user's persisted store gives a new process. A cold learner instead refreshes its
quantiles, and so decides its advice afresh, every call or two for its first few hundred
samples.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai

import agentkv

ANSWER = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 1,
            "total_tokens": 11,
            "prompt_tokens_details": {"cached_tokens": 8},
        },
    }
).encode()
MESSAGES = [{"role": "user", "content": "hello"}]
SEED_GAPS = 20_000


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)


def measure(
    bare: openai.OpenAI, wrapped: openai.OpenAI, calls: int
) -> tuple[list[float], list[float]]:
    t_bare: list[float] = []
    t_wrap: list[float] = []
    with agentkv.trajectory("bench"):
        for _ in range(20):  # warm-up: connections, imports, caches
            bare.chat.completions.create(model="m", messages=MESSAGES)
            wrapped.chat.completions.create(model="m", messages=MESSAGES)
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            bare.chat.completions.create(model="m", messages=MESSAGES)
            t1 = time.perf_counter_ns()
            wrapped.chat.completions.create(model="m", messages=MESSAGES)
            t2 = time.perf_counter_ns()
            t_bare.append((t1 - t0) / 1e6)
            t_wrap.append((t2 - t1) / 1e6)
    return t_bare, t_wrap


def report(name: str, t_bare: list[float], t_wrap: list[float]) -> None:
    mb, mw = statistics.median(t_bare), statistics.median(t_wrap)
    diffs = [w - b for b, w in zip(t_bare, t_wrap, strict=True)]
    paired = statistics.median(diffs)
    # The mean too: work done once in N calls (a memo refreshed) shows there, not in medians.
    mean = statistics.fmean(diffs)
    print(
        f"{name}: bare median {mb:.3f} ms, wrapped median {mw:.3f} ms, "
        f"added {mw - mb:+.3f} ms (median of paired differences {paired:+.3f} ms, "
        f"mean {mean:+.3f} ms), n={len(t_bare)}"
    )


def report_agentkv_only(calls: int) -> None:
    """agentkv's own work per call (the flow: hints built, options merged, turn recorded)."""
    from openai._models import FinalRequestOptions
    from openai.types.chat import ChatCompletion

    from agentkv.client._flow import Send, call_flow
    from agentkv.client._state import ClientState
    from agentkv.client.backends import VLLMAdapter

    answer = ChatCompletion.model_validate_json(ANSWER)
    state = ClientState(object(), agentkv.ClientOptions(backend="vllm", lifecycle=False))
    from agentkv.client.backends import ProbeResult

    state.take_probe(ProbeResult(VLLMAdapter()))
    options = FinalRequestOptions.construct(
        method="post", url="/chat/completions", json_data={"model": "m", "messages": MESSAGES}
    )
    times: list[float] = []
    with agentkv.trajectory("bench-core") as traj:
        for i in range(calls + 100):
            t0 = time.perf_counter_ns()
            flow = call_flow(state, "chat", options, False, None, traj)
            step = next(flow)
            assert isinstance(step, Send)
            with contextlib.suppress(StopIteration):
                flow.send(answer)
            if i >= 100:
                times.append((time.perf_counter_ns() - t0) / 1e6)
    print(
        f"agentkv work alone (hints + turn record): median {statistics.median(times):.3f} ms, "
        f"mean {statistics.fmean(times):.3f} ms, p90 {sorted(times)[int(0.9 * len(times))]:.3f} ms, "
        f"n={len(times)}"
    )


def _serve_forever(port_out: Any) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put(httpd.server_address[1])
    httpd.serve_forever()


def report_http(calls: int, *, in_process: bool) -> None:
    """Against a local HTTP server, in a thread of this process or in a process of its own.

    In a thread, the server's own work (parsing agentkv's extra headers and a larger body)
    runs under this process's GIL and is counted as the client's; a real server is
    another process.
    """
    import multiprocessing

    proc = None
    if in_process:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        port = httpd.server_address[1]
    else:
        queue: Any = multiprocessing.Queue()
        proc = multiprocessing.Process(target=_serve_forever, args=(queue,), daemon=True)
        proc.start()
        port = queue.get(timeout=30)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        bare = openai.OpenAI(base_url=url, api_key="k")
        wrapped = agentkv.wrap_openai(
            openai.OpenAI(base_url=url, api_key="k"),
            backend="vllm",
            lifecycle=False,
            probe_timeout_s=0.5,
        )
        where = "a thread of this process" if in_process else "its own process"
        report(f"local HTTP server in {where}", *measure(bare, wrapped, calls))
        bare.close()
        wrapped.close()
    finally:
        if proc is not None:
            proc.terminate()
        else:
            httpd.shutdown()


def mock_client() -> openai.OpenAI:
    import httpx2

    def handler(request: Any) -> Any:
        return httpx2.Response(200, content=ANSWER, headers={"Content-Type": "application/json"})

    return openai.OpenAI(
        base_url="http://127.0.0.1:9/v1",
        api_key="k",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


def report_function_calls(calls: int = 200) -> None:
    """Python function calls per request, bare and wrapped (deterministic, load-free)."""
    import cProfile
    import pstats

    def count(client: openai.OpenAI) -> float:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            client.chat.completions.create(model="m", messages=MESSAGES)
        profile.disable()
        return pstats.Stats(profile).total_calls / calls  # type: ignore[attr-defined,no-any-return]

    bare = mock_client()
    wrapped = agentkv.wrap_openai(mock_client(), backend="vllm", lifecycle=False)
    with agentkv.trajectory("bench-calls"):
        for _ in range(20):
            bare.chat.completions.create(model="m", messages=MESSAGES)
            wrapped.chat.completions.create(model="m", messages=MESSAGES)
        b, w = count(bare), count(wrapped)
    print(f"function calls per request: bare {b:.0f}, wrapped {w:.0f}, added {w - b:.0f}")


def seed_learner(samples: int = SEED_GAPS) -> None:
    """Give the process's gap learner ``samples`` idle gaps of this loop's size, stored."""
    from agentkv.events._pipeline import ensure_gap_model

    bare = mock_client()
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        bare.chat.completions.create(model="m", messages=MESSAGES)
        times.append(time.perf_counter() - t0)
    model = ensure_gap_model()
    if model is None:  # learning is off (AGENTKV_LEARN_GAPS=0)
        return
    now = time.time()
    for i in range(samples):
        model.observe("*", times[i % len(times)], at=now)
    model.flush()  # stored before timing starts: no flush of the seed during a run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="agentkv-overhead-")
    os.environ["AGENTKV_HOME"] = home  # read when the learner is made (seed_learner)
    try:
        seed_learner()
        run(args.calls)
    finally:
        from agentkv.events._pipeline import current_gap_model

        learner = current_gap_model()
        if learner is not None:
            learner.close()  # its last flush, before the directory goes
        shutil.rmtree(home, ignore_errors=True)


def run(calls: int) -> None:
    """Every measurement, ``calls`` pairs each."""
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    report_http(calls, in_process=False)
    report_http(calls, in_process=True)
    bare = mock_client()
    wrapped = agentkv.wrap_openai(
        mock_client(), backend="vllm", lifecycle=False, probe_timeout_s=0.2
    )
    report("in-process mock transport", *measure(bare, wrapped, calls))
    report_agentkv_only(calls)
    report_function_calls()
    s = agentkv.stats()
    print(f"turn records: {s.num_turns}, advice sent: {s.advice_sent}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
