"""``criticalPath`` in the request hint: it round-trips in every form, is None when
absent, and a value that is not a boolean rejects the hint with a reason naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest

import agentkv
from agentkv.protocol._hints import decode_hint, decode_request_hint, encode_hint
from agentkv.protocol._hints import encode_kv_hints_field as kv_field
from agentkv.protocol._wire import XARG_HINTS, build_envelope
from tests.support.requires import require_module

ADVICE = agentkv.CacheAdvice(
    trajectory_id="t", action="retain", ttl_ms=5_000, reason="short_tool_gap", policy_version="p"
)


class _Request:
    def __init__(self, kv_hints: Any) -> None:
        self.kv_hints = kv_hints
        self.sampling_params = None


@pytest.mark.parametrize("critical", [True, False])
@pytest.mark.parametrize("form", ["flat", "envelope", "kv_hints"])
def test_critical_path_round_trips_in_each_form(critical: bool, form: str) -> None:
    if form == "kv_hints":
        entry = kv_field("t", 2, "parent-1", ADVICE, critical_path=critical)
        hint = decode_request_hint(_Request(entry["kv_hints"]))
    else:
        xargs = encode_hint("t", 2, "parent-1", ADVICE, envelope=form == "envelope",
                            critical_path=critical)  # fmt: skip
        json.dumps(xargs, allow_nan=False)
        hint = decode_hint(xargs)
    assert hint is not None and not hint.rejected, hint and hint.errors
    assert (hint.critical_path, hint.parent_id, hint.action) == (critical, "parent-1", "retain")


def test_the_flat_form_sends_a_number_and_the_envelope_a_boolean() -> None:
    """vLLM's ``vllm_xargs`` takes flat values and turns a boolean into 1 or 0, so the flat
    form sends that; the envelope's JSON keeps the boolean."""
    flat = encode_hint("t", 0, None, None, envelope=False, critical_path=True)
    assert flat["agentkv_criticalPath"] == 1 and type(flat["agentkv_criticalPath"]) is int
    env = encode_hint("t", 0, None, None, envelope=True, critical_path=False)
    assert json.loads(env[XARG_HINTS])["actions"][0]["payload"]["criticalPath"] is False


def test_absent_critical_path_is_none_and_not_sent() -> None:
    for envelope in (False, True):
        xargs = encode_hint("t", 0, None, ADVICE, envelope=envelope)
        assert "criticalPath" not in json.dumps(xargs)
        hint = decode_hint(xargs)
        assert hint is not None and not hint.rejected and hint.critical_path is None


@pytest.mark.parametrize("value", ["true", "yes", 2, -1, 1.0, 0.5, [True], {"a": 1}])
def test_a_flat_value_that_is_not_a_boolean_rejects_the_hint(value: object) -> None:
    hint = decode_hint({"agentkv_trajectoryId": "t", "agentkv_turnId": 3,
                        "agentkv_criticalPath": value})  # fmt: skip
    assert hint is not None and hint.rejected
    assert hint.errors == [f"criticalPath must be true or false, got {type(value).__name__}"]
    assert (hint.rejected_id, hint.turn_id, hint.trajectory_id) == ("t", 3, "")


@pytest.mark.parametrize("value", [1, 0, "true"])
def test_the_envelope_takes_only_a_json_boolean(value: object) -> None:
    """Only the flat form reads 1 / 0 (what vLLM made of a boolean); a JSON envelope
    carries the boolean itself."""
    xargs = {XARG_HINTS: build_envelope("default", {"trajectoryId": "t", "criticalPath": value})}
    hint = decode_hint(xargs)
    assert hint is not None and hint.rejected and "criticalPath" in hint.errors[0]
    request = decode_request_hint(_Request(kv_field("t", 0, None, None)["kv_hints"]))
    assert request is not None and not request.rejected  # the field itself still reads
    bad = kv_field("t", 0, None, None)["kv_hints"]
    bad["actions"][0]["payload"]["criticalPath"] = value
    hint = decode_request_hint(_Request(bad))
    assert hint is not None and hint.rejected and "criticalPath" in hint.errors[0]


def test_a_boolean_in_vllm_xargs_arrives_as_a_number_the_plugin_reads() -> None:
    """Through vLLM's own request model: what the client's flat form becomes on the
    server decodes to the boolean it sent."""
    protocol = require_module("vllm.entrypoints.openai.completion.protocol")
    for critical in (True, False):
        xargs = encode_hint("t", 1, "p", None, envelope=False, critical_path=critical)
        body = json.dumps({"model": "m", "prompt": [1, 2], "vllm_xargs": xargs})
        request = protocol.CompletionRequest.model_validate_json(body)
        hint = decode_hint(request.vllm_xargs)
        assert hint is not None and not hint.rejected and hint.critical_path is critical
    raw = json.dumps({"model": "m", "prompt": [1], "vllm_xargs": {"agentkv_trajectoryId": "t",
                                                                  "agentkv_criticalPath": True}})  # fmt: skip
    hint = decode_hint(protocol.CompletionRequest.model_validate_json(raw).vllm_xargs)
    assert hint is not None and hint.critical_path is True  # a raw JSON true, turned into 1
