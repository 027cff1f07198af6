"""Every path through the OpenAI client carries hints and leaves a turn record.

The wrapper hooks the client's single request method, so ``parse``, ``stream()``,
``with_raw_response`` and ``with_streaming_response`` (sync and async) behave like
``create``; :func:`agentkv.unwrap_openai` removes it. A real local HTTP server
(:class:`tests.support.client_fakes.FakeServer`) answers.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel

import agentkv
from agentkv.client import _accounting, _lifecycle
from agentkv.client._lifecycle import LifecycleChannel
from tests.support.client_fakes import FakeServer

MESSAGES = [{"role": "user", "content": "hi"}]


class Answer(BaseModel):
    answer: str


@pytest.fixture(autouse=True)
def _fresh_channel() -> Iterator[None]:
    _lifecycle.set_channel(LifecycleChannel(timeout_s=0.3, max_attempts=1))
    yield
    _lifecycle.reset_channel()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer("agentkv")
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def client(server: FakeServer) -> Iterator[openai.OpenAI]:
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    yield agentkv.wrap_openai(raw)
    raw.close()


def hinted(req: dict[str, Any], trajectory_id: str) -> bool:
    body = req["body"] or {}
    return (body.get("vllm_xargs") or {}).get("agentkv_trajectoryId") == trajectory_id


def test_parse_carries_hints_and_records_usage(client: openai.OpenAI, server: FakeServer) -> None:
    with agentkv.trajectory("t-parse"):
        out = client.chat.completions.parse(model="m", messages=MESSAGES, response_format=Answer)
    assert out.choices[0].message.parsed == Answer(answer="ok")
    [req] = server.model_requests()
    assert hinted(req, "t-parse") and req["body"]["response_format"]["type"] == "json_schema"
    [rec] = _accounting.get_records("t-parse")
    assert (rec.cached_tokens, rec.prompt_tokens, rec.response_id) == (64, 100, "chatcmpl-1")
    assert rec.finish_reasons == ("stop",)


def test_raw_and_streaming_responses_of_parse_and_streams(
    client: openai.OpenAI, server: FakeServer
) -> None:
    with agentkv.trajectory("t-raw"):
        raw = client.chat.completions.with_raw_response.parse(
            model="m", messages=MESSAGES, response_format=Answer
        )
        assert raw.parse().choices[0].message.parsed == Answer(answer="ok")
        raw_stream = client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in raw_stream.parse() if c.choices)
            == "ok"
        )
        with client.chat.completions.with_streaming_response.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        ) as response:
            assert sum(1 for _ in response.parse()) == 3
        with client.chat.completions.with_streaming_response.create(
            model="m", messages=MESSAGES
        ) as response:
            assert response.parse().choices[0].message.content == "ok"
    assert all(hinted(r, "t-raw") for r in server.model_requests())
    recs = _accounting.get_records("t-raw")
    assert [(r.turn_id, r.streamed, r.cached_tokens) for r in recs] == [
        (0, False, 64),
        (1, True, 96),
        (2, True, 96),
        (3, False, 64),
    ]
    assert all(r.outcome == "ok" for r in recs)
    assert recs[1].ttft_ms is not None and recs[2].ttft_ms is not None


def test_stream_helper_and_early_close(client: openai.OpenAI, server: FakeServer) -> None:
    with agentkv.trajectory("t-stream"):
        with client.chat.completions.stream(
            model="m", messages=MESSAGES, stream_options={"include_usage": True}
        ) as stream:
            final = stream.get_final_completion()
        assert final.choices[0].message.content == "ok"
        early = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        next(iter(early))
        early.close()
    first, second = _accounting.get_records("t-stream")
    assert first.streamed and first.cached_tokens == 96 and first.outcome == "ok"
    assert second.outcome == "incomplete"
    assert all(hinted(r, "t-stream") for r in server.model_requests())


async def test_async_parse_raw_and_streams_never_leave_a_coroutine(server: FakeServer) -> None:
    raw = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    client = agentkv.wrap_openai(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" fails the test
        async with agentkv.trajectory("t-async"):
            parsed = await client.chat.completions.parse(
                model="m", messages=MESSAGES, response_format=Answer
            )
            assert parsed.choices[0].message.parsed == Answer(answer="ok")
            resp = await client.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES
            )
            assert resp.parse().choices[0].message.content == "ok"
            async with client.chat.completions.with_streaming_response.create(
                model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
            ) as response:
                async for _ in await response.parse():
                    pass
            await client.responses.create(model="m", input="hi")
    await raw.close()
    recs = _accounting.get_records("t-async")
    assert [(r.api, r.cached_tokens) for r in recs] == [
        ("chat", 64),
        ("chat", 64),
        ("chat", 96),
        ("responses", 48),
    ]
    assert all(hinted(r, "t-async") for r in server.model_requests())


def test_unwrap_removes_the_hook_and_other_endpoints_pass(server: FakeServer) -> None:
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    client = agentkv.wrap_openai(raw)
    assert agentkv.unwrap_openai(client) is raw
    with agentkv.trajectory("t-unwrapped"):
        client.chat.completions.create(model="m", messages=MESSAGES)
    [req] = server.model_requests()
    assert "vllm_xargs" not in req["body"] and _accounting.get_records() == []
    assert agentkv.unwrap_openai(raw) is raw  # not wrapped: unchanged
    agentkv.wrap_openai(raw)  # wrapping again works
    with agentkv.trajectory("t-again"):
        raw.chat.completions.create(model="m", messages=MESSAGES)
    assert hinted(server.model_requests()[-1], "t-again")
    raw.close()


@pytest.mark.parametrize("caller_extra", [None, {}, {"vllm_xargs": {"mine": 1}, "top_k": 3}])
def test_fields_in_the_body_or_in_extra_json_send_the_same_request(
    caller_extra: dict[str, Any] | None,
) -> None:
    """Without the caller's ``extra_body`` agentkv's fields go straight into the body;
    the SDK builds the same request bytes as through its ``extra_json`` merge."""
    from openai._models import FinalRequestOptions

    from agentkv.client._flow import with_fields
    from agentkv.client.backends._request import merge_fields

    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    fields = {"session_id": "t", "vllm_xargs": {"agentkv_trajectoryId": "t", "agentkv_turnId": 2}}
    headers = {"X-Session-ID": "t"}

    def options() -> Any:
        return FinalRequestOptions.construct(
            method="post",
            url="/chat/completions",
            json_data={"model": "m", "messages": [], "vllm_xargs": {"x": 0}},
            extra_json=caller_extra,
        )

    ours = with_fields(options(), (caller_extra, None), fields, headers, frozenset())
    reference = options()
    reference.extra_json = merge_fields(reference.json_data, caller_extra, fields)
    reference.headers = headers
    sent, expected = client._build_request(ours), client._build_request(reference)
    assert sent.content == expected.content
    assert list(sent.headers.items()) == list(expected.headers.items())
    assert (ours.extra_json is None) == (caller_extra is None)  # no SDK merge needed
