"""``agentkv lint FILE``: table output and exit status (0 clean, 1 prefix-breaking, 2 bad input)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentkv.cli import main
from tests.support.agent_turns import TURN_1, TURN_2, TURN_3


def _write(path: Path, bodies: list[Any]) -> str:
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies), encoding="utf-8")
    return str(path)


def test_clean_file_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", _write(tmp_path / "ok.jsonl", [TURN_1, TURN_2, TURN_3])]) == 0
    assert "3 requests, no findings" in capsys.readouterr().out


def test_prefix_breaking_file_exits_one_and_prints_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rewritten = copy.deepcopy(TURN_3)
    rewritten["messages"][3]["content"] = "a.py"
    path = _write(tmp_path / "bad.jsonl", [TURN_1, TURN_2, rewritten])
    assert main(["lint", path]) == 1
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert header.split()[:5] == ["line", "severity", "kind", "location", "offset"]
    assert any("history_rewritten" in r and r.startswith("3 ") and "error*" in r for r in rows)
    assert "prefix-breaking (marked *)" in out


def test_warnings_only_exit_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = copy.deepcopy(TURN_1)
    body["messages"][0]["content"] += " Today is 2025-03-04."
    assert main(["lint", _write(tmp_path / "warn.jsonl", [body])]) == 0
    assert "volatile_content" in capsys.readouterr().out


def test_json_output_and_batch_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    changed = {**TURN_2, "tools": TURN_2["tools"][:1]}
    lines = [{"custom_id": "a", "body": TURN_1}, {"custom_id": "b", "body": changed}]
    assert main(["lint", "--json", _write(tmp_path / "batch.jsonl", lines)]) == 1
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["kind"] for r in records} == {"tools_changed", "prefix_divergence"}
    assert all(r["line"] == 2 and r["prefix_breaking"] for r in records)


def test_session_key_compares_only_lines_of_the_same_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = {
        "messages": [
            {"role": "system", "content": "Another agent."},
            {"role": "user", "content": "x"},
        ],
        "tools": TURN_1["tools"],
    }
    bodies = [
        {**TURN_1, "metadata": {"session": "a"}},
        {**other, "metadata": {"session": "b"}},
        {**TURN_2, "metadata": {"session": "a"}},
    ]
    path = _write(tmp_path / "mixed.jsonl", bodies)
    assert main(["lint", path, "--session-key", "metadata.session"]) == 0
    assert main(["lint", path]) == 1  # without it, line 2 looks like a rewrite of line 1
    capsys.readouterr()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"messages": []}\n{not json\n', ":2: not valid JSON"),
        ('{"prompt": "x"}\n', ":1: expected a chat request object with a 'messages' list"),
        ('{"messages": [], "tools": {}}\n', ":1: 'tools' must be a list"),
        ("[1, 2]\n", ":1: expected a chat request object"),
    ],
)
def test_unreadable_input_exits_two_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, needle: str
) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(content, encoding="utf-8")
    assert main(["lint", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentkv lint: ") and needle in err


def test_missing_and_binary_files_exit_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lint", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["lint", str(binary)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_console_entry_point_reads_stdin() -> None:
    lines = "".join(json.dumps(b) + "\n" for b in [TURN_1, TURN_2])
    proc = subprocess.run(
        [sys.executable, "-m", "agentkv", "lint", "-"],
        input=lines,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 requests, no findings" in proc.stdout
