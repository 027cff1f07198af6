"""Test-suite setup: strict mode on, a private AGENTKV_HOME, and a clean event pipeline per test."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

# Internal errors must surface in our own tests (invariant tests turn it off explicitly).
os.environ.setdefault("AGENTKV_STRICT", "1")
# Keep learned state and built models out of the user's home directory.
os.environ.setdefault("AGENTKV_HOME", tempfile.mkdtemp(prefix="agentkv-test-home-"))

from server_fixtures import *  # noqa: F403  (real vLLM server fixtures, session-scoped)

from agentkv import _guard, _runtime


@pytest.fixture(autouse=True)
def _clean_runtime() -> Iterator[None]:
    """Each test starts with no sinks, no listeners, learning on and strict from the env."""
    state = _runtime._state
    saved = (state.sinks, state.listeners, state.learn_gaps, state.gap_model)
    state.sinks, state.listeners = (), ()
    state.learn_gaps, state.gap_model = True, None
    _guard.reset()
    try:
        yield
    finally:
        state.sinks, state.listeners, state.learn_gaps, state.gap_model = saved
        _guard.reset()
