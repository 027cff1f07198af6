"""Hosted OpenAI retention: the caller's own retention field stands alone.

The real ``openai`` SDK against the local fake (``tests.support.client_fakes``), with an
advisor that retains across a 20-minute gap (beyond the in-memory prompt cache), so
agentkv would add the model's longer-retention field.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

import agentkv
from agentkv.advice._advisor import Advisor, TrajectoryState
from tests.support.client_fakes import FakeServer

MESSAGES = [{"role": "user", "content": "hi"}]


class _LongGap(Advisor):
    """Always retains, predicting a 20-minute gap."""

    def advise(self, state: TrajectoryState, *, load: Any = None) -> agentkv.CacheAdvice:
        return agentkv.CacheAdvice(
            trajectory_id=state.trajectory_id,
            action="retain",
            ttl_ms=600_000,
            reason="short_tool_gap",
            policy_version="test",
            predicted_gap_ms=1_200_000.0,
        )


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer("agentkv")
    yield s
    s.close()


def _bodies(server: FakeServer, **create: Any) -> dict[str, Any]:
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    client = agentkv.wrap_openai(raw, backend="openai", advisor=_LongGap())
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
