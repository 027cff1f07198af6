"""Backend adapters: how one request intent is written for each kind of server.

``agentkv.wrap_openai(client, backend=...)`` picks one: ``"vllm"``, ``"openai"`` (the
hosted API), ``"dynamo"``, ``"generic"`` (headers only), or ``"auto"`` (a capability
probe decides). See ``docs/client.md``.
"""

from __future__ import annotations

from agentkv.client.backends._adapters import (
    PROTOCOL_VERSION,
    BackendAdapter,
    DynamoAdapter,
    GenericAdapter,
    OpenAIHostedAdapter,
    RequestHints,
    VLLMAdapter,
    make_envelope,
)
from agentkv.client.backends._probe import (
    BACKENDS,
    ProbeResult,
    adapter_from_probe,
    is_hosted_openai,
    make_adapter,
    probe_adapter,
    probe_adapter_async,
    server_root,
)

__all__ = [
    "BACKENDS",
    "PROTOCOL_VERSION",
    "BackendAdapter",
    "DynamoAdapter",
    "GenericAdapter",
    "OpenAIHostedAdapter",
    "ProbeResult",
    "RequestHints",
    "VLLMAdapter",
    "adapter_from_probe",
    "is_hosted_openai",
    "make_adapter",
    "make_envelope",
    "probe_adapter",
    "probe_adapter_async",
    "server_root",
]
