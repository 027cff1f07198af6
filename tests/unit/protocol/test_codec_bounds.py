"""Numbers no float holds and nesting no parser follows are validation errors (issue 31).

``emittedAtMs`` = ±10**400 once raised ``OverflowError`` (HTTP 500, the batch's later
events skipped) and a deeply nested ``agentkv_hints`` a ``RecursionError`` counted as an
agentkv bug. Each is pinned here at three depths: the codec (a rejected event or hint
with its reason), the control route's own handler (4xx or a 200 naming the rejected
event, never a 500) and the scheduler plugin inside vLLM's real ``Scheduler`` (counted as
a rejected hint, never as an internal error).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from agentkv.protocol._events import BodyError, decode_events_body
from agentkv.protocol._hints import decode_hint
from agentkv.protocol._wire import XARG_HINTS

#: Literals as a hostile client writes them into a JSON body (Python's json reads each:
#: the integers exactly, the rest as a non-finite float).
HUGE = [str(10**400), str(-(10**400)), "1e400", "-1e400", "NaN", "Infinity", "-Infinity"]
DEPTH = 5000


def _event(ms: str, **extra: str) -> str:
    fields = "".join(f', "{k}": {v}' for k, v in extra.items())
    return f'{{"trajectoryId": "t", "event": "tool_started", "emittedAtMs": {ms}{fields}}}'


@pytest.mark.parametrize("literal", HUGE)
def test_a_huge_or_non_finite_emitted_at_rejects_that_event_only(literal: str) -> None:
    body = f'{{"events": [{_event(literal)}, {_event("12")}]}}'.encode()
    good, bad = decode_events_body(body)
    assert [r["index"] for r in bad] == [0] and "emittedAtMs" in bad[0]["error"]
    assert len(good) == 1 and good[0]["emitted_at_ms"] == 12.0  # the later event is kept


@pytest.mark.parametrize("literal", HUGE)
@pytest.mark.parametrize("field", ["ttlMs", "predictedGapMs", "predictedGapP99Ms", "priority"])
def test_a_huge_or_non_finite_advice_field_rejects_that_event_only(
    field: str, literal: str
) -> None:
    advice = f'{{"action": "retain", "{field}": {literal}}}'
    body = f'{{"events": [{_event("1", advice=advice)}, {_event("2")}]}}'.encode()
    good, bad = decode_events_body(body)
    assert [r["index"] for r in bad] == [0] and field in bad[0]["error"]
    assert len(good) == 1


@pytest.mark.parametrize("literal", [str(10**400), str(-(10**400))])
def test_a_huge_turn_id_rejects_the_event(literal: str) -> None:
    body = f'{{"events": [{_event("1", turnId=literal)}]}}'.encode()
    good, bad = decode_events_body(body)
    assert good == [] and "turnId" in bad[0]["error"]


def test_a_number_longer_than_the_parser_reads_is_a_400_not_a_crash() -> None:
    with pytest.raises(BodyError) as info:
        decode_events_body(f'{{"events": [{_event("1" * 5000)}]}}'.encode())
    assert info.value.status == 400


@pytest.mark.parametrize(
    "nested",
    ["[" * DEPTH + "]" * DEPTH, '{"a":' * DEPTH + "1" + "}" * DEPTH],
    ids=["lists", "objects"],
)
def test_deep_nesting_inside_an_event_is_a_400_saying_so(nested: str) -> None:
    body = f'{{"events": [{_event("1", advice=nested)}]}}'.encode()
    with pytest.raises(BodyError) as info:
        decode_events_body(body)
    assert info.value.status == 400 and "nested too deeply" in info.value.message


@pytest.mark.parametrize("value", [10**400, -(10**400)])
@pytest.mark.parametrize(
    "key", ["agentkv_turnId", "agentkv_ttlMs", "agentkv_predictedGapMs", "agentkv_priority"]
)
def test_a_huge_integer_in_a_flat_hint_rejects_the_hint(key: str, value: int) -> None:
    hint = decode_hint({"agentkv_trajectoryId": "t", key: value})
    assert hint is not None and hint.rejected
    assert key.removeprefix("agentkv_") in hint.errors[0]


@pytest.mark.parametrize("literal", HUGE)
def test_a_huge_or_non_finite_number_in_an_envelope_rejects_the_hint(literal: str) -> None:
    raw = (
        '{"actions": [{"action_type": "retain", "payload": '
        f'{{"trajectoryId": "t", "ttlMs": {literal}}}}}]}}'
    )
    hint = decode_hint({XARG_HINTS: raw})
    assert hint is not None and hint.rejected and "ttlMs" in hint.errors[0]


def _deep_envelope(depth: int) -> str:
    payload = '{"trajectoryId": "t", "x": ' + "[" * depth + "]" * depth + "}"
    return '{"actions": [{"action_type": "retain", "payload": ' + payload + "}]}"


def test_a_deeply_nested_envelope_is_a_rejected_hint_saying_so() -> None:
    hint = decode_hint({XARG_HINTS: _deep_envelope(DEPTH)})
    assert hint is not None and hint.rejected and not hint.trajectory_id
    assert hint.errors == [f"{XARG_HINTS} is nested too deeply"]


# -- the control route's handler (the middleware vLLM runs), in process ------------------
class _Headers(dict[str, str]):
    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)


def _post(body: bytes) -> Any:
    """A POST to the events route as starlette hands it to the middleware (no engine:
    nothing in these bodies reaches one)."""
    path = "/agentkv/v1/events"

    async def stream() -> Any:
        yield body

    state = SimpleNamespace(engine_client=None, args=SimpleNamespace(api_key=None))
    return SimpleNamespace(
        app=SimpleNamespace(state=state),
        url=SimpleNamespace(path=path),
        scope={"path": path, "raw_path": path.encode(), "root_path": ""},
        method="POST",
        headers=_Headers({"content-type": "application/json"}),
        client=SimpleNamespace(host="127.0.0.1", port=1),
        stream=stream,
    )


async def _answer(body: bytes) -> tuple[int, Any]:
    from tests.support.requires import require_module

    require_module("starlette")
    from agentkv.vllm._control import control_middleware

    async def never(_: Any) -> Any:
        raise AssertionError("the control route answers its own paths")

    response = await control_middleware(_post(body), never)
    return response.status_code, json.loads(response.body)


@pytest.mark.parametrize("literal", HUGE)
async def test_the_route_answers_a_huge_emitted_at_with_the_event_rejected(
    literal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    status, answer = await _answer(f'{{"events": [{_event(literal)}]}}'.encode())
    assert status == 200 and answer["accepted"] == 0
    assert [r["index"] for r in answer["rejected"]] == [0]
    assert "emittedAtMs" in answer["rejected"][0]["error"]


async def test_the_route_answers_deep_nesting_with_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    nested = "[" * DEPTH + "]" * DEPTH
    status, answer = await _answer(f'{{"events": [{_event("1", advice=nested)}]}}'.encode())
    assert status == 400 and "nested too deeply" in answer["error"]


# -- the scheduler plugin, inside vLLM's real Scheduler ------------------------------------
@pytest.mark.server
def test_the_plugin_counts_hostile_hints_as_rejected_never_as_internal_errors() -> None:
    from tests.support.requires import require_vllm

    require_vllm()
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    from tests.support.offline_scheduler import make_plugin_scheduler

    scheduler = make_plugin_scheduler("Scheduler", block_size=16, num_blocks=33)
    hostile: list[dict[str, Any]] = [
        {XARG_HINTS: _deep_envelope(DEPTH)},
        # vLLM itself refuses flat integers beyond 64 bits; these are the largest it passes
        {"agentkv_trajectoryId": "t", "agentkv_ttlMs": 2**64 - 1},
        {"agentkv_trajectoryId": "t", "agentkv_predictedGapMs": -(2**63)},
        {
            XARG_HINTS: '{"actions": [{"action_type": "retain", "payload": '
            '{"trajectoryId": "t", "ttlMs": 1e400}}]}'
        },
    ]
    for i, extra in enumerate(hostile):
        params = SamplingParams(max_tokens=1, extra_args=extra)
        scheduler.add_request(Request(f"r{i}", [1, 2, 3], params, None))
    plugin = scheduler.agentkv
    assert plugin.ctl.counters.hint_errors == len(hostile)
    assert plugin.internal_errors == 0
    assert plugin.requests == {}  # nothing of a rejected hint is kept
