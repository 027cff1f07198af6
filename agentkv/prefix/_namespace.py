"""Cache identity: when may one request's KV state serve another?

KV blocks are only reusable between requests that agree on everything that shaped them:
the model weights (name and revision), the tokenizer that produced the token ids, the
chat template that laid the prompt out, the LoRA adapter (or none) and the dtype the KV
is stored in. :class:`CacheNamespace` names those six things. It fails closed: a field
that is ``None`` is *unknown*, and an unknown field is never compatible with anything,
not even another unknown.

Tenants that share a server must never share KV (a cache hit leaks timing, and with it
whether another tenant sent the same prefix). vLLM partitions its prefix cache by
``cache_salt``; :meth:`CacheNamespace.cache_salt` derives one per tenant that is stable
across requests — a per-request salt would destroy all reuse.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError
from agentkv.prefix._stable import canonical_json

__all__ = ["NO_ADAPTER", "CacheNamespace", "fingerprint_text"]

#: ``adapter`` value meaning "the base weights, no LoRA adapter".
NO_ADAPTER = ""

_KEY_DOMAIN = b"agentkv-namespace-v1\x00"
_SALT_DOMAIN = b"agentkv-cache-salt-v1\x00"
_SALT_PREFIX = "akv1-"  # vLLM accepts 1-128 chars without '@', '/', '\\' or NUL


def fingerprint_text(text: str | bytes) -> str:
    """Return the sha256 hex digest of a text (a tokenizer file, a chat template)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, eq=False)
