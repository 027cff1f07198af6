"""``agentkv serve`` parses like ``vllm serve``: unknown flags pass through to vLLM."""

from __future__ import annotations

import argparse

import pytest

from agentkv.cli import build_parser, main
from agentkv.vllm import _cli


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentkv serve")
    _cli.add_arguments(parser)
    return parser


@pytest.mark.parametrize(
    ("argv", "model", "port", "vllm"),
    [
        (["--max-num-seqs", "8"], None, None, ["--max-num-seqs", "8"]),
        (
            ["m", "--tensor-parallel-size", "2", "--port", "9"],
            "m",
            9,
            ["--tensor-parallel-size", "2"],
        ),
        (["m", "--enable-chunked-prefill", "--port=9"], "m", 9, ["--enable-chunked-prefill"]),
        (["m", "--seed=3", "--", "--port", "7"], "m", None, ["--seed=3", "--port", "7"]),
        (["--", "--max-num-seqs", "4"], None, None, ["--max-num-seqs", "4"]),
    ],
)
def test_unknown_flags_go_to_vllm(
    argv: list[str], model: str | None, port: int | None, vllm: list[str]
) -> None:
    args = serve_parser().parse_args(argv)
    assert (args.model, args.port, args.vllm_args) == (model, port, vllm)


def test_every_option_has_help_and_usage_shows_the_pass_through() -> None:
    parser = serve_parser()
    assert parser.usage is not None and "any vllm serve flag" in parser.usage
    missing = [
        a.option_strings or a.dest for a in parser._actions if a.help is None and a.dest != "help"
    ]
    assert missing == []
    assert isinstance(build_parser(), argparse.ArgumentParser)


def test_print_argv_carries_the_pass_through_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--max-num-seqs", "8", "--port", "9000", "--print-argv"]) == 0
    argv = capsys.readouterr().out.split()
    at = argv.index("--max-num-seqs")
    assert argv[at + 1] == "8" and argv[argv.index("--port") + 1] == "9000"


def test_model_flag_names_the_model_and_stays_out_of_vllms_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--model M`` is the same as MODEL: the profile resolves it (an embedded name to its
    checkpoint and served name) instead of vLLM receiving a second ``--model``."""
    assert main(["serve", "--model", "agentkv-tiny", "--port", "9000", "--print-argv"]) == 0
    argv = capsys.readouterr().out.split()
    assert (
        argv.count("--model") == 1 and argv[argv.index("--served-model-name") + 1] == "agentkv-tiny"
    )
    assert main(["serve", "m1", "--model", "m2", "--print-argv"]) == 1
    assert "two models given" in capsys.readouterr().err
