"""Record your own agent runs, turn them into a trace, and replay them with ``agentkv bench``.

How the tool calls are decided: **by a scripted plan in the harness** (each run alternates
``search`` and ``test_run`` tools with different waits). The model calls are real
requests to ``agentkv serve``.

Steps:

1. run instrumented trajectories; agentkv keeps a :class:`agentkv.TurnRecord` per model
   call (prompt and output tokens, start time, latency) and the events give each tool's
   class and the idle gap before the next call;
2. write them in the agentkv trace format (``agentkv.traces.dump_trace``): no prompt
   text, only token counts and timings;
3. replay them: ``agentkv sim`` here (seconds, no server), and the ``agentkv bench``
   command that replays them against real servers arm by arm — run it before you
   promote a policy change (pass ``--bench`` to run a one-repetition version now). Run::

    python examples/replay_own_runs.py [--out DIR] [--bench]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _server import endpoint
from openai import OpenAI

import agentkv
from agentkv.client._accounting import get_records
from agentkv.testing import capture_events
from agentkv.traces import TraceTrajectory, TraceTurn, dump_trace, load_trace

SYSTEM = "You are a careful coding agent working in a large repository. " * 8
PLAN = [("search", 0.05), ("test_run", 0.3), ("search", 0.05), (None, 0.0)]


def run_once(client: OpenAI, model: str, name: str) -> None:
    """One scripted trajectory with real model calls and timed tool waits."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": name}]
    with agentkv.trajectory(name):
        for tool_class, wait_s in PLAN:
            reply = client.chat.completions.create(
                model=model, messages=messages, max_tokens=6, temperature=0
            )
            messages.append(
                {"role": "assistant", "content": reply.choices[0].message.content or ""}
            )
            if tool_class is None:
                break
            with agentkv.tool_call(tool_class):
                time.sleep(wait_s)
            messages.append({"role": "user", "content": f"{tool_class} output " * 20})


def to_trace(names: list[str], events: list[agentkv.TrajectoryEvent]) -> list[TraceTrajectory]:
    """Turn records + events into trace trajectories (token counts and timings only)."""
    trajs = []
    for idx, name in enumerate(names):
        records = get_records(name)
        tools = {
            e.turn_id: e.tool_class
            for e in events
            if e.trajectory_id == name and e.event == "tool_started"
        }
        t0 = records[0].started_at_ms
        turns = []
        for i, rec in enumerate(records):
            nxt = records[i + 1] if i + 1 < len(records) else None
            gap_s = (nxt.started_at_ms - rec.started_at_ms - rec.latency_ms) / 1000 if nxt else None
            prev = records[i - 1] if i else None
            shared = min(prev.prompt_tokens or 0, rec.prompt_tokens or 0) if prev else 0
            turns.append(
                TraceTurn(
                    arrival_s=(rec.started_at_ms - t0) / 1000,
                    prompt_tokens=rec.prompt_tokens,
                    output_tokens=rec.completion_tokens,
                    shared_prefix_tokens=shared,
                    tool_name=tools.get(rec.turn_id) if nxt else None,
                    tool_gap_s=max(gap_s, 0.0) if gap_s is not None else None,
                )
            )
        trajs.append(TraceTrajectory(traj_idx=idx, turns=tuple(turns)))
    return trajs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory for the trace (default: a temp dir)")
    parser.add_argument("--bench", action="store_true", help="also run a short agentkv bench")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="agentkv-own-runs-"))
    out.mkdir(parents=True, exist_ok=True)
    names = [f"own-run-{i}" for i in range(3)]
    with endpoint() as server:
        client = agentkv.wrap_openai(OpenAI(base_url=server.openai_base_url, api_key="-"))
        with capture_events() as events:
            for name in names:
                run_once(client, server.model, name)
        client.close()
    path = out / "own_runs.jsonl"
    dump_trace(to_trace(names, events), path)
    trace = load_trace(path)
    print(f"wrote {path}: {len(trace.trajectories)} trajectories, {trace.num_turns} turns")
    sim = [
        sys.executable,
        "-m",
        "agentkv",
        "sim",
        "--trace",
        str(path),
        "--block-size",
        "32",
        "--out",
        str(out / "sim"),
    ]
    print("$", " ".join(sim[2:]))
    subprocess.run(sim, check=True)
    bench = [
        "agentkv",
        "bench",
        "--trace",
        str(path),
        "--arms",
        "B,E",
        "--reps",
        "1",
        "--out",
        str(out / "bench"),
    ]
    print("replay against real servers before promoting a change:\n$", " ".join(bench))
    if args.bench:
        subprocess.run([sys.executable, "-m", *bench], check=True)


if __name__ == "__main__":
    main()
