"""The GPU check of the agentkv plugin and the CPU offload tier (run by scripts/gpu_check.sh).

Two servers of the tiny model on one GPU, the same small pool each:

1. **tier off** (``kv_offload=False``): what comes back is the plugin's doing. A retained
   context survives traffic that evicts an unhinted one; a released one is demoted; the
   pressure override trims (``leases_trimmed``) or ends (``leases_pressure_released``) a
   lease instead of preempting; ``vllm:external_prefix_cache_hits`` stays 0.
2. **tier on** (native CPU tier): an unhinted context evicted from the device comes back
   from the tier (``vllm:external_prefix_cache_hits`` > 0, ``vllm:kv_offload_load_bytes``
   > 0, the plugin's ``tier_hit_tokens`` > 0).

Then a short bench (arms B, D, E, G, L) on a small GPU model, printed as one table.
The pure parts (metric parsing, the checks' verdicts, the table) are functions tested by
``tests/unit/scripts/test_gpu_check.py``; :func:`main` does the I/O.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: vLLM's series this check reads (Prometheus names, summed over label sets).
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
LOAD_BYTES = "vllm:kv_offload_load_bytes_total"
STORE_BYTES = "vllm:kv_offload_store_bytes_total"
PREEMPTIONS = "vllm:num_preemptions_total"

#: The plugin counters the checks assert (names as in GET /agentkv/v1/stats).
PLUGIN_COUNTERS = (
    "leases_created",
    "leases_reused",
    "leases_trimmed",
    "leases_pressure_released",
    "blocks_demoted",
    "internal_errors",
    "tier_hit_tokens",
)

BENCH_ARMS = ("B", "D", "E", "G", "L")


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each Prometheus sample name's values over its label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def delta(after: Mapping[str, Any], before: Mapping[str, Any], name: str) -> float:
    """``after[name] - before[name]`` (a missing or None value counts as 0)."""
    return float(after.get(name) or 0.0) - float(before.get(name) or 0.0)


@dataclass
class Verdicts:
    """The checks' results, in order; ``failed`` names the ones that failed."""

    rows: list[tuple[str, bool, dict[str, Any]]] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: dict[str, Any]) -> bool:
        """Record (and print) one check."""
        self.rows.append((name, bool(ok), detail))
        print(f"{'PASS' if ok else 'FAIL'} {name}: {json.dumps(detail)}", flush=True)
        return bool(ok)

    @property
    def failed(self) -> list[str]:
        """Names of the failed checks."""
        return [name for name, ok, _ in self.rows if not ok]


def judge_retain(cached_tokens: int, min_tokens: int, external_delta: float) -> bool:
    """Tier off: the retained context came back from the device (no tier was involved)."""
    return cached_tokens >= min_tokens and external_delta == 0


def judge_release(demoted_delta: float, released_cached: int, other_cached: int) -> bool:
    """Tier off: the release demoted blocks, and the released context lost more of its
    cache than an older unhinted one."""
    return demoted_delta > 0 and released_cached <= other_cached


def judge_pressure(stats_delta: Mapping[str, float], preemptions_delta: float) -> bool:
    """A lease gave way (trimmed or ended) and nothing was preempted."""
    gave_way = stats_delta.get("leases_trimmed", 0) + stats_delta.get("leases_pressure_released", 0)
    return gave_way >= 1 and preemptions_delta == 0


def judge_tier(metrics_delta: Mapping[str, float], stats: Mapping[str, Any]) -> bool:
    """Tier on: vLLM loaded blocks back from the CPU tier and the plugin counted them."""
    return (
        metrics_delta.get(EXTERNAL_HITS, 0) > 0
        and metrics_delta.get(LOAD_BYTES, 0) > 0
        and float(stats.get("tier_hit_tokens") or 0) > 0
    )


def bench_table(results: Mapping[str, Any], arms: tuple[str, ...] = BENCH_ARMS) -> str:
    """One markdown table of a bench run's results.json: JCT, reuse, tier figures."""
    head = ("| arm | JCT mean s | JCT p95 s | reuse | preemptions | tier hit tokens "
            "| load GB | load GB/s |")  # fmt: skip
    lines = [head, "|" + "---|" * 8]
    got = results.get("arms", {})
    for name in arms:
        arm = got.get(name)
        if not isinstance(arm, Mapping) or "jct_mean_s" not in arm:
            why = arm.get("not_run", "not run") if isinstance(arm, Mapping) else "not run"
            lines.append(f"| {name} | {why} | | | | | | |")
            continue
        tier = arm.get("tier") or {}
        lines.append(
            f"| {name} | {_f(arm.get('jct_mean_s'))} | {_f(arm.get('jct_p95_s'))} "
            f"| {_f(arm.get('prefix_reuse_ratio'), 3)} | {_f(arm.get('preemptions'), 1)} "
            f"| {_f(tier.get('tier_hit_tokens'), 0)} | {_f(_scale(tier.get('load_bytes')), 2)} "
            f"| {_f(_scale(tier.get('load_bytes_per_s')), 2)} |"
        )
    return "\n".join(lines)


def _scale(value: Any) -> float | None:
    return None if value is None else float(value) / 1e9


