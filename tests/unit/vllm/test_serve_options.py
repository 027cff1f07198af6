"""The profile fields and ``agentkv serve`` flags of the server's security bounds and its
policy mode reach the plugin and the API server (pure: argv and environment only)."""

from __future__ import annotations

import argparse

import pytest

from agentkv._errors import ConfigError
from agentkv.vllm import _cli
from agentkv.vllm._profile import ServeProfile
from agentkv.vllm._settings import SchedSettings


def _opts(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    _cli.add_arguments(parser)
    return _cli._options(parser.parse_args(argv))[1]


def test_max_client_priority_is_a_profile_field_and_a_serve_flag() -> None:
    """docs/vllm.md listed ``max_client_priority`` as a profile field; it was only an
    environment variable of the engine process."""
    opts = _opts(["--max-client-priority", "50"])
    profile = ServeProfile(**opts, platform="cpu")  # type: ignore[arg-type]
    assert profile.sched_settings().max_client_priority == 50
    assert profile.env()["AGENTKV_SCHED_MAX_CLIENT_PRIORITY"] == "50"
    assert ServeProfile(platform="cpu").sched_settings().max_client_priority == 1000
    with pytest.raises(ConfigError, match="max_client_priority"):
        ServeProfile(max_client_priority=-1)


def test_the_policy_mode_is_a_profile_field_and_a_serve_flag() -> None:
    opts = _opts(["--policy-mode", "shadow"])
    env = ServeProfile(**opts, platform="cpu").env()  # type: ignore[arg-type]
    assert env["AGENTKV_SCHED_MODE"] == "shadow"
    assert SchedSettings.from_env(env).mode == "shadow"
    assert SchedSettings.from_env({"AGENTKV_SCHED_MODE": "sideways"}).mode == "act"
    assert ServeProfile(platform="cpu").sched_settings().mode == "act"
    with pytest.raises(ConfigError, match="policy_mode"):
        ServeProfile(policy_mode="sideways")  # type: ignore[arg-type]


def test_the_new_salt_bound_is_a_profile_field_and_a_serve_flag() -> None:
    opts = _opts(["--new-salt-burst", "8", "--new-salt-rate-per-s", "0"])
    env = ServeProfile(**opts, platform="cpu").env()  # type: ignore[arg-type]
    assert (env["AGENTKV_NEW_SALT_BURST"], env["AGENTKV_NEW_SALT_RATE_PER_S"]) == ("8", "0.0")
    unset = _opts([])
    assert ServeProfile(**unset, platform="cpu").salt_limit() == ServeProfile().salt_limit()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="new_salt_burst"):
        ServeProfile(new_salt_burst=0)
