"""Hosted OpenAI retention: the caller's own retention field stands alone.

The real ``openai`` SDK against the local fake (``tests.support.client_fakes``), with an
advisor that retains across a 20-minute gap (beyond the in-memory prompt cache), so
agentkv would add the model's longer-retention field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import agentkv
from agentkv.advice._advisor import Advisor, TrajectoryState
from tests.support.client_fakes import FakeServer

MESSAGES = [{"role": "user", "content": "hi"}]


class _Gap(Advisor):
    """Always retains, predicting a gap of ``p50_ms`` (p90 ``p90_ms``)."""

    def __init__(self, p50_ms: float, p90_ms: float | None = None) -> None:
        super().__init__()
        self.p50_ms, self.p90_ms = p50_ms, p90_ms

    def advise(self, state: TrajectoryState, *, load: Any = None) -> agentkv.CacheAdvice:
        return agentkv.CacheAdvice(
            trajectory_id=state.trajectory_id,
            action="retain",
            ttl_ms=600_000,
            reason="short_tool_gap",
            policy_version="test",
            predicted_gap_ms=self.p50_ms,
            predicted_gap_p90_ms=self.p90_ms,
        )


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer("agentkv")
    yield s
    s.close()


def _bodies(server: FakeServer, **create: Any) -> dict[str, Any]:
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    client = agentkv.wrap_openai(raw, backend="openai", advisor=_Gap(1_200_000.0))
    with agentkv.trajectory("t-hosted"):
        client.chat.completions.create(messages=MESSAGES, **create)  # type: ignore[call-overload]
    raw.close()
    (request,) = server.model_requests()
    body: dict[str, Any] = request["body"]
    return body


def test_long_gap_adds_the_models_retention_field(server: FakeServer) -> None:
    body = _bodies(server, model="gpt-5.6")
    assert body["prompt_cache_options"] == {"ttl": "30m"}
    assert "prompt_cache_retention" not in body


@pytest.mark.parametrize(
    "given",
    [
        {"prompt_cache_retention": "24h"},
        {"extra_body": {"prompt_cache_retention": "in_memory"}},
    ],
    ids=["argument", "extra-body"],
)
def test_callers_old_retention_field_is_not_joined_by_the_new_one(
    server: FakeServer, given: dict[str, Any]
) -> None:
    """On a model that takes ``prompt_cache_options``, a caller's deprecated
    ``prompt_cache_retention`` goes out alone: never both fields in one request."""
    body = _bodies(server, model="gpt-5.6", **given)
    assert "prompt_cache_options" not in body
    assert body["prompt_cache_retention"] in ("24h", "in_memory")
    assert body["prompt_cache_key"].startswith("akv-")  # the rest of the hints still go


def test_callers_new_options_stand_on_an_older_model(server: FakeServer) -> None:
    body = _bodies(server, model="gpt-5.1", extra_body={"prompt_cache_options": {"ttl": "30m"}})
    assert body["prompt_cache_options"] == {"ttl": "30m"}
    assert "prompt_cache_retention" not in body


# --- TTL from the gap forecast, breakpoint placement, prewarm (openai 3.57's fields) ---


SYSTEM = "You are a careful assistant. " * 40
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
INPUT = [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": "hi"}]


def _sent(server: FakeServer, advisor: Advisor, api: str, **create: Any) -> dict[str, Any]:
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    client = agentkv.wrap_openai(raw, backend="openai", advisor=advisor)
    with agentkv.trajectory("t-hosted"):
        if api == "responses":
            client.responses.create(**create)
        else:
            client.chat.completions.create(**create)
    raw.close()
    (request,) = server.model_requests()
    body: dict[str, Any] = request["body"]
    return body


def test_a_gap_beyond_30_minutes_buys_12h_on_the_responses_api(server: FakeServer) -> None:
    """The gap forecast's p90 (2 h) outlasts ``30m``: the Responses API takes ``12h``."""
    body = _sent(server, _Gap(1_200_000.0, 7_200_000.0), "responses", model="gpt-5.6", input=INPUT)
    assert body["prompt_cache_options"] == {"ttl": "12h"}
    assert "prompt_cache_retention" not in body
    assert "prewarm" not in body["prompt_cache_options"]  # never on the caller's own call


