"""Gap forecasts as the server receives them: from the wire into the core (pure)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from agentkv.residency import Forecast, PolicyCore, PolicySettings

_ms = st.one_of(st.none(), st.floats(min_value=0, max_value=1e9, allow_nan=False))


def test_quantiles_sent_are_the_forecast() -> None:
    f = Forecast.from_hint_ms(1000, 4000, 20_000, ttl_ms=99_000)
    assert f == Forecast(1.0, 4.0, 20.0)


def test_without_quantiles_the_ttl_is_the_forecast_and_without_either_there_is_none() -> None:
    assert Forecast.from_hint_ms(None, ttl_ms=8000) == Forecast.from_ttl_ms(8000)
    assert Forecast.from_hint_ms(None) is None


def test_a_missing_p99_extends_the_log_normal_through_p50_and_p90() -> None:
    f = Forecast.from_hint_ms(1000, 4000)
    assert f is not None and f.p90_s == 4.0
    # log-normal: log p99 = log p50 + (z99 / z90) * (log p90 - log p50)
    assert math.isclose(math.log(f.p99_s), (2.3263478740408408 / 1.2815515655446004) * math.log(4))


def test_a_missing_p90_is_the_ttl() -> None:
    f = Forecast.from_hint_ms(1000, ttl_ms=3000)
    assert f is not None and f.p90_s == 3.0


@given(_ms, _ms, _ms, _ms)
def test_a_forecast_from_the_wire_is_monotone_and_non_negative(
    p50: float | None, p90: float | None, p99: float | None, ttl: float | None
) -> None:
    f = Forecast.from_hint_ms(p50, p90, p99, ttl)
    if p50 is None and ttl is None:
        assert f is None
        return
    assert f is not None
    assert 0 <= f.p50_s <= f.p90_s <= f.p99_s < math.inf


def test_a_better_forecast_replaces_a_paused_trajectorys_and_keeps_its_pause() -> None:
    core: PolicyCore[int] = PolicyCore(PolicySettings(), num_blocks=100)
    s = core.book.state("t", 0.0)
    assert not core.update_forecast(s, Forecast(1, 2, 3))  # not paused: nothing to refine
    core.on_finished(s, 10.0, Forecast(1.0, 2.0, 4.0))
    assert core.returns.expected_return_s(s, 10.0) == 11.0
    assert core.update_forecast(s, Forecast(30.0, 60.0, 90.0))
    assert s.paused_at_s == 10.0
    assert core.returns.expected_return_s(s, 10.5) == 40.0


def test_forecasts_shift_by_how_late_trajectories_come_back_against_their_median() -> None:
    """The client forecasts the gap it sees; the server's pause is longer by the time a
    call spends between engine and client. The core learns that lag from returns."""
    core: PolicyCore[int] = PolicyCore(PolicySettings(), num_blocks=100)
    t = 0.0
    for i in range(core.returns.MIN_LAG_SAMPLES):
        s = core.book.state(f"t{i}", t)
        core.on_finished(s, t, Forecast(1.0, 2.0, 4.0))
        core.on_waiting(s, t + 1.5)  # every one back 0.5 s after its forecast median
        t += 10.0
    assert core.returns.return_lag_s == 0.5
    s = core.book.state("x", t)
    core.on_finished(s, t, Forecast(1.0, 2.0, 4.0))
    assert core.returns.expected_return_s(s, t) == t + 1.5
    assert core.stats()["return_lag_ms"] == 500.0


def test_too_few_returns_or_the_setting_off_leave_forecasts_alone() -> None:
    for settings, n in ((PolicySettings(), 3), (PolicySettings(return_lag=False), 20)):
        core: PolicyCore[int] = PolicyCore(settings, num_blocks=100)
        for i in range(n):
            s = core.book.state(f"t{i}", 0.0)
            core.on_finished(s, 0.0, Forecast(1.0, 2.0, 4.0))
            core.on_waiting(s, 3.0)
        assert core.returns.return_lag_s == 0.0
        assert core.returns.shifted(1.0) == 1.0


def test_forecasts_that_run_long_do_not_shift_short_ones_to_due_now() -> None:
    """Returns earlier than their forecast median (a cold model's priors run long) are an
    error of the forecasts, not a negative transit time: the lag stays at 0, so a short
    forecast of another class keeps its length and the lease is not read as due now."""
    core: PolicyCore[int] = PolicyCore(PolicySettings(), num_blocks=100)
    t = 0.0
    for i in range(2 * core.returns.MIN_LAG_SAMPLES):
        s = core.book.state(f"t{i}", t)
        core.on_finished(s, t, Forecast(0.7, 1.2, 2.0))
        core.on_waiting(s, t + 0.1)  # back 0.6 s before the forecast median
        t += 10.0
    assert core.returns.return_lag_s == 0.0
    assert core.stats()["return_lag_ms"] == 0.0
    s = core.book.state("short", t)
    core.on_finished(s, t, Forecast(0.04, 0.08, 0.2))
    assert core.returns.expected_return_s(s, t) == t + 0.04
