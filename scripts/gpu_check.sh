#!/usr/bin/env bash
# GPU check of the agentkv vLLM plugin: serve the tiny model on an NVIDIA GPU with KV
# offload on, then run the retain / release / pressure checks against it.
#
#   scripts/gpu_check.sh                 # uses python3; needs agentkv and the `vllm` wheel
#   PYTHON=/path/to/python scripts/gpu_check.sh
#
# Exit status 0 when every check passes. Prints one line per check and a summary JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to check" >&2
  exit 2
fi
if ! "$PY" -c "import vllm, agentkv" >/dev/null 2>&1; then
  echo "gpu_check: needs agentkv and vLLM: $PY -m pip install -e '.[vllm]'" >&2
  exit 2
fi
nvidia-smi -L
"$PY" -c "import vllm; print('vllm', vllm.__version__)"

export AGENTKV_HOME="${AGENTKV_HOME:-$(mktemp -d -t agentkv-gpu-check-XXXX)}"
"$PY" - <<'PYEOF'
import json, random, re, sys, time
import httpx
import agentkv

results = {}
failures = []

def check(name, ok, detail):
    results[name] = {"ok": bool(ok), **detail}
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)

def toks(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(20, 1500) for _ in range(n)]

opts = dict(block_size=32, num_gpu_blocks_override=64, max_model_len=2000, enforce_eager=True,
            kv_offload_size_gib=1, gpu_memory_utilization=0.3, platform="cuda")
t0 = time.monotonic()
with agentkv.serve(**opts) as server:
    results["start_s"] = round(time.monotonic() - t0, 1)
    http = httpx.Client(base_url=server.base_url, timeout=300)

    def complete(prompt, xargs=None):
        body = {"model": server.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        if xargs:
            body["vllm_xargs"] = xargs
        r = http.post("/v1/completions", json=body)
        r.raise_for_status()
        u = r.json()["usage"]
        return u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0

    def preemptions():
        text = http.get("/metrics").text
        return sum(float(v) for v in re.findall(r"^vllm:num_preemptions_total\{[^}]*\} (\S+)$", text, re.M))

    caps = http.get("/agentkv/v1/capabilities").json()
    check("capabilities", caps.get("platform") == "cuda" and caps["features"]["retain"],
          {"platform": caps.get("platform"), "features": caps.get("features"),
           "unavailable": caps.get("unavailable")})

    retain = {"agentkv_traj": "A", "agentkv_action": "retain", "agentkv_ttl_ms": 120000}
    a1 = toks(1, 600)
    complete(a1, retain)
    for i in range(3):
        complete(toks(100 + i, 700))
    prompt, cached = complete(a1 + toks(2, 20), retain)
    check("retain", cached >= 512, {"prompt_tokens": prompt, "cached_tokens": cached})
    http.post("/agentkv/v1/events", json={"events": [{"trajectoryId": "A", "event": "trajectory_finished"}]})

    c1, b1 = toks(5, 600), toks(6, 600)
    complete(c1)
    complete(b1, {"agentkv_traj": "B", "agentkv_action": "release"})
    complete(toks(200, 1350))
    _, c_cached = complete(c1 + toks(7, 20))
    _, b_cached = complete(b1 + toks(8, 20))
    # With offload on, a released trajectory may still come back from the CPU tier.
    check("release", c_cached >= 512, {"older_unhinted_cached": c_cached, "released_cached": b_cached})

    complete(toks(9, 600), {"agentkv_traj": "P", "agentkv_action": "retain", "agentkv_ttl_ms": 600000})
    pre0 = preemptions()
    before = http.get("/agentkv/v1/stats").json()["leases_pressure_released"]
    prompt, _ = complete(toks(10, 1700))
    stats = http.get("/agentkv/v1/stats").json()
    check("pressure", prompt == 1700 and preemptions() == pre0
          and stats["leases_pressure_released"] == before + 1,
          {"preemptions_delta": preemptions() - pre0,
           "pressure_released": stats["leases_pressure_released"] - before})
    check("no_internal_errors", stats["internal_errors"] == 0, {"internal_errors": stats["internal_errors"]})
    http.close()

print(json.dumps(results, indent=2))
sys.exit(1 if failures else 0)
PYEOF
