"""``agentkv serve`` parses like ``vllm serve``: unknown flags pass through to vLLM."""

from __future__ import annotations

import argparse

import pytest

from agentkv.cli import build_parser, main
from agentkv.vllm import _cli, _flags
from tests.support.bench_fakes import platform_info
from tests.support.requires import require_vllm


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


def test_kv_cache_dtype_takes_every_fp8_variant_the_profile_takes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--kv-cache-dtype fp8_e5m2`` is accepted, as vLLM and ``ServeProfile`` take it, on
    a CPU that has FP8 KV (the host's own CPU is not consulted); on one without, the
    command fails with the reason and the fix."""
    from agentkv.vllm import _platform

    monkeypatch.setattr(_platform, "detect_platform", lambda: platform_info("cpu"))
    assert main(["serve", "m", "--kv-cache-dtype", "fp8_e5m2", "--print-argv"]) == 0
    argv = capsys.readouterr().out.split()
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e5m2"
    no_fp8 = platform_info("cpu", fp8=False)
    monkeypatch.setattr(_platform, "detect_platform", lambda: no_fp8)
    assert main(["serve", "m", "--kv-cache-dtype", "fp8_e5m2", "--print-argv"]) == 1
    assert "kv_cache_dtype='auto'" in capsys.readouterr().err


def test_without_vllms_parser_known_boolean_flags_leave_the_model_positional() -> None:
    """With the built-in table (no vLLM), ``--trust-remote-code MODEL`` keeps MODEL as
    the model; a flag nobody knows is judged by shape, as before."""
    flags = _flags._fallback("test")
    assert not flags.complete
    ours, extra = _cli.split_args(
        ["--trust-remote-code", "org/model", "--some-new-flag", "v", "--port", "9"],
        serve_parser(),
        flags,
    )
    assert ours == ["org/model", "--port", "9"]
    assert extra == ["--trust-remote-code", "--some-new-flag", "v"]


def test_no_vllm_installed_gives_the_fallback_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_flags, "installed_vllm", lambda: None)
    flags = _flags.get_vllm_flags()
    assert not flags.complete and "not installed" in flags.source
    assert flags.get("--trust-remote-code") == _flags.FlagSpec(takes_value=False)


@pytest.fixture(scope="module")
def vllm_flags() -> _flags.VLLMFlags:
    require_vllm()
    flags = _flags.get_vllm_flags()
    assert flags.complete, flags.source
    return flags


@pytest.mark.slow
def test_vllms_own_parser_says_which_flags_take_values(vllm_flags: _flags.VLLMFlags) -> None:
    """Read from vLLM's parser: booleans take no value, so the item after them is MODEL;
    valued flags take theirs even when it looks like a flag value; vLLM's spellings
    (underscores, dotted JSON keys, short forms) are understood."""
    parser = serve_parser()
    assert vllm_flags.get("--trust-remote-code") == _flags.FlagSpec(takes_value=False)
    args = parser.parse_args(["--trust-remote-code", "org/model", "--max_num_seqs", "8"])
    assert args.model == "org/model"
    assert args.vllm_args == ["--trust-remote-code", "--max_num_seqs", "8"]
    args = parser.parse_args(["-tp", "2", "--compilation-config.mode", "3", "m", "-O3"])
    assert (args.model, args.vllm_args) == (
        "m",
        ["-tp", "2", "--compilation-config.mode", "3", "-O3"],
    )
    args = parser.parse_args(["--no-enable-prefix-caching", "m", "--lora-modules", "a=p", "b=q"])
    assert (args.model, args.vllm_args) == (
        "m",
        ["--no-enable-prefix-caching", "--lora-modules", "a=p", "b=q"],
    )


@pytest.mark.slow
def test_misspelt_flags_and_bad_vllm_choices_are_refused_before_anything_starts(
    vllm_flags: _flags.VLLMFlags, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "m", "--max-num-seq", "8", "--print-argv"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--max-num-seq" in err and "did you mean --max-num-seqs" in err
    with pytest.raises(SystemExit):
        main(["serve", "m", "--uvicorn-log-level", "loud", "--print-argv"])
    assert "invalid choice 'loud'" in capsys.readouterr().err


@pytest.mark.slow
def test_vllms_flag_table_is_read_once_per_version(vllm_flags: _flags.VLLMFlags) -> None:
    found = _flags.installed_vllm()
    assert found is not None
    path = _flags._cache_file(*found)
    assert path.exists()
    assert _flags.get_vllm_flags() == vllm_flags
