"""Fixtures shared by the client's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentkv.client import _lifecycle
from agentkv.client._lifecycle import LifecycleChannel


@pytest.fixture
def channel() -> Iterator[LifecycleChannel]:
    """The client's lifecycle channel, quick to give up (0.3 s, one attempt), installed
    for one test and removed after it (a module that needs other limits defines its own)."""
    ch = LifecycleChannel(timeout_s=0.3, max_attempts=1)
    _lifecycle.set_channel(ch)
    yield ch
    _lifecycle.reset_channel()
