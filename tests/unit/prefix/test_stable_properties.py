"""Property tests: stable_tools and canonical_json are idempotent and order-independent."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv import canonical_json, stable_tools

_keys = st.text(min_size=1, max_size=8)
_scalars = st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=10)
_floats = st.floats(allow_nan=False, allow_infinity=False)
_json = st.recursive(
    _scalars | _floats,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=12,
)
_schemas = st.dictionaries(_keys, _json, max_size=4)
_names = st.text(
    alphabet=st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=12
)


@st.composite
def _tool_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(_names, min_size=0, max_size=4, unique=True))
    tools: list[dict[str, Any]] = []
    for name in names:
        function: dict[str, Any] = {"name": name, "parameters": draw(_schemas)}
        if draw(st.booleans()):
            function["description"] = draw(st.text(max_size=30))
        if draw(st.booleans()):
            tools.append({"type": "function", "function": function})
        else:
            tools.append(function)
    return tools


def _shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every dict's insertion order shuffled (lists untouched)."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _rendered(tools: list[dict[str, Any]]) -> str:
    return json.dumps(tools, ensure_ascii=False)


@settings(max_examples=40, deadline=None)
@given(_tool_lists())
def test_stable_tools_is_idempotent(tools: list[dict[str, Any]]) -> None:
    once = stable_tools(tools)
    assert _rendered(stable_tools(once)) == _rendered(once)


@settings(max_examples=40, deadline=None)
@given(_tool_lists(), st.integers(0, 2**32))
def test_stable_tools_ignores_key_order_and_tool_order(
    tools: list[dict[str, Any]], seed: int
) -> None:
    rng = random.Random(seed)
    permuted = _shuffled(tools, rng)
    rng.shuffle(permuted)
    assert _rendered(stable_tools(permuted)) == _rendered(stable_tools(tools))


@settings(max_examples=100, deadline=None)
@given(_json, st.integers(0, 2**32))
def test_canonical_json_ignores_key_order_and_round_trips(value: Any, seed: int) -> None:
    encoded = canonical_json(value)
    assert canonical_json(_shuffled(value, random.Random(seed))) == encoded
    # decoding and re-encoding gives the same bytes (idempotent)
    assert canonical_json(json.loads(encoded)) == encoded
    # and the decoded value equals the input as JSON data (as numbers: RFC 8785 writes a
    # float from 1e16 up to 1e21 in plain digits, which Python then reads as an int)
    assert _numbers(json.loads(encoded)) == _numbers(json.loads(json.dumps(value)))


def _numbers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value
