"""scripts/retire_old_name.py: an install under the old distribution name is removed, a
stranger's ``agentkv`` stops the install (run against a real throwaway virtual environment)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "retire_old_name.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("retire_old_name", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ron = _load()


def test_the_verdict_tells_ours_from_a_stranger_by_the_summary() -> None:
    ours = ron.project_summary()
    assert ours.startswith("Agent harness")
    assert ron.verdict(None, ours) == "absent"
    assert ron.verdict(ours + "\n", ours) == "ours"
    assert ron.verdict("The SQLite of agent memory", ours) == "foreign"
    # an old install is still recognised after the description changes
    assert ron.verdict(ron.OLD_SUMMARY, "a new description") == "ours"


def _venv_with_old_dist(tmp_path: Path, summary: str) -> Path:
    """A real venv holding an ``agentkv`` 0.1.0 distribution (a .pth file, as an editable install
    leaves) whose METADATA carries ``summary``."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    info = site / "agentkv-0.1.0.dist-info"
    info.mkdir()
    (site / "_editable_impl_agentkv.pth").write_text("/nonexistent/checkout\n")
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: agentkv\nVersion: 0.1.0\nSummary: {summary}\n"
    )
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(
        "_editable_impl_agentkv.pth,,\nagentkv-0.1.0.dist-info/METADATA,,\n"
        "agentkv-0.1.0.dist-info/INSTALLER,,\nagentkv-0.1.0.dist-info/RECORD,,\n"
    )
    return py


def _has_old(py: Path) -> bool:
    code = "import importlib.metadata as m\ntry:\n m.version('agentkv'); print(1)\nexcept Exception: print(0)"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "1"


@pytest.mark.slow
def test_this_projects_old_install_is_uninstalled(tmp_path: Path) -> None:
    py = _venv_with_old_dist(tmp_path, ron.project_summary())
    assert _has_old(py)
    done = subprocess.run([str(py), str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "uninstalling this project's old distribution agentkv 0.1.0" in done.stdout
    assert not _has_old(py)


@pytest.mark.slow
def test_a_strangers_agentkv_stops_the_install_and_stays(tmp_path: Path) -> None:
    py = _venv_with_old_dist(tmp_path, "The SQLite of agent memory")
    done = subprocess.run([str(py), str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "pip uninstall agentkv" in done.stderr and "shadow" in done.stderr
    assert _has_old(py)  # never removes someone else's package


def test_install_sh_retires_the_old_name_before_installing() -> None:
    lines = (ROOT / "scripts" / "install.sh").read_text().splitlines()
    retire = next(
        i
        for i, s in enumerate(lines)
        if "scripts/retire_old_name.py" in s and s.startswith('"$PY"')
    )
    install = next(i for i, s in enumerate(lines) if "pip install --quiet -e" in s)
    assert retire < install
