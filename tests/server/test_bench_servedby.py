"""The bench learns which replica served each call: replicas tag their answers.

The middleware alone is driven as an ASGI app; the end-to-end test runs two uvicorn
servers with the middleware behind the real vllm-router under round robin and sends
streamed completions through a wrapped OpenAI client, as the bench does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agentkv.bench.testbed._servedby import SERVED_BY_HEADER, ServedBy, replica_of
from tests.support.router_fakes import real_router


async def _answer(scope: Any, receive: Any, send: Any) -> None:
    """A tiny ASGI app: a two-chunk streamed completion (``[DONE]`` last)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "m",
             "choices": [{"index": 0, "text": "x", "finish_reason": None, "token_ids": [7]}]}  # fmt: skip
    for data in (json.dumps(chunk), "[DONE]"):
        await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(),
                    "more_body": True})  # fmt: skip
    await send({"type": "http.response.body", "body": b""})


def _drive(scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    asyncio.run(ServedBy(_answer)(scope, receive, send))
    return sent


def test_middleware_names_the_servers_port_and_passes_everything_else() -> None:
    sent = _drive({"type": "http", "server": ("127.0.0.1", 8123), "headers": []})
    start = sent[0]
    assert start["status"] == 200
    assert (SERVED_BY_HEADER.encode(), b"8123") in start["headers"]
    assert (b"content-type", b"text/event-stream") in start["headers"]  # kept
    assert [m["type"] for m in sent[1:]] == ["http.response.body"] * 3  # body untouched
    # No server address (a unix socket): nothing added, nothing broken.
    bare = _drive({"type": "http", "server": None, "headers": []})
    assert all(k != SERVED_BY_HEADER.encode() for k, _ in bare[0]["headers"])


def test_tags_map_back_to_replica_indexes() -> None:
    ports = [9000, 9001]
    assert replica_of("9001", ports) == 1 and replica_of(" 9000\n", ports) == 0
    assert replica_of(None, ports) is None and replica_of("", ports) is None
    assert replica_of("9002", ports) is None and replica_of("http://x", ports) is None


@pytest.fixture()
def tagged_replicas_behind_router() -> Iterator[tuple[str, list[int]]]:
    """Two uvicorn servers with the middleware, the real vllm-router (round robin) in front."""
    import uvicorn

    from agentkv.vllm._launch import find_free_port

    servers, ports = [], []
    for _ in range(2):
        port = find_free_port()
        config = uvicorn.Config(ServedBy(_answer), host="127.0.0.1", port=port, log_level="error")
        server = uvicorn.Server(config)
        threading.Thread(target=server.run, daemon=True).start()
        servers.append(server)
        ports.append(port)
    try:
        with real_router([f"http://127.0.0.1:{p}" for p in ports], "round_robin") as base:
            yield base, ports
    finally:
        for server in servers:
            server.should_exit = True


@pytest.mark.server
def test_streamed_calls_through_the_real_router_name_their_replica(
    tagged_replicas_behind_router: tuple[str, list[int]],
) -> None:
    """vllm-router forwards the replica's tag on streamed answers; the bench's own call
    (a wrapped AsyncOpenAI client) returns it, and round robin alternates the replicas."""
    from openai import AsyncOpenAI

    import agentkv
    from agentkv.bench.testbed._client import one_turn

    base, ports = tagged_replicas_behind_router

    async def calls() -> list[int | None]:
        raw = AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=10)
        client = agentkv.wrap_openai(raw, backend="generic")
        seen = []
        async with agentkv.trajectory():
            for _ in range(4):
                ids, _, _, served_by = await one_turn(client, "m", [1, 2, 3], 1)
                assert ids == [7]
                seen.append(replica_of(served_by, ports))
        await raw.close()
        return seen

    seen = asyncio.run(calls())
    assert None not in seen
    assert set(seen) == {0, 1}
    assert all(a != b for a, b in itertools.pairwise(seen))  # alternating
