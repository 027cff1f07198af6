"""The ``kv_hints_field`` capability: advertised only where vLLM's HTTP API takes the field
and the scheduler plugin reads agentkv's hint from it (``agentkv.vllm._ops``)."""

from __future__ import annotations

from types import SimpleNamespace

from agentkv.vllm._ops import http_takes_kv_hints, kv_hints_field_unavailable
from tests.support.requires import require_vllm


def test_the_installed_vllm_http_api_has_no_kv_hints_field() -> None:
    """vLLM 0.32 (and 0.33): ``Request.kv_hints`` exists, no HTTP field sets it, so the
    capability is not advertised and clients keep ``vllm_xargs``."""
    require_vllm()
    assert http_takes_kv_hints() is False


def test_the_capability_needs_both_the_http_field_and_a_plugin_that_reads_it() -> None:
    reading = SimpleNamespace(reads_kv_hints_field=True)
    today = SimpleNamespace()  # the plugin reads vllm_xargs only
    assert kv_hints_field_unavailable(reading, http_field=True) is None
    assert "vllm_xargs" in (kv_hints_field_unavailable(today, http_field=True) or "")
    assert "HTTP API" in (kv_hints_field_unavailable(reading, http_field=False) or "")
