"""CacheNamespace: compatibility fails closed; per-tenant cache_salt is stable and isolating."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentkv import CacheNamespace, ConfigError
from agentkv.prefix._namespace import NO_ADAPTER, fingerprint_text

FULL = CacheNamespace(
    model="tiny-llama",
    revision="abc123",
    tokenizer_fingerprint="t" * 64,
    chat_template_fingerprint="c" * 64,
    adapter=NO_ADAPTER,
    kv_dtype="auto",
)
FIELDS = (
    "model",
    "revision",
    "tokenizer_fingerprint",
    "chat_template_fingerprint",
    "adapter",
    "kv_dtype",
)


def _replace(ns: CacheNamespace, **changes: str | None) -> CacheNamespace:
    return CacheNamespace(**{**ns.as_dict(), **changes})


def test_identical_complete_namespaces_are_compatible() -> None:
    other = _replace(FULL)
    assert FULL.compatible_with(other) and other == FULL
    assert FULL.key == other.key and hash(FULL) == hash(other)
    assert FULL.is_complete and FULL.unknown_fields == ()


@pytest.mark.parametrize("field", FIELDS)
def test_any_differing_field_means_incompatible(field: str) -> None:
    other = _replace(FULL, **{field: "different"})
    assert not FULL.compatible_with(other) and other != FULL
    assert FULL.key != other.key


@pytest.mark.parametrize("field", FIELDS)
def test_unknown_field_fails_closed_even_against_itself(field: str) -> None:
    partial = _replace(FULL, **{field: None})
    assert partial.unknown_fields == (field,)
    assert not partial.is_complete
    assert not partial.compatible_with(_replace(partial))
    assert not partial.compatible_with(partial)
    assert not FULL.compatible_with(partial)
    assert partial != _replace(partial)


def test_default_namespace_is_entirely_unknown() -> None:
    assert CacheNamespace().unknown_fields == FIELDS
    assert CacheNamespace() != CacheNamespace()


def test_non_string_field_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="revision must be a str"):
        CacheNamespace(revision=3)  # type: ignore[arg-type]


def test_cache_salt_is_stable_per_tenant_and_distinct_across_tenants_and_namespaces() -> None:
    a1, a2 = FULL.cache_salt("acme"), _replace(FULL).cache_salt("acme")
    assert a1 == a2
    assert FULL.cache_salt("globex") != a1
    assert _replace(FULL, revision="def456").cache_salt("acme") != a1
    # vLLM accepts 1-128 characters without '@', '/', '\\' or NUL
    assert 1 <= len(a1) <= 128
    assert re.fullmatch(r"[A-Za-z0-9-]+", a1)


def test_cache_salt_with_secret_differs_and_is_stable() -> None:
    plain = FULL.cache_salt("acme")
    keyed = FULL.cache_salt("acme", secret="s3cret")
    assert keyed != plain
    assert keyed == FULL.cache_salt("acme", secret=b"s3cret")
    assert keyed != FULL.cache_salt("acme", secret="other")


def test_cache_salt_needs_a_tenant() -> None:
    with pytest.raises(ConfigError, match="non-empty tenant"):
        FULL.cache_salt("")


def test_key_and_salt_are_the_same_in_another_process() -> None:
    code = (
        "import json, sys; from agentkv import CacheNamespace as C; "
        "ns = C(**json.loads(sys.argv[1])); print(ns.key, ns.cache_salt('acme'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(FULL.as_dict())],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "99", "PATH": ""},
    ).stdout.split()
    assert out == [FULL.key, FULL.cache_salt("acme")]


def test_from_model_dir_hashes_tokenizer_and_template(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"model": {}}')
    config = {"chat_template": "{{ messages }}", "bos_token": "<s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ns = CacheNamespace.from_model_dir(tmp_path, model="m", revision="r1")
    assert ns.is_complete
    assert ns.tokenizer_fingerprint == fingerprint_text(b'{"model":{}}')  # content, not layout
    assert ns.chat_template_fingerprint == fingerprint_text("{{ messages }}")
    assert ns.adapter == "" and ns.kv_dtype == "auto"
    # a chat_template.jinja file takes precedence over tokenizer_config.json
    (tmp_path / "chat_template.jinja").write_text("{{ other }}")
    assert CacheNamespace.from_model_dir(tmp_path, model="m", revision="r1") != ns


def test_from_model_dir_without_revision_or_template_stays_unknown(tmp_path: Path) -> None:
    ns = CacheNamespace.from_model_dir(tmp_path)
    assert set(ns.unknown_fields) == {
        "revision",
        "tokenizer_fingerprint",
        "chat_template_fingerprint",
    }
    assert ns.model == str(tmp_path)
    with pytest.raises(ConfigError, match="not a model directory"):
        CacheNamespace.from_model_dir(tmp_path / "missing")
