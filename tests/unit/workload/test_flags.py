"""The workload flags: declared once, taken by ``agentkv bench`` and ``agentkv sim`` alike."""

from __future__ import annotations

import argparse
import doctest
from pathlib import Path

import pytest

import agentkv.workload
from agentkv import ConfigError, cli
from agentkv.bench import _cli as bench_cli
from agentkv.sim import _cli as sim_cli
from agentkv.workload import Scaling
from agentkv.workload._flags import add_workload_arguments, scaling_from_args

SHARED = (
    "--trace",
    "--max-trajectories",
    "--max-turns",
    "--token-scale",
    "--time-scale",
    "--arrival",
    "--concurrency",
    "--pool-fraction",
    "--block-size",
    "--seed",
)


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"agentkv {command}")
    {"bench": bench_cli, "sim": sim_cli}[command].add_arguments(parser)
    return parser


def _workload_group(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    group = next(g for g in parser._action_groups if g.title == "workload")
    return list(group._group_actions)


@pytest.mark.parametrize("command", ["bench", "sim"])
def test_both_commands_take_the_workload_flags_in_one_group_each_with_help(
    command: str,
) -> None:
    actions = _workload_group(_parser(command))
    flags = [a.option_strings[0] for a in actions]
    assert flags[: len(SHARED)] == list(SHARED)
    assert all(a.help for a in actions)
    own = {
        "bench": ["--max-output-tokens", "--system-prefix-tokens", "--rate"],
        "sim": ["--arrival-rate"],
    }
    assert flags[len(SHARED) :] == own[command]


def _options_without_help(parser: argparse.ArgumentParser, where: str) -> list[str]:
    """Every option of ``parser`` and of its sub-commands, at any depth, that has no help."""
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                missing += _options_without_help(child, f"{where} {name}")
        elif not action.help and action.dest != "help":
            missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")
    return missing


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_sub_command_option_has_help(command: str) -> None:
    """Every option of every command (``gaps learn --json`` included) says what it does
    (the top-level parser registers the rest)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    module = __import__(cli.COMMANDS[command][0], fromlist=["add_arguments"])
    module.add_arguments(sub.choices[command])
    assert _options_without_help(sub.choices[command], command) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pool-fraction", "-1"], "--pool-fraction: -1 must be a number above 0"),
        (["--pool-fraction", "0.5", "0"], "--pool-fraction: 0 must be a number above 0"),
        (["--concurrency", "0"], "--concurrency: 0 must be at least 1"),
        (["--reps", "0"], "--reps: 0 must be at least 1"),
        (["--time-scale", "nan"], "--time-scale: nan must be a number above 0"),
    ],
)
def test_bench_refuses_bad_numbers_before_any_server_or_model_is_built(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A bad number is a usage error at parse time: nothing is built or started."""
    from agentkv.bench.run import _runner

    def built(*args: object, **kwargs: object) -> None:
        raise AssertionError("the bench started before its arguments were checked")

    monkeypatch.setattr(_runner, "run_bench", built)
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--trace", str(trace), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_config_refuses_a_pool_fraction_not_above_zero() -> None:
    from agentkv._errors import ConfigError
    from agentkv.bench.run._runner import BenchConfig

    with pytest.raises(ConfigError, match="pool fractions must be above 0"):
        BenchConfig(trace_path="t", pool_fractions=(0.5, -1.0))


def test_bench_defaults_are_its_own_and_sim_leaves_calibrated_flags_unset() -> None:
    """Unset in `agentkv sim`, a scaling, arrival or block flag takes the --calibrate
    run's value; the bench's defaults are the plain ones."""
    bench = _parser("bench").parse_args(["--trace", "t"])
    sim = _parser("sim").parse_args(["--trace", "t"])
    assert (bench.token_scale, bench.time_scale, bench.arrival, bench.concurrency) == (
        1.0,
        1.0,
        "closed",
        4,
    )
    assert (bench.pool_fraction, bench.block_size, bench.seed) == ([0.5], 32, 0)
    assert (sim.token_scale, sim.time_scale, sim.arrival, sim.concurrency) == (None,) * 4
    assert sim.pool_fraction == list(sim_cli.DEFAULT_POOL_FRACTIONS) and sim.block_size is None
    helps = {a.option_strings[0]: a.help for a in _workload_group(_parser("sim"))}
    assert (
        helps["--token-scale"] == "multiply every token count (default 1, or the --calibrate run's)"
    )
    assert "--calibrate" not in str(helps["--seed"])


def test_scaling_takes_the_recorded_run_and_every_given_flag_wins() -> None:
    parser = argparse.ArgumentParser()
    add_workload_arguments(parser, pool_fractions=(0.5,), block_size=16, recorded="--from")
    recorded = {"token_scale": 0.2, "max_turns": 6, "system_prefix_tokens": 64, "other": 1}
    args = parser.parse_args(["--trace", "t", "--max-turns", "3"])
    assert scaling_from_args(args, recorded) == Scaling(
        token_scale=0.2, max_turns=3, system_prefix_tokens=64
    )
    assert scaling_from_args(args) == Scaling(max_turns=3)
    bench = _parser("bench").parse_args(["--trace", "t", "--max-output-tokens", "9"])
    assert scaling_from_args(bench) == Scaling(max_output_tokens=9)
    with pytest.raises(SystemExit):  # a usage error at parse time now
        _parser("bench").parse_args(["--trace", "t", "--token-scale", "0"])
    with pytest.raises(ConfigError):
        Scaling(token_scale=0)


def test_the_package_example_runs() -> None:
    assert doctest.testmod(agentkv.workload).failed == 0
