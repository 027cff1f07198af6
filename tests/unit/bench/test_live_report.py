"""The live report from fabricated repetitions: outcomes, agreement, per-task figures, gates."""

from __future__ import annotations

from typing import Any

from agentkv.bench.live._agent import AgentOptions, LiveRun, StepRecord, TaskRun
from agentkv.bench.live._runner import LiveConfig, LiveRep
from agentkv.bench.live._tasks import load_tasks
from agentkv.bench.report._live import build_live_results, render_live_markdown


def _task(
    task_id: str, outcome: str, jct_s: float, outputs: list[str], tenant: str = "t"
) -> TaskRun:
    steps = [StepRecord(i, "tool", o, [i], 0.1, 100 + 10 * i, 64, 8) for i, o in enumerate(outputs)]
    return TaskRun(task_id, tenant, 0.0, jct_s, steps, "x", outcome)


def _rep(arm: str, rep: int, tasks: list[TaskRun], probe: list[Any] | None = None) -> LiveRep:
    stats = {
        "eligible_prefix_tokens": 100,
        "reused_prefix_tokens": 90,
        "recomputed_prefix_tokens": 10,
        "prefill_tokens": 50,
    }
    return LiveRep(
        arm, rep, 0, LiveRun(tasks, 1.0, [t.task_id for t in tasks]), {}, {}, stats, "fresh", probe
    )


def _raw(reps: list[LiveRep], arms: tuple[str, ...]) -> dict[str, Any]:
    cfg = LiveConfig(arms=arms, reps=2, agent=AgentOptions(concurrency=2))
    pool = {
        "pool_fraction": 0.3,
        "pool_blocks": 10,
        "pool_tokens": 320,
        "limit_pool_blocks": 40,
        "block_size": 32,
        "max_model_len": 320,
        "working_set_tokens_estimate": 1000,
        "tasks_in_flight": 2,
    }
    return {
        "config": cfg,
        "tasks": load_tasks(),
        "platform": "cpu",
        "model_dir": None,
        "pool": pool,
        "argv": {},
        "reps": reps,
        "not_run": {"C": "no FP8 here"},
        "descriptions": {a: a for a in arms},
        "fp8_arms": [],
        "fp8_kv": {"supported": False, "reason": "no AVX-512"},
        "agreement_prompts": 2,
    }


def test_outcomes_agreement_and_gates_come_from_the_runs() -> None:
    b = [
        _rep(
            "B",
            r,
            [_task("a", "accepted", 1.0, ["x", "y"]), _task("b", "rejected", 2.0, ["z"])],
            probe=[[1, 2], [3]] if r == 0 else None,
        )
        for r in range(2)
    ]
    e = [
        _rep(
            "E",
            0,
            [_task("a", "accepted", 0.9, ["x", "y"]), _task("b", "rejected", 1.8, ["z"])],
            probe=[[1, 2], [4]],
        ),
        _rep("E", 1, [_task("a", "accepted", 0.9, ["x", "q"]), _task("b", "rejected", 1.8, ["z"])]),
    ]
    results = build_live_results(_raw([*b, *e], ("B", "C", "E")))
    assert results["kind"] == "live"
    arm = results["arms"]["E"]
    assert (arm["accepted"], arm["tasks_run"], arm["turns_per_task"]) == (2, 4, 1.5)
    assert arm["outcomes"] == {"accepted": 2, "rejected": 2, "step_limit": 0, "failed": 0}
    assert arm["jct_per_accepted_s"] == 2.7
    assert arm["prefix_reuse_ratio"] == 0.9 and arm["rebuild_tax"] == 0.2
    ag = arm["agreement"]
    assert ag["live_vs_B"] == 0.75 and ag["B_self"] == 1.0
    assert ag["live_differs"] == [{"rep": 1, "task": "a", "first_step": 1}]
    assert ag["probe_differs_at"] == [1] and ag["probe_vs_B"] == 0.5
    assert results["arms"]["C"] == {"not_run": "no FP8 here"}
    assert results["gate_failure"].startswith("gate failed: arm E output_agreement")
    assert (
        results["manifest"]["pool"]["working_set_tokens_measured_B"] == 226
    )  # 2 in flight x mean longest (118, 108)
    text = render_live_markdown(results)
    assert "live agents" in text and "FP8 KV is not available on this build: no AVX-512" in text
    assert "E: rep 1 task a differs from B from step 1" in text
    assert "| E | output_agreement | fail |" in text