class CacheNamespace:
    """The identity of a KV cache: six fields that must all be known and equal.

    ``a == b`` (same as ``a.compatible_with(b)``) means KV computed under one may serve
    the other. Every field defaults to ``None`` = unknown, and an unknown field makes a
    namespace incompatible with every namespace, itself included (like NaN): when in
    doubt, recompute. Use ``adapter=NO_ADAPTER`` (``""``) for the base weights.

    Attributes:
        model: the served model name or path.
        revision: the weights' revision (commit hash, version tag, content hash).
        tokenizer_fingerprint: sha256 hex of the tokenizer (see ``fingerprint_text``).
        chat_template_fingerprint: sha256 hex of the chat template source.
        adapter: LoRA adapter name (``""`` for none).
        kv_dtype: the server's ``--kv-cache-dtype`` (``"auto"``, ``"fp8"``, ...).
    """

    model: str | None = None
    revision: str | None = None
    tokenizer_fingerprint: str | None = None
    chat_template_fingerprint: str | None = None
    adapter: str | None = None
    kv_dtype: str | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(
                    f"CacheNamespace.{field.name} must be a str or None (unknown), "
                    f"got {type(value).__name__}"
                )

    @property
    def unknown_fields(self) -> tuple[str, ...]:
        """Names of the fields that are ``None`` (unknown)."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is None)

    @property
    def is_complete(self) -> bool:
        """True when every field is known, i.e. the namespace can match another."""
        return not self.unknown_fields

    def compatible_with(self, other: CacheNamespace) -> bool:
        """True when KV computed under ``other`` may serve requests under ``self``.

        Both namespaces must be complete and every field equal.
        """
        if not isinstance(other, CacheNamespace):
            return False
        if not (self.is_complete and other.is_complete):
            return False
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheNamespace):
            return NotImplemented
        return self.compatible_with(other)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, f.name) for f in fields(self)))

    def as_dict(self) -> dict[str, str | None]:
        """Return the six fields as a plain dict (``None`` for unknown)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def key(self) -> str:
        """A stable sha256 hex key of the fields; the same in every process.

        Two complete namespaces have the same key exactly when they are compatible. An
        incomplete namespace has a key too (it names the description), but check
        :attr:`is_complete` before treating equal keys as compatible.
        """
        return hashlib.sha256(_KEY_DOMAIN + canonical_json(self.as_dict())).hexdigest()

    def cache_salt(self, tenant: str, *, secret: str | bytes | None = None) -> str:
        """Return the vLLM ``cache_salt`` for ``tenant`` under this namespace.

        The salt is the same for every request of a tenant (so its prefixes are reused)
        and differs between tenants and between namespaces (so they never share KV). It
        is 69 characters, inside vLLM's limit of 128 and free of the characters vLLM
        refuses. Without ``secret`` anyone who knows the tenant name and the namespace
        can compute the salt; pass a secret kept on the harness or gateway side when
        clients of different tenants can set ``cache_salt`` themselves.

        Raises:
            ConfigError: ``tenant`` is not a non-empty string.
        """
        if not isinstance(tenant, str) or not tenant:
            raise ConfigError("cache_salt() needs a non-empty tenant string")
        message = _SALT_DOMAIN + canonical_json({"namespace": self.key, "tenant": tenant})
        if secret is None:
            digest = hashlib.sha256(message).hexdigest()
        else:
            key = secret.encode("utf-8") if isinstance(secret, str) else secret
            digest = hmac.new(key, message, hashlib.sha256).hexdigest()
        return _SALT_PREFIX + digest

    @classmethod
    def from_model_dir(
        cls,
        path: str | Path,
        *,
        model: str | None = None,
        revision: str | None = None,
        adapter: str | None = NO_ADAPTER,
        kv_dtype: str | None = "auto",
    ) -> CacheNamespace:
        """Build a namespace from a local Hugging Face model directory.

        The tokenizer fingerprint hashes the content of ``tokenizer.json`` (or, without
        it, the sorted tokenizer files), so it equals :meth:`from_tokenizer`'s for the
        same fast tokenizer; the chat-template fingerprint hashes ``chat_template.jinja`` or
        the ``chat_template`` entry of ``tokenizer_config.json``. Fields that cannot be
        found stay ``None`` (unknown). ``model`` defaults to the directory path.
        """
        root = Path(path)
        if not root.is_dir():
            raise ConfigError(f"{root} is not a model directory")
        return cls(
            model=model if model is not None else str(root),
            revision=revision,
            tokenizer_fingerprint=_tokenizer_fingerprint(root),
            chat_template_fingerprint=_chat_template_fingerprint(root),
            adapter=adapter,
            kv_dtype=kv_dtype,
        )

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        *,
        model: str | None = None,
        revision: str | None = None,
        adapter: str | None = NO_ADAPTER,
        kv_dtype: str | None = "auto",
    ) -> CacheNamespace:
        """Build a namespace from a loaded transformers tokenizer.

        Hashes the fast tokenizer's serialized form and its ``chat_template``. A slow
        tokenizer, or one without a chat template, leaves those fields unknown.
        ``model`` defaults to the tokenizer's ``name_or_path``.
        """
        backend = getattr(tokenizer, "backend_tokenizer", None)
        tok_fp = _tokenizer_json_fingerprint(backend.to_str()) if backend is not None else None
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):  # named templates: hash them all
            template = canonical_json(template).decode("utf-8")
        tpl_fp = fingerprint_text(template) if isinstance(template, str) else None
        name = model if model is not None else getattr(tokenizer, "name_or_path", None)
        return cls(
            model=name or None,
            revision=revision,
            tokenizer_fingerprint=tok_fp,
            chat_template_fingerprint=tpl_fp,
            adapter=adapter,
            kv_dtype=kv_dtype,
        )


def _tokenizer_json_fingerprint(text: str) -> str:
    """Hash a serialized fast tokenizer by content, not formatting (pretty or compact)."""
    try:
        return fingerprint_text(canonical_json(json.loads(text)))
    except (ValueError, TypeError):
        return fingerprint_text(text)


def _tokenizer_fingerprint(root: Path) -> str | None:
    tokenizer_json = root / "tokenizer.json"
    if tokenizer_json.is_file():
        return _tokenizer_json_fingerprint(tokenizer_json.read_text(encoding="utf-8"))
    candidates = sorted(
        p
        for p in root.iterdir()
        if p.is_file()
        and (p.name.startswith("tokenizer") or p.name in {"vocab.json", "merges.txt"})
        and p.name != "tokenizer_config.json"
    )
    if not candidates:
        return None
    digest = hashlib.sha256()
    for p in candidates:
        digest.update(p.name.encode() + b"\x00" + p.read_bytes() + b"\x00")
    return digest.hexdigest()


def _chat_template_fingerprint(root: Path) -> str | None:
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return fingerprint_text(jinja.read_text(encoding="utf-8"))
    config = root / "tokenizer_config.json"
    if config.is_file():
        try:
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError):
            return None
        if isinstance(template, str):
            return fingerprint_text(template)
        if template is not None:
            return fingerprint_text(canonical_json(template))
    return None
