"""Where agentkv keeps local state (learned gaps, the tiny model, benchmark output)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["agentkv_home"]


def agentkv_home() -> Path:
    """Return agentkv's home directory, creating it if needed.

    ``AGENTKV_HOME`` wins; otherwise ``$XDG_CACHE_HOME/agentkv`` or ``~/.cache/agentkv``.
    """
    env = os.environ.get("AGENTKV_HOME")
    if env:
        path = Path(env).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "agentkv"
    path.mkdir(parents=True, exist_ok=True)
    return path
