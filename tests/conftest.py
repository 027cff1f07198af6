"""Test-suite setup: strict mode on, a private AGENTKV_HOME, and clean agentkv state per test."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

# Internal errors must surface in our own tests (invariant tests turn it off explicitly).
os.environ.setdefault("AGENTKV_STRICT", "1")
# Keep learned state and built models out of the user's home directory.
os.environ.setdefault("AGENTKV_HOME", tempfile.mkdtemp(prefix="agentkv-test-home-"))
# The process's gap learner persists by default; tests would share what earlier ones taught
# it (tests/unit/events/test_pipeline.py checks the default explicitly).
os.environ.setdefault("AGENTKV_GAPS_PERSIST", "0")

from hypothesis import HealthCheck, settings

from agentkv.testing import reset
from tests.support.offline_scheduler import scheduler_base_name  # noqa: F401  (fixture: each scheduler class)
from tests.support.requires import require_module, require_vllm, unavailable  # noqa: F401  (one rule)
from tests.support.server_fixtures import *  # noqa: F403  (real vLLM server fixtures, session-scoped)

# Timings are never test assertions: a draw that is slow because the 2-core machine is busy
# (a vLLM server of another test running) must not fail a property test.
settings.register_profile("agentkv", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("agentkv")


@pytest.fixture(autouse=True)
def _clean_agentkv() -> Iterator[None]:
    """Each test starts and ends with agentkv's process state as a fresh import leaves it."""
    reset()
    try:
        yield
    finally:
        reset()
