"""The advice codec: a CacheAdvice's wire object, spelled by the schema, reads back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentkv.events._schema import ADVICE_ACTIONS, ADVICE_REASONS, CacheAdvice
from agentkv.protocol._advice import ADVICE_KEYS, decode_advice, encode_advice


def _advice(**fields: object) -> CacheAdvice:
    return CacheAdvice(**fields)  # type: ignore[arg-type]


_GAP = st.one_of(st.none(), st.floats(0, 1e12), st.integers(0, 10**12))


@given(
    advice=st.builds(
        _advice,
        trajectory_id=st.text(min_size=1, max_size=256),
        action=st.sampled_from(ADVICE_ACTIONS),
        ttl_ms=st.one_of(st.none(), st.integers(0, 10**12)),
        priority=st.one_of(st.none(), st.integers(-1000, 1000)),
        reason=st.sampled_from(ADVICE_REASONS),
        policy_version=st.text(min_size=1, max_size=64),
        turn_id=st.one_of(st.none(), st.integers(0, 10**9)),
        predicted_gap_ms=_GAP,
        predicted_gap_p90_ms=_GAP,
        predicted_gap_p99_ms=_GAP,
    )
)
def test_advice_round_trips(advice: CacheAdvice) -> None:
    wire = encode_advice(advice)
    assert set(wire) <= set(ADVICE_KEYS.values())  # the schema's own aliases
    assert CacheAdvice.model_validate(wire) == advice  # the schema reads it back too
    fields = decode_advice(wire)
    assert (fields.trajectory_id, fields.turn_id, fields.action) == (
        advice.trajectory_id, advice.turn_id, advice.action,
    )  # fmt: skip
    assert (fields.ttl_ms, fields.priority, fields.reason, fields.policy_version) == (
        advice.ttl_ms, advice.priority, advice.reason, advice.policy_version,
    )  # fmt: skip
    for got, sent in zip(
        (fields.gap_ms, fields.gap_p90_ms, fields.gap_p99_ms),
        (advice.predicted_gap_ms, advice.predicted_gap_p90_ms, advice.predicted_gap_p99_ms),
        strict=True,
    ):
        assert got == (None if sent is None else float(sent))


def test_the_keys_are_read_from_the_schema() -> None:
    assert ADVICE_KEYS["ttl_ms"] == "ttlMs"
    assert ADVICE_KEYS["predicted_gap_p90_ms"] == "predictedGapP90Ms"
