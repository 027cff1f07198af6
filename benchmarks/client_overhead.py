"""Added latency of a wrapped OpenAI call vs a bare one, default set-up (target: <= 0.2 ms).

The default set-up is what a user gets from ``agentkv.wrap_openai(OpenAI(base_url=...))``
against an agentkv-served vLLM, in a fresh process:

- a local HTTP server in a process of its own that answers like one (the capability
  probe at ``/agentkv/v1/capabilities``, ``/agentkv/v1/stats`` for the load tracker,
  ``POST /agentkv/v1/events`` for the lifecycle channel, ``/finish_session`` answered 404
  like vLLM, and chat completions with ``usage.prompt_tokens_details``);
- ``backend="auto"`` (the probe picks the vLLM adapter with its control route) and the
  lifecycle channel on, as by default;
- calls inside one trajectory, wrapped and bare alternated so both see the same noise;
  the figure is the median of the paired differences (wrapped minus bare), in ms.

Also printed, because they do not move with the machine's load: agentkv's own work per
call (the call flow alone) and the Python function calls a wrapped request adds.

The process's gap learner persists to a temporary ``AGENTKV_HOME`` (removed at the end),
seeded with :data:`SEED_GAPS` idle gaps of this loop's size: what a user's persisted store
gives a new process. Usage: ``python benchmarks/client_overhead.py [--calls N]``; on a
shared machine run it under ``flock /work/server.lock``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import statistics
import tempfile
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
CAPABILITIES = json.dumps(
    {
        "protocol_version": "agentkv/1",
        "agentkv_version": "bench",
        "vllm_version": "0.32.0",
        "platform": "cpu",
        "block_size": 128,
        "num_blocks": 4096,
        "features": {
            "retain": True,
            "release": True,
            "pressure_override": True,
            "priority": False,
            "offload": False,
            "prefetch": False,
            "tenant_scope": "cache_salt",
            "hint_forms": ["envelope", "xargs"],
        },
        "unavailable": {},
        "limits": {"max_ttl_ms": 600_000, "max_events_per_batch": 256},
    }
).encode()
STATS = json.dumps({"kv_usage": 0.1, "num_waiting": 0}).encode()
MESSAGES = [{"role": "user", "content": "hello"}]
SEED_GAPS = 20_000


class Handler(BaseHTTPRequestHandler):
    """Answers like an agentkv-served vLLM (bodies read, not interpreted)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/agentkv/v1/capabilities":
            self._send(200, CAPABILITIES)
        elif path == "/agentkv/v1/stats":
            self._send(200, STATS)
        elif path == "/version":
            self._send(200, b'{"version":"0.32.0"}')
        else:
            self._send(404, b'{"error":"not found"}')

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?", 1)[0]
        if path.endswith("/chat/completions"):
            self._send(200, ANSWER)
        elif path == "/agentkv/v1/events":
            n = len(json.loads(body).get("events", []))
            self._send(200, json.dumps({"accepted": n, "rejected": []}).encode())
        else:
            self._send(404, b'{"error":"not found"}')


def _serve_forever(port_out: Any) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put(httpd.server_address[1])
    httpd.serve_forever()


def measure(
    bare: openai.OpenAI, wrapped: openai.OpenAI, calls: int
) -> tuple[list[float], list[float]]:
    """``calls`` pairs (bare, then wrapped) inside one trajectory, after a warm-up."""
    t_bare: list[float] = []
    t_wrap: list[float] = []
    with agentkv.trajectory("bench"):
        for _ in range(20):  # warm-up: the probe, connections, imports, caches
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
    # The mean too: work done once in N calls (a memo refreshed) shows there, not in medians.
    print(
        f"{name}: bare median {mb:.3f} ms, wrapped median {mw:.3f} ms, "
        f"added (median of paired differences) {statistics.median(diffs):+.3f} ms, "
        f"mean {statistics.fmean(diffs):+.3f} ms, n={len(diffs)}"
    )


def report_default(calls: int) -> None:
    """The default set-up: the server in its own process, probed, lifecycle on."""
    queue: Any = multiprocessing.Queue()
    proc = multiprocessing.Process(target=_serve_forever, args=(queue,), daemon=True)
    proc.start()
    try:
        url = f"http://127.0.0.1:{queue.get(timeout=30)}/v1"
        bare = openai.OpenAI(base_url=url, api_key="k")
        wrapped = agentkv.wrap_openai(openai.OpenAI(base_url=url, api_key="k"))
        report(
            "default set-up (vLLM-like server in its own process)", *measure(bare, wrapped, calls)
        )
        agentkv.flush()  # the trajectory's end reaches the server before it stops
        bare.close()
        wrapped.close()
    finally:
        proc.terminate()
        proc.join(5)


def report_agentkv_only(calls: int) -> None:
    """agentkv's own work per call (the flow: hints built, options merged, turn recorded)."""
    from openai._models import FinalRequestOptions
    from openai.types.chat import ChatCompletion

    from agentkv.client._flow import Send, call_flow
    from agentkv.client._state import ClientState
    from agentkv.client.backends import ProbeResult, VLLMAdapter

    answer = ChatCompletion.model_validate_json(ANSWER)
    state = ClientState(object(), agentkv.ClientOptions(backend="vllm", lifecycle=False))
    caps = json.loads(CAPABILITIES)
    state.take_probe(ProbeResult(VLLMAdapter(control_url=None, capabilities=caps)))
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
        f"mean {statistics.fmean(times):.3f} ms, n={len(times)}"
    )


def mock_client() -> openai.OpenAI:
    import httpx2

    def handler(request: Any) -> Any:
        if request.url.path.endswith("/capabilities"):
            return httpx2.Response(200, content=CAPABILITIES)
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
    wrapped = agentkv.wrap_openai(
        mock_client(), backend="vllm", lifecycle=False, probe_timeout_s=0.05
    )
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
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--only-default", action="store_true", help="skip the load-free figures")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="agentkv-overhead-")
    os.environ["AGENTKV_HOME"] = home  # read when the learner is made (seed_learner)
    try:
        seed_learner()
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        report_default(args.calls)
        print(f"load average {os.getloadavg()[0]:.2f}")
        if not args.only_default:
            report_agentkv_only(args.calls)
            report_function_calls()
        s = agentkv.stats()
        print(f"turn records: {s.num_turns}, advice sent: {s.advice_sent}")
    finally:
        from agentkv.events._pipeline import current_gap_model

        learner = current_gap_model()
        if learner is not None:
            learner.close()  # its last flush, before the directory goes
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
