"""PNG plots of a benchmark run (matplotlib, headless)."""

from __future__ import annotations

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

    files: list[Path] = []
    arms = _run_arms(results["arms"])
    label = f"pool {results['pool_fraction']:g} of working set"

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
    fig.tight_layout()
    files.append(out_dir / "jct_cdf.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

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
    fig.tight_layout()
    files.append(out_dir / "ratios.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    fractions = sorted(float(f) for f in results["sweep"])
    all_names = sorted({n for a in results["sweep"].values() for n in _run_arms(a)})
    for name in all_names:
        fx, reuse, jct = [], [], []
        for f in fractions:
            arm = results["sweep"][f"{f:g}"].get(name, {})
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
    fig.tight_layout()
    files.append(out_dir / "pool_sweep.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)
    return files
