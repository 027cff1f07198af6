"""The promotion gate on fabricated results: each gate fails only beyond its interval."""

from __future__ import annotations

from typing import Any

from agentkv.bench.report._gate import GATES, evaluate_gates, gate_failure, render_gates


def _iv(value: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": value, "ci_low": lo, "ci_high": hi}


def _arm(**over: Any) -> dict[str, Any]:
    arm = {
        "accepted_diff_vs_B": _iv(0.0, -0.1, 0.1),
        "p95_ratio_vs_B": _iv(1.1, 0.95, 1.2),
        "worst_tenant_ratio_vs_B": _iv(1.05, 0.9, 1.2),
        "ratio_vs_B": _iv(1.1, 1.0, 1.2),
        "agreement": {"live_vs_B": 1.0, "B_self": 1.0, "probe_vs_B": 1.0, "probe_differs_at": []},
    }
    arm.update(over)
    return arm


def _live(arms: dict[str, Any], fp8: list[str] | None = None) -> dict[str, Any]:
    return {"kind": "live", "fp8_arms": fp8 or [], "arms": {"B": _arm(), "L": _arm(), **arms}}


def _status(gates: list[dict[str, str]], arm: str, gate: str) -> str:
    return next(g["status"] for g in gates if g["arm"] == arm and g["gate"] == gate)


def test_an_arm_within_its_intervals_passes_every_gate_and_B_and_L_are_not_gated() -> None:
    gates = evaluate_gates(_live({"E": _arm()}))
    assert {g["arm"] for g in gates} == {"E"}
    assert [g["gate"] for g in gates] == list(GATES)
    assert all(g["status"] == "pass" for g in gates)
    assert gate_failure(gates) is None


def test_each_gate_fails_when_the_whole_interval_is_worse_than_B() -> None:
    cases = {
        "accepted_outcomes": {"accepted_diff_vs_B": _iv(-0.3, -0.5, -0.1)},
        "p95_jct": {"p95_ratio_vs_B": _iv(0.8, 0.7, 0.9)},
        "worst_tenant_jct": {"worst_tenant_ratio_vs_B": _iv(0.8, 0.7, 0.95)},
        "output_agreement": {"agreement": {"live_vs_B": 0.75, "B_self": 1.0}},
    }
    for gate, over in cases.items():
        gates = evaluate_gates(_live({"E": _arm(**over)}))
        assert [g["gate"] for g in gates if g["status"] == "fail"] == [gate]
        reason = gate_failure(gates)
        assert reason is not None and reason.startswith(f"gate failed: arm E {gate}: ")
        assert "\n" not in reason


def test_an_overlapping_interval_is_not_a_failure() -> None:
    gates = evaluate_gates(_live({"E": _arm(p95_ratio_vs_B=_iv(0.9, 0.8, 1.01))}))
    assert _status(gates, "E", "p95_jct") == "pass"


def test_agreement_is_judged_against_Bs_own_repetitions_and_names_differing_prompts() -> None:
    noisy = {"live_vs_B": 0.9, "B_self": 0.9, "probe_vs_B": 1.0, "probe_differs_at": []}
    assert (
        _status(evaluate_gates(_live({"E": _arm(agreement=noisy)})), "E", "output_agreement")
        == "pass"
    )
    probe = {"live_vs_B": 1.0, "B_self": 1.0, "probe_vs_B": 0.9, "probe_differs_at": [3]}
    gates = evaluate_gates(_live({"F": _arm(agreement=probe)}))
    assert _status(gates, "F", "output_agreement") == "fail"
    assert "differ at [3]" in (gate_failure(gates) or "")


def test_an_fp8_arm_reports_agreement_and_is_judged_on_accepted_outcomes() -> None:
    changed = {"live_vs_B": 0.5, "B_self": 1.0, "probe_vs_B": 0.5, "probe_differs_at": [0, 2]}
    gates = evaluate_gates(_live({"G": _arm(agreement=changed)}, fp8=["G"]))
    assert _status(gates, "G", "output_agreement") == "n/a"
    assert gate_failure(gates) is None
    worse = _arm(agreement=changed, accepted_diff_vs_B=_iv(-0.4, -0.6, -0.2))
    assert "accepted_outcomes" in (gate_failure(evaluate_gates(_live({"G": worse}, ["G"]))) or "")


def test_no_interval_compares_nothing_and_not_run_arms_are_skipped() -> None:
    arm = _arm(p95_ratio_vs_B={"value": 0.5, "ci_low": None, "ci_high": None})
    gates = evaluate_gates(_live({"E": arm, "C": {"not_run": "no FP8"}}))
    assert _status(gates, "E", "p95_jct") == "pass"
    assert "no interval" in next(g["detail"] for g in gates if g["gate"] == "p95_jct")
    assert {g["arm"] for g in gates} == {"E"}


def test_a_replay_is_gated_on_latency_only() -> None:
    replay = {
        "arms": {
            "B": {},
            "E": {"p95_ratio_vs_B": _iv(1.0, 0.9, 1.1), "ratio_vs_B": _iv(0.7, 0.6, 0.8)},
        }
    }
    gates = evaluate_gates(replay)
    assert _status(gates, "E", "accepted_outcomes") == "n/a"
    assert _status(gates, "E", "output_agreement") == "n/a"
    assert _status(gates, "E", "worst_tenant_jct") == "fail"  # one tenant: its mean JCT
    lines = render_gates(gates)
    assert lines[0].startswith("| arm | gate | result |") and len(lines) == 2 + len(GATES)


def test_a_replays_gates_are_added_to_its_results_and_report(tmp_path: Any) -> None:
    import json

    from agentkv.bench._cli import _gate_replay

    results = {"arms": {"B": {}, "E": {"p95_ratio_vs_B": _iv(0.8, 0.7, 0.9),
                                      "ratio_vs_B": _iv(1.0, 0.9, 1.1)}}}
    files = [tmp_path / "results.json", tmp_path / "report.md"]
    files[1].write_text("# report\n", "utf-8")
    reason = _gate_replay(results, files)
    assert reason is not None and reason.startswith("gate failed: arm E p95_jct")
    saved = json.loads(files[0].read_text("utf-8"))
    assert saved["gate_failure"] == reason and len(saved["gates"]) == len(GATES)
    report = files[1].read_text("utf-8")
    assert "## Gates" in report and "| E | p95_jct | fail |" in report


def test_bench_without_a_trace_or_live_says_what_to_give(capsys: Any) -> None:
    from agentkv.cli import main

    assert main(["bench"]) == 2
    assert "give --trace FILE (a trace to replay) or --live" in capsys.readouterr().err
