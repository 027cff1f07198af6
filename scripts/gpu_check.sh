#!/usr/bin/env bash
# GPU check of the agentkv plugin and vLLM's CPU offload tier (needs an NVIDIA GPU):
#   1. tier off: retain / release / pressure are the plugin's doing (leases_trimmed or
#      leases_pressure_released, no preemption, no external prefix-cache hits);
#   2. tier on: an evicted context comes back from the CPU tier (external hits and
#      offload load bytes in vLLM's metrics, tier_hit_tokens in the plugin's stats);
#   3. a short bench (arms B, D, E, G, L, one repetition) printed as one table.
#
#   scripts/gpu_check.sh                       # python3; agentkv and the `vllm` wheel
#   PYTHON=/path/to/python scripts/gpu_check.sh --no-bench
#   scripts/gpu_check.sh --model=/path/to/small-model
#
# Exit status 0 when every check passes, 1 when one fails, 2 when it cannot run here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to check" >&2
  exit 2
fi
if ! "$PY" -c "import vllm, agentkv, httpx" >/dev/null 2>&1; then
  echo "gpu_check: needs agentkv and vLLM: $PY -m pip install -e '.[vllm]'" >&2
  exit 2
fi
nvidia-smi -L
"$PY" -c "import vllm; print('vllm', vllm.__version__)"

export AGENTKV_HOME="${AGENTKV_HOME:-$(mktemp -d -t agentkv-gpu-check-XXXX)}"
exec "$PY" scripts/gpu_check.py "$@"
