"""Remove this project's install under its old distribution name before installing it again.

The project was first packaged as ``agentkv``; that name on PyPI belongs to an unrelated project,
so the distribution is now ``agentkv-cache`` (the import name stays ``agentkv``). An environment
that installed a checkout under the old name keeps that distribution (often an editable one
pointing at another checkout) beside the new one, and both provide ``import agentkv``: which one
wins then depends on path order. ``scripts/install.sh`` runs this first:

- no ``agentkv`` distribution installed: nothing to do;
- an ``agentkv`` distribution whose summary is this project's: it is uninstalled;
- any other ``agentkv`` distribution (PyPI's unrelated project): stop with exit status 1 and a
  line saying what to uninstall, since its package would shadow this one's ``agentkv`` module.

Usage: ``python scripts/retire_old_name.py`` (with the interpreter of the target environment).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

OLD_NAME = "agentkv"
#: The summary this project's ``agentkv`` distribution carried (pyproject's description then);
#: kept here so that a later change of the description still recognises an old install.
OLD_SUMMARY = "Agent harness <-> inference server cooperation on KV-cache residency"
ROOT = Path(__file__).resolve().parents[1]


def project_summary(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """This project's one-line description as ``pyproject.toml`` declares it."""
    with pyproject.open("rb") as f:
        return str(tomllib.load(f)["project"]["description"])


def verdict(installed_summary: str | None, our_summary: str) -> str:
    """``"absent"``, ``"ours"`` (this project under the old name: its summary is ours, now
    or as it was) or ``"foreign"``."""
    if installed_summary is None:
        return "absent"
    ours = {our_summary.strip(), OLD_SUMMARY}
    return "ours" if installed_summary.strip() in ours else "foreign"


def installed_summary(name: str = OLD_NAME) -> tuple[str, str] | None:
    """``(version, summary)`` of the installed distribution ``name``, or None."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist.version, dist.metadata.get("Summary") or ""


def main() -> int:
    found = installed_summary()
    ours = project_summary()
    kind = verdict(None if found is None else found[1], ours)
    if kind == "absent":
        return 0
    version = found[0] if found else "?"
    if kind == "ours":
        print(f"retire_old_name: uninstalling this project's old distribution {OLD_NAME} {version}")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "uninstall", "--quiet", "-y", OLD_NAME], check=False
        )
        return done.returncode
    print(
        f"retire_old_name: the distribution {OLD_NAME} {version} installed here is another "
        f"project (PyPI's {OLD_NAME!r}), and its module would shadow this project's "
        f"'import agentkv'. Uninstall it first: {sys.executable} -m pip uninstall {OLD_NAME}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
