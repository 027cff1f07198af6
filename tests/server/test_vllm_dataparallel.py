"""vLLM data parallel on the CPU build: one server with ``--data-parallel-size 2``.

A wrapped client reads ``data_parallel_size`` from the capabilities and pins each
trajectory to one engine rank (``X-data-parallel-rank``); the control route asks every
rank, so stats cover both engines, each trajectory is found on whichever rank holds it,
and lifecycle events reach the rank that holds their trajectory. About 100 s, most of it
the two engines starting.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.server_fixtures import SMALL_POOL, require_vllm

TRAJECTORIES = [f"dp-{i}" for i in range(6)]


def _run_trajectories(server: Any) -> None:
    import openai

    import agentkv
    from agentkv.client import _lifecycle

    channel = _lifecycle.LifecycleChannel(timeout_s=5.0)
    _lifecycle.set_channel(channel)
    raw = openai.OpenAI(base_url=server.openai_base_url, api_key="-", max_retries=0)
    try:
        client = agentkv.wrap_openai(raw, options=agentkv.ClientOptions(backend="vllm"))

        @agentkv.tool(tool_class="shell")
        def run() -> str:
            return "ok"

        for tid in TRAJECTORIES:
            with agentkv.trajectory(tid):
                for _ in range(2):
                    client.chat.completions.create(
                        model=server.model,
                        max_tokens=2,
                        messages=[{"role": "user", "content": f"{tid} hello " * 20}],
                    )
                    run()
        assert channel.flush(10)
    finally:
        raw.close()
        _lifecycle.reset_channel()


@pytest.mark.server
def test_data_parallel_pins_trajectories_and_control_route_sees_every_rank() -> None:
    import httpx

    import agentkv
    from agentkv.client._affinity import data_parallel_rank
    from agentkv.vllm._control import STATS_MAX_AGE_S

    require_vllm()
    extra = ["--data-parallel-size", "2"]
    with agentkv.serve(extra_args=extra, progress=None, timeout_s=600, **SMALL_POOL) as server:
        base = server.base_url + "/agentkv/v1"
        with httpx.Client(timeout=60) as http:
            assert http.get(base + "/capabilities").json()["data_parallel_size"] == 2
            _run_trajectories(server)
            expected = {tid: data_parallel_rank(tid, 2) for tid in TRAJECTORIES}
            assert set(expected.values()) == {0, 1}  # both ranks hold trajectories
            for tid, rank in expected.items():
                # Without a rank the route asks every engine and finds the holder.
                assert http.get(f"{base}/trajectories/{tid}").status_code == 200, tid
                # Asked rank by rank, only the pinned rank knows the trajectory.
                found = [
                    r
                    for r in (0, 1)
                    if http.get(
                        f"{base}/trajectories/{tid}", headers={"X-data-parallel-rank": str(r)}
                    ).status_code
                    == 200
                ]
                assert found == [rank], (tid, found)
            time.sleep(STATS_MAX_AGE_S + 0.1)  # a stats snapshot taken after the turns
            stats = http.get(base + "/stats").json()
    assert stats["data_parallel_size"] == 2 and stats["ranks_missing"] == 0
    per_rank = stats["per_rank"]
    assert [p["trajectories_tracked"] for p in per_rank] == [
        sum(1 for r in expected.values() if r == rank) for rank in (0, 1)
    ]
    assert stats["trajectories_tracked"] == len(TRAJECTORIES)
    assert stats["hints_received"] == 2 * len(TRAJECTORIES)
    assert all(p["events_received"] > 0 for p in per_rank)
    assert stats["events_unknown_trajectory"] == 0