def test_chat_completions_takes_only_30m_whatever_the_gap(server: FakeServer) -> None:
    body = _sent(server, _Gap(7_200_000.0), "chat", model="gpt-5.6", messages=CHAT)
    assert body["prompt_cache_options"] == {"ttl": "30m"}


def test_a_short_p50_with_a_long_p90_still_retains(server: FakeServer) -> None:
    """The horizon is the p90: a median inside the in-memory window is not enough to skip."""
    body = _sent(server, _Gap(120_000.0, 900_000.0), "chat", model="gpt-5.1", messages=CHAT)
    assert body["prompt_cache_retention"] == "24h"
    assert "prompt_cache_options" not in body


def test_the_instructions_end_in_an_explicit_breakpoint_on_chat(server: FakeServer) -> None:
    """gpt-5.6: the system text becomes one text part marked ``prompt_cache_breakpoint``;
    the user's message and the caller's list are unchanged."""
    messages = [dict(m) for m in CHAT]
    body = _sent(server, _Gap(60_000.0), "chat", model="gpt-5.6", messages=messages)
    system, user = body["messages"]
    assert system["content"] == [
        {"type": "text", "text": SYSTEM, "prompt_cache_breakpoint": {"mode": "explicit"}}
    ]
    assert user == {"role": "user", "content": "hi"}
    assert messages == CHAT  # the caller's objects untouched
    assert "prompt_cache_options" not in body  # a 1-minute gap: no TTL bought


def test_the_responses_input_gets_an_input_text_breakpoint(server: FakeServer) -> None:
    body = _sent(server, _Gap(60_000.0), "responses", model="gpt-5.7", input=INPUT)
    assert body["input"][0]["content"] == [
        {"type": "input_text", "text": SYSTEM, "prompt_cache_breakpoint": {"mode": "explicit"}}
    ]
    assert body["input"][1] == {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("model", "create"),
    [
        ("gpt-5.5", {}),  # no breakpoints before gpt-5.6
        ("gpt-5.6", {"extra_body": {"prompt_cache_options": {"mode": "explicit"}}}),
        ("gpt-5.6", {"messages": [{"role": "user", "content": "no instructions"}]}),
        ("gpt-5.6", {"messages": [{"role": "system", "content": ""}, *CHAT[1:]]}),
        (
            "gpt-5.6",
            {
                "messages": [
                    CHAT[0],
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "text",
                                "text": "mine",
                                "prompt_cache_breakpoint": {"mode": "explicit"},
                            }
                        ],
                    },
                ]
            },
        ),
    ],
    ids=["older-model", "caller-explicit-mode", "no-system", "empty-system", "callers-own"],
)
def test_no_breakpoint_is_added_where_it_does_not_belong(
    server: FakeServer, model: str, create: dict[str, Any]
) -> None:
    create = {"messages": CHAT, **create}
    sent = create["messages"]
    body = _sent(server, _Gap(60_000.0), "chat", model=model, **create)
    assert body["messages"] == sent


def test_prewarm_pays_only_past_the_longest_ttl_on_the_responses_api() -> None:
    from agentkv.client.backends._adapters import prewarm_pays

    day = 24 * 3600 * 1000.0
    assert prewarm_pays("gpt-5.6", "responses", day)
    assert not prewarm_pays("gpt-5.6", "responses", 3_600_000.0)  # 12h on the request covers it
    assert not prewarm_pays("gpt-5.6", "chat", day)  # Chat Completions has no prewarm
    assert not prewarm_pays("gpt-5.5", "responses", day)


def test_a_server_refusing_the_breakpoint_gets_the_callers_messages_from_then_on(
    server: FakeServer,
) -> None:
    """A 400 on the added breakpoint: the call is retried as the caller wrote it and
    succeeds, and later calls go out without the rewrite (no 400 per call)."""
    server.reject_anywhere = {"prompt_cache_breakpoint"}
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    client = agentkv.wrap_openai(raw, backend="openai", advisor=_Gap(60_000.0))
    with agentkv.trajectory("t-refused"):
        for _ in range(2):
            reply = client.chat.completions.create(model="gpt-5.6", messages=CHAT)
            assert reply.choices[0].message.content
    raw.close()
    sent = [r["body"]["messages"] for r in server.model_requests()]
    assert len(sent) == 3  # refused, retried as written, then the second call as written
    assert "prompt_cache_breakpoint" in json.dumps(sent[0])
    assert sent[1] == sent[2] == CHAT