def _f(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(20, 1500) for _ in range(n)]


def _run_server(offload: bool, v: Verdicts) -> None:  # pragma: no cover - needs a GPU
    import httpx

    import agentkv

    opts: dict[str, Any] = dict(block_size=32, num_gpu_blocks_override=64, max_model_len=2000,
                                enforce_eager=True, gpu_memory_utilization=0.3, platform="cuda",
                                kv_offload=offload)  # fmt: skip
    if offload:
        opts["kv_offload_size_gib"] = 1
    tag = "tier_on" if offload else "tier_off"
    with agentkv.serve(**opts) as server:
        http = httpx.Client(base_url=server.base_url, timeout=300)

        def complete(prompt: list[int], xargs: dict[str, Any] | None = None) -> int:
            body: dict[str, Any] = {"model": server.model, "prompt": prompt, "max_tokens": 1}
            if xargs:
                body["vllm_xargs"] = xargs
            r = http.post("/v1/completions", json=body)
            r.raise_for_status()
            details = r.json()["usage"].get("prompt_tokens_details") or {}
            return int(details.get("cached_tokens") or 0)

        def metrics() -> dict[str, float]:
            return parse_metrics(http.get("/metrics").text)

        def stats() -> dict[str, Any]:
            return dict(http.get("/agentkv/v1/stats").json())

        caps = http.get("/agentkv/v1/capabilities").json()
        v.check(f"{tag}.capabilities", caps["features"]["offload"] == offload,
                {"features": caps.get("features"), "unavailable": caps.get("unavailable")})  # fmt: skip
        if not offload:
            m0, s0 = metrics(), stats()
            retain = {"agentkv_traj": "A", "agentkv_action": "retain", "agentkv_ttl_ms": 120000}
            a1 = _tokens(1, 600)
            complete(a1, retain)
            for i in range(3):
                complete(_tokens(100 + i, 700))
            cached = complete(a1 + _tokens(2, 20), retain)
            v.check("tier_off.retain", judge_retain(cached, 512, delta(metrics(), m0, EXTERNAL_HITS)),
                    {"cached_tokens": cached})  # fmt: skip
            c1, b1 = _tokens(5, 600), _tokens(6, 600)
            complete(c1)
            complete(b1, {"agentkv_traj": "B", "agentkv_action": "release"})
            complete(_tokens(200, 1350))
            c_cached, b_cached = complete(c1 + _tokens(7, 20)), complete(b1 + _tokens(8, 20))
            s1 = stats()
            v.check("tier_off.release",
                    judge_release(delta(s1, s0, "blocks_demoted"), b_cached, c_cached),
                    {"released_cached": b_cached, "older_unhinted_cached": c_cached})  # fmt: skip
            complete(_tokens(9, 600), {"agentkv_traj": "P", "agentkv_action": "retain",
                                       "agentkv_ttl_ms": 600000})  # fmt: skip
            m2, s2 = metrics(), stats()
            complete(_tokens(10, 1700))
            s3 = stats()
            d = {k: delta(s3, s2, k) for k in PLUGIN_COUNTERS}
            v.check("tier_off.pressure", judge_pressure(d, delta(metrics(), m2, PREEMPTIONS)), d)
        else:
            m0 = metrics()
            c1 = _tokens(11, 600)
            complete(c1)  # unhinted: only the tier can keep it
            for i in range(4):
                complete(_tokens(300 + i, 700))
            complete(c1 + _tokens(12, 20))
            m1, s1 = metrics(), stats()
            md = {k: delta(m1, m0, k) for k in (EXTERNAL_HITS, LOAD_BYTES, STORE_BYTES)}
            v.check("tier_on.offload_used", judge_tier(md, s1), {**md, "tier": {
                k: s1.get(k) for k in ("tier_hit_tokens", "offload_load_bytes",
                                       "offload_load_bytes_per_s")}})  # fmt: skip
        s = stats()
        v.check(f"{tag}.no_internal_errors", s.get("internal_errors") == 0,
                {"internal_errors": s.get("internal_errors")})  # fmt: skip
        http.close()


def main(argv: list[str]) -> int:  # pragma: no cover - needs a GPU
    """Run the two server checks, then the bench (``--no-bench`` skips it)."""
    import subprocess

    v = Verdicts()
    _run_server(False, v)
    _run_server(True, v)
    if "--no-bench" not in argv:
        out = "gpu-check-bench"
        model = next((a.split("=", 1)[1] for a in argv if a.startswith("--model=")), "smollm2")
        cmd = [sys.executable, "-m", "agentkv", "bench", "--arms", ",".join(BENCH_ARMS),
               "--reps", "1", "--model", model, "--out", out, "--plain"]  # fmt: skip
        rc = subprocess.call(cmd)
        v.check("bench.ran", rc == 0, {"rc": rc, "out": out})
        if rc == 0:
            with open(f"{out}/results.json", encoding="utf-8") as f:
                print(bench_table(json.load(f)))
    print(f"{len(v.rows) - len(v.failed)} of {len(v.rows)} checks passed; failed: {v.failed}")
    return 1 if v.failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
