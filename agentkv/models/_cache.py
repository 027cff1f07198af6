"""Build a model directory once, under a file lock, and move it into place when complete.

Every embedded model lives in its own directory under ``AGENTKV_HOME/models``, named by a
digest of what it was built from. A directory counts as built once its marker file (the
weights) exists; the build itself happens in a temporary sibling directory, so a reader
never sees a half-written model and concurrent callers build it once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["build_once", "hash_model_dir"]


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_once(
    target: Path, build: Callable[[Path], object], marker: str = "model.safetensors"
) -> Path:
    """Return ``target``, first calling ``build(empty_dir)`` when ``target/marker`` is missing.

    ``build`` writes the model into the directory it is given (which does not exist yet);
    the result is renamed to ``target`` only when ``build`` returns. Safe against
    concurrent callers in other processes: the build runs under a lock file beside
    ``target``.
    """
    if (target / marker).exists():
        return target
    with _locked(target.parent / f".{target.name}.lock"):
        if (target / marker).exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(tmp / "m")
            if target.exists():
                shutil.rmtree(target)
            (tmp / "m").rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def hash_model_dir(path: str | os.PathLike[str]) -> str:
    """SHA-256 over every file name and content in ``path`` (sorted); equal builds hash equal."""
    digest = hashlib.sha256()
    root = Path(path)
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        with file.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()
