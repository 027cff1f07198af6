"""``agentkv gaps`` and ``agentkv gaps learn``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentkv.cli import main
from agentkv.traces import TraceTrajectory, TraceTurn, dump_trace


def _turn(arrival_s: float, tool: str | None, gap_s: float | None, exec_s: float | None = None):
    return TraceTurn(
        arrival_s=arrival_s,
        prompt_tokens=100,
        output_tokens=10,
        shared_prefix_tokens=0,
        tool_name=tool,
        tool_gap_s=gap_s,
        tool_exec_s=exec_s,
    )


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    trajs = []
    for k in range(30):
        turns = (
            _turn(0.0, "execute_bash", 2.0 + k / 100, 1.5),
            _turn(5.0, "str_replace_editor", 0.05, 0.01),
            _turn(6.0, None, None),
        )
        trajs.append(TraceTrajectory(k, turns))
    path = tmp_path / "t.jsonl"
    dump_trace(trajs, path)
    return path


def test_gaps_on_an_empty_store_says_how_to_seed_it(tmp_path, capsys):
    assert main(["gaps", "--store", str(tmp_path / "g.sqlite3")]) == 0
    assert "agentkv gaps learn" in capsys.readouterr().out


def test_learn_then_show_table_and_json(tmp_path, trace_file, capsys):
    store = str(tmp_path / "g.sqlite3")
    assert main(["gaps", "--store", store, "learn", str(trace_file), "--namespace", "oh"]) == 0
    out = capsys.readouterr().out
    assert "learned 60 idle gaps and 60 tool durations" in out
    for column in ("tool class", "p50", "p90", "p99", "ewma", "last update"):
        assert column in out
    assert "execute_bash" in out and "* (all tools)" in out

    assert main(["gaps", "--store", store, "--namespace", "oh", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(r["kind"], r["tool_class"]): r for r in doc["classes"]}
    bash = rows[("idle", "execute_bash")]
    assert bash["n"] == 30 and 2.0 <= bash["p50_s"] <= 2.3
    assert rows[("tool", "str_replace_editor")]["p90_s"] == pytest.approx(0.01)
    assert rows[("idle", "*")]["n"] == 60

    assert main(["gaps", "--store", store, "--namespace", "oh", "--kind", "tool"]) == 0
    table = capsys.readouterr().out
    assert "idle" not in table.split("\n", 2)[2]

    # learning twice adds up; another namespace stays empty
    assert main(["gaps", "--store", store, "learn", str(trace_file), "--namespace", "oh"]) == 0
    capsys.readouterr()
    assert main(["gaps", "--store", store, "--namespace", "oh", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {(r["kind"], r["tool_class"]): r["n"] for r in doc["classes"]}[("idle", "*")] == 120
    assert main(["gaps", "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["classes"] == []


def test_learn_reports_a_bad_trace(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"traj_idx": 0, "turns": [{"arrival_s": "soon"}]}\n')
    assert main(["gaps", "--store", str(tmp_path / "g.sqlite3"), "learn", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "arrival_s" in err


def test_default_store_follows_agentkv_home(tmp_path, trace_file, monkeypatch, capsys):
    monkeypatch.setenv("AGENTKV_HOME", str(tmp_path / "home"))
    assert main(["gaps", "learn", str(trace_file)]) == 0
    assert (tmp_path / "home" / "gaps.sqlite3").exists()
