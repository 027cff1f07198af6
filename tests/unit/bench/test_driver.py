"""The replay driver's request on the wire, against a canned server (no vLLM needed)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.bench_fakes import canned_completions


async def test_driver_sends_token_ids_as_the_prompt_on_the_wire() -> None:
    """The prompt rides in extra_body (no per-token client transform) and arrives as
    the request's ``prompt``; the answer's ids and the usage come back as before."""
    from openai import AsyncOpenAI

    import agentkv
    from agentkv.bench.testbed._client import STREAM_INTERVAL, one_turn

    seen: list[dict[str, Any]] = []
    http = httpx.AsyncClient(transport=canned_completions(seen, served_by="8123"))
    client = agentkv.wrap_openai(
        AsyncOpenAI(base_url="http://stub/v1", api_key="x", http_client=http, max_retries=0),
        backend="generic",
    )
    prompt = list(range(20, 1020))
    async with agentkv.trajectory():
        ids, cached, ttft, served_by = await one_turn(client, "m", prompt, 3)
    await http.aclose()
    assert seen[0]["prompt"] == prompt
    assert seen[0]["max_tokens"] == 3 and seen[0]["return_token_ids"] is True
    assert seen[0]["stream_interval"] == STREAM_INTERVAL > 1
    assert ids == [17, 17, 17] and cached == 0 and ttft is not None
    assert served_by == "8123"  # the replica tag survives the wrapped streaming call
