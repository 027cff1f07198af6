"""canonical_json against RFC 8785 vectors written by hand, for what agentkv serializes:
tool schemas (nested objects, descriptions with non-ASCII text and escapes, numeric bounds)
and the fingerprint payload. Each expected text follows the RFC's rules directly (sorted keys
by UTF-16 units, no whitespace, ECMAScript numbers, the minimal string escapes); no
implementation produced them. Runs without the ``rfc8785`` package."""

from __future__ import annotations

from typing import Any

import pytest

from agentkv import canonical_json

VECTORS: list[tuple[str, Any, str]] = [
    (
        "tool-schema-keys-sorted-at-every-depth",
        {
            "type": "function",
            "function": {
                "parameters": {
                    "type": "object",
                    "required": ["cmd"],
                    "properties": {"timeout": {"type": "number"}, "cmd": {"type": "string"}},
                },
                "name": "run",
            },
        },
        '{"function":{"name":"run","parameters":{"properties":{"cmd":{"type":"string"},'
        '"timeout":{"type":"number"}},"required":["cmd"],"type":"object"}},"type":"function"}',
    ),
    (
        "numeric-bounds-ecmascript-form",
        {"a": 600.0, "b": 0.5, "c": -0.0, "d": 1e21, "e": 1e-7, "f": 123456789012.5, "g": 1e20},
        '{"a":600,"b":0.5,"c":0,"d":1e+21,"e":1e-7,"f":123456789012.5,"g":100000000000000000000}',
    ),
    (
        "small-and-negative-floats",
        {"x": 0.000001, "y": -2.5e-8, "z": 3.0e-6},
        '{"x":0.000001,"y":-2.5e-8,"z":0.000003}',
    ),
    (
        "string-escapes-minimal",
        {"d": 'tab\there "quoted" back\\slash\nline/slash \u000b\u001f \u2028'},
        '{"d":"tab\\there \\"quoted\\" back\\\\slash\\nline/slash \\u000b\\u001f \u2028"}',
    ),
    (
        "non-ascii-text-is-utf8-not-escaped",
        {"description": "Größe in €, 日本語"},
        '{"description":"Größe in €, 日本語"}',
    ),
    (
        "keys-by-utf16-units-not-code-points",
        # U+1F600 is D83D DE00 in UTF-16: before U+FB33 (FB33), after it by code point
        {"\ufb33": 1, "\U0001f600": 2, "z": 3, "A": 4},
        '{"A":4,"z":3,"\U0001f600":2,"\ufb33":1}',
    ),
    (
        "literals-and-empty-containers",
        {"enum": [True, False, None], "items": {}, "examples": []},
        '{"enum":[true,false,null],"examples":[],"items":{}}',
    ),
    (
        "array-order-kept",
        {"required": ["b", "a"], "n": [3, 1, 2]},
        '{"n":[3,1,2],"required":["b","a"]}',
    ),
]


@pytest.mark.parametrize(
    ("value", "expected"), [v[1:] for v in VECTORS], ids=[v[0] for v in VECTORS]
)
def test_canonical_json_gives_the_rfc8785_text(value: Any, expected: str) -> None:
    assert canonical_json(value) == expected.encode("utf-8")


def test_an_int64_bound_is_written_exactly_where_rfc8785_has_no_text() -> None:
    """The documented departure: integers beyond 2**53 (a schema's int64 ``maximum``)."""
    assert canonical_json({"maximum": 2**63 - 1}) == b'{"maximum":9223372036854775807}'
