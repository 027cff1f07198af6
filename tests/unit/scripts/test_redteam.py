"""scripts/redteam.py: the red team's own server starts on AVX-512/AMX CPUs, every finding
of issue 31 has a row (or the test that checks it in the client), and 5xx answers are
counted per row (pure parts; the attacks themselves need a server)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import httpx

ROOT = Path(__file__).resolve().parents[3]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("redteam", ROOT / "scripts" / "redteam.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rt = _load()

#: Issue 31's findings, by the labels the script gives them.
ISSUE_31 = {"H1", "H2", "H3", "M1", "M2", "M3", "M4", "M5", "M6", "M7", "M8", "M9", "M10",
            "L1", "L2", "L3", "L4", "L5", "L6", "R1", "R2"}  # fmt: skip


def test_its_own_server_does_not_use_enforce_eager() -> None:
    """enforce_eager's CPU worker dies with SIGILL on AVX-512/AMX hosts."""
    assert not rt.SERVER_OPTIONS.get("enforce_eager")
    from agentkv.vllm._profile import ServeProfile

    argv = ServeProfile(platform="cpu", model="/m", port=1, **rt.SERVER_OPTIONS).to_argv()
    assert "--enforce-eager" not in argv
    assert argv.count(rt.ATTACKER_KEY) == 1  # two keys: two sources


def test_every_finding_of_issue_31_has_a_row_or_a_client_test() -> None:
    team = rt.RedTeam("http://127.0.0.1:9", "m", "k", "k2")
    assert team.attacker_key == "k2"
    names = {a.__name__ for a in team.attacks()}
    labels = {f.split()[1] for f, _, _ in rt.CLIENT_SIDE}
    server_rows = {
        "H2": "two_tenants_one_id", "H3": "salt_flood", "M1": "two_salts_at_share",
        "M2": "aborted_skipping_turns", "M3": "tiny_forecast", "M4": "crashed_client_ttl",
        "M5": "client_priority", "M6": "guessed_salt", "M9": "control_flood",
        "L1": "huge_numbers", "L2": "deep_hint", "L6": "retried_turn_zero",
        "R1": "policy_mode", "R2": "hint_outcomes",
    }  # fmt: skip
    assert set(server_rows.values()) <= names and "sybil_source_share" in names
    assert labels | set(server_rows) == ISSUE_31
    for _, _, test in rt.CLIENT_SIDE:
        path, name = test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8")
    team.close()


def test_5xx_answers_are_counted_and_shown() -> None:
    errors = rt.Errors()
    for status in (200, 429, 500, 503):
        errors.hook(httpx.Response(status))
    assert errors.count == 2
    row = rt.Row("31 L1", "x", None, None, errors_5xx=2)
    table = rt.table([row])
    assert "| 5xx |" in table and "| 2 |" in table and "31 L4" in table
