"""The control route's token buckets (``agentkv.vllm._ratelimit``): pure, on a fake clock."""

from __future__ import annotations

import pytest

from agentkv.protocol._wire import SALT_HEADER
from agentkv.vllm._profile import ServeProfile
from agentkv.vllm._ratelimit import (
    ENV_BURST,
    ENV_RATE,
    ControlLimit,
    TokenBuckets,
    caller_key,
    retry_after_header,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_new_caller_gets_its_burst_then_waits_for_the_refill() -> None:
    clock = Clock()
    buckets = TokenBuckets(ControlLimit(burst=3, rate_per_s=2.0), clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)  # one token at 2 per second
    assert buckets.limited == 1
    clock.now += 0.25  # half a token: still refused, the wait shrinks
    assert buckets.take("a") == pytest.approx(0.25)
    clock.now += 0.25
    assert buckets.take("a") == 0.0
    assert buckets.limited == 2


def test_a_refused_request_spends_nothing_and_the_bucket_never_exceeds_its_burst() -> None:
    clock = Clock()
    buckets = TokenBuckets(ControlLimit(burst=2, rate_per_s=1.0), clock=clock)
    buckets.take("a"), buckets.take("a")
    for _ in range(50):  # refusals do not dig the bucket deeper
        assert buckets.take("a") > 0
    clock.now += 1.0
    assert buckets.take("a") == 0.0
    clock.now += 3600.0  # an hour idle refills to the burst, not to 3,600 tokens
    assert [buckets.take("a") == 0.0 for _ in range(3)] == [True, True, False]


def test_callers_have_buckets_of_their_own() -> None:
    buckets = TokenBuckets(ControlLimit(burst=1, rate_per_s=1.0), clock=Clock())
    assert buckets.take("a") == 0.0 and buckets.take("a") > 0
    assert buckets.take("b") == 0.0  # a's flood costs b nothing


def test_the_buckets_are_bounded_and_the_least_recent_caller_is_forgotten() -> None:
    buckets = TokenBuckets(ControlLimit(burst=1, rate_per_s=1.0), max_callers=3, clock=Clock())
    for key in ("a", "b", "c"):
        buckets.take(key)
    buckets.take("a")  # refused, and now the most recent
    buckets.take("d")  # b, the least recently seen, is forgotten
    assert len(buckets) == 3
    assert buckets.take("b") == 0.0  # comes back full
    assert buckets.take("a") > 0  # a was kept (empty)


def test_rate_zero_turns_the_limit_off() -> None:
    buckets = TokenBuckets(ControlLimit(burst=1, rate_per_s=0.0), clock=Clock())
    assert all(buckets.take("a") == 0.0 for _ in range(1000))
    assert buckets.limited == 0 and len(buckets) == 0


@pytest.mark.parametrize(("burst", "rate"), [(0, 1.0), (1, -1.0), (1, float("nan"))])
def test_a_limit_that_cannot_work_is_refused(burst: int, rate: float) -> None:
    with pytest.raises(ValueError, match="burst"):
        ControlLimit(burst, rate)


def test_the_limit_travels_by_environment_both_ways() -> None:
    limit = ControlLimit(burst=7, rate_per_s=0.5)
    assert ControlLimit.from_env(limit.to_env()) == limit
    assert ControlLimit.from_env({}) == ControlLimit(100, 50.0)
    assert ControlLimit.from_env({ENV_RATE: "0"}).enabled is False
    # malformed: the defaults, never a crash of the API server
    assert ControlLimit.from_env({ENV_BURST: "lots", ENV_RATE: "1"}) == ControlLimit()
    assert ControlLimit.from_env({ENV_BURST: "0"}) == ControlLimit()


def test_the_profile_sends_its_limit_to_the_server_and_only_with_the_plugin() -> None:
    profile = ServeProfile(model="m", port=1, platform="cpu", control_burst=5, control_rate_per_s=0)
    assert ControlLimit.from_env(profile.env()) == ControlLimit(5, 0.0)
    assert ControlLimit.from_env(ServeProfile(model="m", port=1, platform="cpu").env()) == (
        ControlLimit(100, 50.0)
    )
    stock = ServeProfile(model="m", port=1, platform="cpu", agentkv_plugin=False)
    assert ENV_BURST not in stock.env() and ENV_RATE not in stock.env()


def test_the_caller_is_its_token_else_its_scope_else_its_address() -> None:
    token = {"authorization": "Bearer k1"}
    salted = {SALT_HEADER: "tenant-a"}
    assert caller_key({**token, **salted}, "10.0.0.1") == caller_key(token, "10.0.0.2")
    assert caller_key(token, None) != caller_key({"authorization": "Bearer k2"}, None)
    assert caller_key(salted, "10.0.0.1") == caller_key(salted, "10.0.0.2")
    assert caller_key(salted, None) != caller_key({SALT_HEADER: "tenant-b"}, None)
    assert caller_key({}, "10.0.0.1") != caller_key({}, "10.0.0.2")
    assert caller_key({SALT_HEADER: "bad/salt"}, "10.0.0.1") == caller_key({}, "10.0.0.1")
    assert caller_key({}, None) == "anonymous"
    for key in (caller_key(token, None), caller_key(salted, None)):
        assert "k1" not in key and "tenant-a" not in key  # MACs, never in clear


def test_retry_after_is_whole_seconds_and_at_least_one() -> None:
    assert [retry_after_header(s) for s in (0.0001, 0.5, 1.0, 1.2, 30.0)] == [
        "1", "1", "1", "2", "30",
    ]  # fmt: skip
