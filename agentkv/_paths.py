"""Where agentkv keeps local state (learned gaps, the tiny model, benchmark output)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

__all__ = ["agentkv_home", "default_agentkv_home"]


def agentkv_home() -> Path:
    """Return agentkv's home directory, creating it if needed (private: mode 0700).

    ``AGENTKV_HOME`` wins; otherwise ``$XDG_CACHE_HOME/agentkv`` or ``~/.cache/agentkv``.
    The default directory, when an older agentkv left it readable by others, is made
    private again; a directory named by ``AGENTKV_HOME`` keeps the mode it was given.
    """
    env = os.environ.get("AGENTKV_HOME")
    path = Path(env).expanduser() if env else default_agentkv_home()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not env:
        with contextlib.suppress(OSError):
            st = path.stat()
            mine = st.st_uid == getattr(os, "getuid", lambda: -1)()
            if mine and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                path.chmod(0o700)
    return path


def default_agentkv_home() -> Path:
    """The home ``AGENTKV_HOME`` replaces: ``$XDG_CACHE_HOME/agentkv`` or ``~/.cache/agentkv``.

    Only the path: nothing is created.
    """
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentkv"
