"""The settings of one wrapped client: :class:`ClientOptions`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentkv._errors import ConfigError
from agentkv.advice._advisor import Advisor, Mode
from agentkv.client._affinity import Affinity
from agentkv.client.backends import BACKENDS

__all__ = ["ClientOptions"]

_MODES = ("observe", "shadow", "active")


@dataclass(frozen=True)
class ClientOptions:
    """The settings of one client wrapped by :func:`agentkv.wrap_openai` (immutable).

    Pass one as ``wrap_openai(client, options=ClientOptions(...))``; the keyword
    arguments of ``wrap_openai`` are shorthands for these fields and, when given,
    override them.

    Attributes:
        backend: ``"auto"`` (probe the server once: agentkv-served vLLM, stock vLLM,
            hosted OpenAI, else headers only with one warning), ``"vllm"``,
            ``"openai"``, ``"dynamo"``, ``"generic"`` or ``"anthropic"`` (what
            :func:`agentkv.wrap_anthropic` uses).
        advisor: the :class:`agentkv.Advisor` to use (default: one over the process's
            learned gap model and a cost model for the server's platform).
        mode: rollout mode of the default advisor: ``"observe"``, ``"shadow"``,
            ``"active"`` (None: ``"active"``).
        tokenizer: optional; a Hugging Face tokenizer (``apply_chat_template``) or a
            callable ``(api, kwargs) -> token ids`` used locally to compute each turn's
            expected reusable prefix. Token ids never leave the process.
        block_size: KV block size for that prefix (default: the server's, else 16).
        namespace: a :class:`agentkv.CacheNamespace` for tenant salts.
        salt_secret: secret mixed into tenant salts (see ``CacheNamespace.cache_salt``).
            None: ``AGENTKV_SALT_SECRET``, else the install's own secret
            (``$AGENTKV_HOME/salt-secret``, 0600, created on first use), so a tenant's
            salt cannot be computed from its name; give every harness host the same
            ``AGENTKV_SALT_SECRET`` where several hosts serve one tenant.
        lifecycle: post tool and trajectory events to the server's control route.
        probe_timeout_s: timeout of the capability probe.
        kv_bytes_per_token: the served model's KV size per token
            (:func:`agentkv.kv_bytes_per_token`), for the cost model.
        provider_name: ``gen_ai.provider.name`` on chat spans (default: the backend).
        allow_unsalted: send a tenant's calls even where its cache salt cannot be sent
            (a server that is not vLLM, rejects ``cache_salt``, or could not be probed
            yet). Off by default: such a call raises
            :class:`agentkv.TenantIsolationError` instead (the salt is cache identity).
        probe_retry_s: after a transient probe failure (timeout, refused, 5xx), the
            first delay before asking again; it doubles up to a minute. Calls in
            between send headers only (no tenant: see ``allow_unsalted``).
        affinity: where a router in front of several replicas finds the session key
            (:class:`agentkv.Affinity` or its spec: ``"vllm-router"``,
            ``"production-stack"``, ``"llm-d"``, ``"dynamo"``, ``"header:<name>"``,
            ``"cookie:<name>"``, ``"body:<field>"``). The key is the trajectory id, on
            model calls and lifecycle posts alike (active mode). None: the backend's
            own session header (``X-Session-ID``, Dynamo's ``X-Dynamo-Session-ID``).
        agentic_context: also send vllm-router's Program-scheduling metadata
            (``vllm_xargs.agentic_context``: program, parent and root ids, step,
            expected resume, retention TTL from the advice) on every model call.

    Raises:
        ConfigError: an unknown ``backend``, ``mode`` or ``affinity``.
    """

    backend: str = "auto"
    advisor: Advisor | None = None
    mode: Mode | None = None
    tokenizer: Any = None
    block_size: int | None = None
    namespace: Any = None  # agentkv.CacheNamespace for the tenant salt
    salt_secret: str | bytes | None = None
    lifecycle: bool = True
    probe_timeout_s: float = 1.0
    kv_bytes_per_token: int | None = None
    provider_name: str | None = None
    allow_unsalted: bool = False
    probe_retry_s: float = 1.0
    affinity: Affinity | str | None = None
    agentic_context: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.mode is not None and self.mode not in _MODES:
            raise ConfigError(f"mode must be 'observe', 'shadow' or 'active', got {self.mode!r}")
        if self.affinity is not None:
            Affinity.parse(self.affinity)  # raises ConfigError on a bad spec
