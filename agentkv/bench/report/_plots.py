"""PNG plots of a benchmark run (matplotlib, headless): one function per figure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["make_plots"]


def _run_arms(arms: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in arms.items() if "not_run" not in v}


def make_plots(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write ``jct_cdf.png``, ``ratios.png`` and ``pool_sweep.png``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = _run_arms(results["arms"])
    label = f"pool {results['pool_fraction']:g} of working set"
    files: list[Path] = []
    figures: list[tuple[str, Callable[[], Any]]] = [
        ("jct_cdf.png", lambda: _jct_cdf(plt, arms, label)),
        ("ratios.png", lambda: _ratios(plt, arms, label)),
        ("pool_sweep.png", lambda: _pool_sweep(plt, results["sweep"])),
    ]
    for name, draw in figures:
        fig = draw()
        fig.tight_layout()
        files.append(out_dir / name)
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)
    return files


def _jct_cdf(plt: Any, arms: dict[str, Any], label: str) -> Any:
    """Each arm's trajectory JCTs as a CDF."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, arm in arms.items():
        xs = sorted(v for v in arm.get("jct_samples_s", []) if v is not None)
        if xs:
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=f"{name}: {arm['description']}")
    ax.set_xlabel("trajectory JCT (s)")
    ax.set_ylabel("fraction of trajectories")
    ax.set_title(f"JCT CDF per arm ({label})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def _ratios(plt: Any, arms: dict[str, Any], label: str) -> Any:
    """Mean and p95 JCT ratios against arm B, with their bootstrap intervals."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = [n for n in arms if arms[n].get("ratio_vs_B")]
    for offset, key, tag in (
        (-0.15, "ratio_vs_B", "mean JCT"),
        (0.15, "p95_ratio_vs_B", "p95 JCT"),
    ):
        xs, ys, lo, hi = [], [], [], []
        for i, n in enumerate(names):
            r = arms[n].get(key)
            if not r or r.get("value") is None:
                continue
            xs.append(i + offset)
            ys.append(r["value"])
            lo.append(r["value"] - (r["ci_low"] if r["ci_low"] is not None else r["value"]))
            hi.append((r["ci_high"] if r["ci_high"] is not None else r["value"]) - r["value"])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=4, label=tag)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("B's JCT / arm's JCT (above 1: faster than B)")
    ax.set_title(f"JCT ratio vs B with 95% bootstrap intervals ({label})")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return fig


def _pool_sweep(plt: Any, sweep: dict[str, Any]) -> Any:
    """Prefix reuse and mean JCT of each arm against the pool size."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    fractions = sorted(float(f) for f in sweep)
    all_names = sorted({n for a in sweep.values() for n in _run_arms(a)})
    for name in all_names:
        fx, reuse, jct = [], [], []
        for f in fractions:
            arm = sweep[f"{f:g}"].get(name, {})
            if "not_run" in arm or not arm:
                continue
            fx.append(f)
            reuse.append(arm.get("prefix_reuse_ratio") or 0.0)
            jct.append(arm.get("jct_mean_s") or 0.0)
        ax1.plot(fx, reuse, "o-", label=name)
        ax2.plot(fx, jct, "o-", label=name)
    ax1.set_xlabel("KV pool / working set")
    ax1.set_ylabel("prefix reuse ratio")
    ax1.set_ylim(0, 1.05)
    ax2.set_xlabel("KV pool / working set")
    ax2.set_ylabel("mean trajectory JCT (s)")
    for ax in (ax1, ax2):
        ax.set_xlim(0, max(1.05, max(fractions, default=1.0) * 1.1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Reuse and JCT vs pool size")
    return fig
