"""Advisor: the coarse policy, cost-model refinement, bounds, modes, canary and shadow log."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentkv import ConfigError
from agentkv.advice._advisor import POLICY_VERSION, Advisor, ShadowLog, TrajectoryState
from agentkv.advice._costmodel import CostModel, LoadSnapshot
from agentkv.events._schema import ADVICE_REASONS
from agentkv.gaps._model import GapModel


@dataclass
class Est:
    p50: float
    p90: float
    p99: float
    n: int = 50
    confident: bool = True


class FixedGaps:
    """A gap model that answers the same estimate for every class."""

    def __init__(self, p50: float, p90: float, n: int = 50) -> None:
        self.est = Est(p50, p90, p90 * 2, n, confident=n >= 3)

    def estimate(self, tool_class: str, *, kind: str = "idle") -> Est:
        assert isinstance(tool_class, str)
        return self.est


IDLE = LoadSnapshot(kv_usage=0.1)
FULL = LoadSnapshot(kv_usage=0.97, num_waiting=8)
FULL_TIER = LoadSnapshot(kv_usage=0.97, num_waiting=8, has_lower_tier=True)


def state(**kw: object) -> TrajectoryState:
    base: dict[str, object] = {"trajectory_id": "t-1", "turn_id": 2, "tool_class": "shell"}
    base.update(kw)
    return TrajectoryState(**base)  # type: ignore[arg-type]


def test_terminal_state_releases() -> None:
    advice = Advisor(FixedGaps(1, 2)).advise(state(terminal=True))
    assert (advice.action, advice.reason) == ("release", "terminal_state")
    assert advice.policy_version == POLICY_VERSION


def test_no_gap_model_or_too_little_evidence_gives_default() -> None:
    assert Advisor().advise(state()).action == "default"
    advice = Advisor(FixedGaps(1, 2, n=1)).advise(state())
    assert (advice.action, advice.reason) == ("default", "insufficient_evidence")


def test_advice_carries_the_gap_forecast_even_before_it_has_evidence_to_act() -> None:
    """The server's predicted retention ranks paused trajectories by the forecast, so it
    travels with every advice the model can answer, also a ``default`` one (a prior)."""
    advice = Advisor(FixedGaps(1, 2, n=1)).advise(state())
    assert advice.action == "default"
    assert (advice.predicted_gap_ms, advice.predicted_gap_p90_ms) == (1000, 2000)
    assert advice.predicted_gap_p99_ms == 4000
    assert Advisor().advise(state()).predicted_gap_ms is None


def test_short_gap_retains_with_ttl_from_high_quantile() -> None:
    advice = Advisor(FixedGaps(2.0, 4.0)).advise(state(), load=IDLE)
    assert (advice.action, advice.reason) == ("retain", "short_tool_gap")
    # the TTL bounds the lease past the tail (p99 8 s here), not the p90: a bound at the
    # p90 let one return in ten find its lease expired
    assert advice.ttl_ms == 8000 * 2 + 500
    assert advice.predicted_gap_ms == 2000


def test_long_gap_under_pressure_releases_without_tier_and_offloads_with_one() -> None:
    adv = Advisor(FixedGaps(300, 900))
    assert adv.advise(state(), load=FULL).action == "release"
    off = adv.advise(state(), load=FULL_TIER)
    assert (off.action, off.reason) == ("offload", "capacity_pressure")


def test_long_gap_without_pressure_is_left_to_the_server() -> None:
    assert Advisor(FixedGaps(300, 900)).advise(state(), load=IDLE).action == "default"


def test_cost_model_keeps_a_cheap_retain_under_pressure_and_drops_an_expensive_one() -> None:
    cm = CostModel(
        bytes_per_token=1000, platform="cpu", prefill_tokens_per_s=1000, kv_capacity_bytes=1e9
    )
    adv = Advisor(FixedGaps(20, 25), cm)
    small = adv.advise(state(prefix_tokens=2000), load=FULL)  # 2 MB for 20 s vs 2 s rebuild
    assert small.action == "retain"
    big = adv.advise(state(prefix_tokens=900_000), load=FULL)  # 0.9 GB for 20 s vs 900 s
    assert big.action == "retain"
    small_pool = CostModel(
        bytes_per_token=1000, platform="cpu", prefill_tokens_per_s=1000, kv_capacity_bytes=1e8
    )
    huge_gap = Advisor(FixedGaps(400, 500), small_pool).advise(
        state(prefix_tokens=20_000), load=FULL
    )
    assert huge_gap.action == "release"


def test_cost_model_refines_a_long_cheap_gap_into_a_capped_retain() -> None:
    cm = CostModel(
        bytes_per_token=1000, platform="cpu", prefill_tokens_per_s=100, kv_capacity_bytes=1e12
    )
    advice = Advisor(FixedGaps(60, 120), cm, max_ttl_ms=600_000).advise(
        state(prefix_tokens=50_000), load=FULL
    )
    assert advice.action == "retain"
    assert advice.ttl_ms is not None and advice.ttl_ms <= 600_000


def test_prefetch_when_next_step_known_and_server_idle_enough() -> None:
    cm = CostModel(
        bytes_per_token=100_000, platform="cpu", prefill_tokens_per_s=1000, kv_capacity_bytes=1e10
    )
    adv = Advisor(FixedGaps(500, 550), cm)
    busy_queue = LoadSnapshot(kv_usage=0.5, num_waiting=1)
    advice = adv.advise(
        state(prefix_tokens=5000, next_step_known=True, p_next=0.95), load=busy_queue
    )
    assert (advice.action, advice.reason) == ("prefetch", "next_step_known")
    unlikely = adv.advise(
        state(prefix_tokens=5000, next_step_known=True, p_next=0.05), load=busy_queue
    )
    assert unlikely.action == "release"


def test_priority_for_resumed_turns_is_bounded_and_fair() -> None:
    adv = Advisor(FixedGaps(2, 4), max_priority_boost=1, fairness_service_s=60)
    assert adv.advise(state(resumed=True)).priority == -1
    assert adv.advise(state(resumed=False)).priority is None
    assert adv.advise(state(resumed=True, attained_service_s=61)).priority == 0


@given(
    p50=st.floats(0, 1e6, allow_nan=False),
    spread=st.floats(1, 100),
    tokens=st.integers(0, 10**7),
    usage=st.floats(0, 1),
    waiting=st.integers(0, 50),
    tier=st.booleans(),
    resumed=st.booleans(),
    max_ttl_ms=st.integers(1, 3_600_000),
)
def test_every_retain_has_a_capped_ttl_and_every_advice_a_reason(
    p50: float,
    spread: float,
    tokens: int,
    usage: float,
    waiting: int,
    tier: bool,
    resumed: bool,
    max_ttl_ms: int,
) -> None:
    adv = Advisor(FixedGaps(p50, p50 * spread), CostModel(), max_ttl_ms=max_ttl_ms)
    advice = adv.advise(
        state(prefix_tokens=tokens, resumed=resumed),
        load=LoadSnapshot(kv_usage=usage, num_waiting=waiting, has_lower_tier=tier),
    )
    assert advice.reason in ADVICE_REASONS
    assert advice.policy_version == POLICY_VERSION
    if advice.action == "retain":
        assert advice.ttl_ms is not None and 0 < advice.ttl_ms <= max_ttl_ms
    if advice.priority is not None:
        assert -1 <= advice.priority <= 0


def test_odd_input_falls_back_to_default() -> None:
    class Broken:
        def estimate(self, tool_class: str, *, kind: str = "idle") -> Est:
            raise RuntimeError("boom")

    advice = Advisor(Broken()).advise(state())
    assert (advice.action, advice.reason) == ("default", "insufficient_evidence")
    nan = Advisor(FixedGaps(float("nan"), float("nan"))).advise(state())
    assert nan.action == "default"
    empty = Advisor(FixedGaps(1, 2)).advise(state(trajectory_id=""))
    assert empty.action == "default"


def test_learned_gap_model_drives_retain() -> None:
    gaps = GapModel()
    for _ in range(20):
        gaps.observe("shell", 1.5)
    advice = Advisor(gaps).advise(state(tool_class="shell"), load=IDLE)
    assert advice.action == "retain"
    # an unknown class falls back to all tools; None means "not known yet"
    assert Advisor(gaps).advise(state(tool_class=None), load=IDLE).action == "retain"


def test_modes_and_canary_by_trajectory_hash() -> None:
    assert Advisor(mode="observe").mode_for("x") == "observe"
    assert Advisor(mode="shadow").mode_for("x") == "shadow"
    adv = Advisor(canary_fraction=0.25)
    modes = [adv.mode_for(f"traj-{i}") for i in range(2000)]
    assert modes == [adv.mode_for(f"traj-{i}") for i in range(2000)]  # deterministic
    share = modes.count("active") / len(modes)
    assert 0.18 < share < 0.32
    assert set(modes) == {"active", "shadow"}
    assert Advisor(canary_fraction=0.0).mode_for("x") == "shadow"


@pytest.mark.parametrize("kw", [{"mode": "loud"}, {"canary_fraction": 1.5}, {"max_ttl_ms": 0}])
def test_bad_settings_raise_config_error(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Advisor(**kw)  # type: ignore[arg-type]


def test_shadow_log_compares_advice_with_actual_return() -> None:
    adv = Advisor(FixedGaps(2, 4))
    log = ShadowLog()
    log.record(adv.advise(state(trajectory_id="a")), mode="shadow")
    log.record(adv.advise(state(trajectory_id="b")), mode="shadow")
    assert log.observe_return("a", 1000) == "retain_hit"
    assert log.observe_return("b", 60_000) == "retain_expired"
    assert log.observe_return("never", 5) is None
    released = Advisor(FixedGaps(300, 900)).advise(state(trajectory_id="c"), load=FULL)
    log.record(released, mode="active")
    assert log.observe_return("c", 5_000) == "drop_regret"
    summary = log.summary()
    assert summary["outcomes"]["retain_hit"] == 1
    assert summary["outcomes"]["shadow:retain_expired"] == 1
    assert summary["gap_abs_error_ms_p50"] is not None


_SHADOW_ADVICE = [
    Advisor(FixedGaps(2, 4)).advise(state(trajectory_id="a")),
    Advisor(FixedGaps(300, 900)).advise(state(trajectory_id="a"), load=FULL),
    Advisor(FixedGaps(300, 900)).advise(state(trajectory_id="a")),
]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d"]),
            st.one_of(st.none(), st.floats(0, 1e6)),
            st.one_of(st.none(), st.sampled_from(range(len(_SHADOW_ADVICE)))),
            st.sampled_from(["active", "shadow"]),
        ),
        max_size=200,
    )
)
def test_shadow_log_turn_equals_observe_return_then_record(
    calls: list[tuple[str, float | None, int | None, str]],
) -> None:
    """One model call's ``turn`` (classified in batches) leaves the same summary and
    pending advice, in the same eviction order, as ``observe_return`` then ``record``."""
    one, two = ShadowLog(max_trajectories=3), ShadowLog(max_trajectories=3)
    for tid, gap_ms, which, mode in calls:
        advice = None
        if which is not None:
            advice = _SHADOW_ADVICE[which].model_copy(update={"trajectory_id": tid})
        one.turn(tid, gap_ms, advice, mode)
        if gap_ms is not None:
            two.observe_return(tid, gap_ms)
        if advice is not None:
            two.record(advice, mode=mode)
    assert one.summary() == two.summary()
    assert list(one._pending.items()) == list(two._pending.items())


def test_advice_is_a_valid_cache_advice_and_out_of_bounds_values_still_fall_back() -> None:
    """Advice built on the hot path equals the validated model; an id or a priority
    beyond the schema's bounds still ends as ``default`` advice (validation applies)."""
    from agentkv.events._schema import CacheAdvice

    gaps = FixedGaps(2.0, 4.0)
    advice = Advisor(gaps).advise(state(resumed=True), load=IDLE)
    assert advice.action == "retain" and advice.priority == -1
    again = CacheAdvice.model_validate(advice.model_dump())
    assert again == advice and again.model_dump_json() == advice.model_dump_json()
    long_id = Advisor(gaps).advise(state(trajectory_id="t" * 300), load=IDLE)
    assert long_id.action == "default"
    boosted = Advisor(gaps, max_priority_boost=5000).advise(state(resumed=True), load=IDLE)
    assert boosted.action == "default"
