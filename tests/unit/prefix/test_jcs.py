"""canonical_json is RFC 8785 (JCS): the bytes any conforming implementation gives.

Checked against the ``rfc8785`` package (a dev dependency) on generated JSON values;
agentkv itself does not depend on it.
"""

from __future__ import annotations

from typing import Any

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv import canonical_json
from agentkv.prefix._stable import es_number

I_JSON_INT = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
KEYS = st.text(min_size=0, max_size=6)
JSON: Any = st.recursive(
    st.none() | st.booleans() | I_JSON_INT | FLOATS | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_canonical_json_matches_rfc8785(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=500, deadline=None)
@given(FLOATS)
def test_float_text_is_ecmascript(value: float) -> None:
    assert es_number(value) == rfc8785.dumps(value).decode()


def test_non_bmp_keys_sort_by_utf16_units() -> None:
    value = {"\U0001f600": 1, "\ufb33": 2, "a": 3}
    assert canonical_json(value) == rfc8785.dumps(value)
    assert list(canonical_json(value).decode()).index("a") < 4
