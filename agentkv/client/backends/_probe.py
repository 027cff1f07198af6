"""Choosing a backend adapter: configured, or found by a capability probe.

``backend="auto"`` asks the server once per client: an agentkv-served vLLM answers
``GET /agentkv/v1/capabilities`` (protocol ``agentkv/1``) and gets the full vLLM
adapter with its control route; a stock vLLM answers ``GET /version`` and gets the vLLM
fields (which it reads or ignores harmlessly); a hosted OpenAI URL gets the hosted
adapter without a probe; anything else gets headers only, with one warning. The probe
has a short timeout, and any failure falls back to headers only.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentkv._guard import warn_once
from agentkv._protocol import CAPABILITIES_PATH, PROTOCOL_VERSION
from agentkv.client.backends._adapters import (
    BackendAdapter,
    DynamoAdapter,
    GenericAdapter,
    OpenAIHostedAdapter,
    VLLMAdapter,
)

__all__ = [
    "BACKENDS",
    "adapter_from_probe",
    "is_hosted_openai",
    "make_adapter",
    "probe_adapter",
    "probe_adapter_async",
    "server_root",
]

logger = logging.getLogger("agentkv")

BACKENDS: tuple[str, ...] = ("auto", "vllm", "openai", "dynamo", "generic")


def server_root(base_url: str) -> str:
    """``http://host:8000/v1/`` -> ``http://host:8000`` (the control route's root)."""
    parts = urlsplit(str(base_url))
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")).rstrip("/")


def is_hosted_openai(base_url: str) -> bool:
    """True for the OpenAI API (``api.openai.com``) and Azure OpenAI endpoints."""
    host = (urlsplit(str(base_url)).hostname or "").lower()
    return host == "api.openai.com" or host.endswith(".openai.azure.com")


def make_adapter(backend: str, *, control_url: str | None = None) -> BackendAdapter:
    """A configured adapter without probing (``vllm`` assumes a stock server)."""
    if backend == "vllm":
        return VLLMAdapter(control_url=control_url)
    if backend == "openai":
        return OpenAIHostedAdapter()
    if backend == "dynamo":
        return DynamoAdapter()
    return GenericAdapter()


def _warn_once(root: str, why: str) -> None:
    warn_once(
        "probe:" + root,
        "agentkv: %s at %s; sending only harmless headers. Pass "
        "wrap_openai(client, backend='vllm' | 'openai' | 'dynamo' | 'generic') to choose.",
        why,
        root or "<no base_url>",
    )


def adapter_from_probe(
    root: str,
    capabilities: Any,
    version: Any,
    *,
    configured: str = "auto",
) -> BackendAdapter:
    """Pure part of the probe: pick the adapter from what the two endpoints returned."""
    if isinstance(capabilities, dict) and str(capabilities.get("protocol_version", "")).startswith(
        PROTOCOL_VERSION.split("/")[0] + "/"
    ):
        features = capabilities.get("features")
        priority = bool(features.get("priority")) if isinstance(features, dict) else False
        return VLLMAdapter(
            control_url=root, priority_supported=priority, capabilities=dict(capabilities)
        )
    if configured == "vllm" or (isinstance(version, dict) and "version" in version):
        return VLLMAdapter()
    _warn_once(root, "the server is neither an agentkv-served nor a stock vLLM")
    return GenericAdapter()


def _headers(api_key: str | None) -> dict[str, str]:
    if api_key and api_key not in ("-", "EMPTY"):
        return {"Authorization": f"Bearer {api_key}"}
    return {}


def _json_or_none(response: Any) -> Any:
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def probe_adapter(
    base_url: str, *, api_key: str | None, timeout_s: float, configured: str = "auto"
) -> BackendAdapter:
    """Probe the server synchronously (at most two short GETs) and pick an adapter."""
    import httpx

    root = server_root(base_url)
    caps: Any = None
    version: Any = None
    try:
        with httpx.Client(timeout=timeout_s, headers=_headers(api_key)) as http:
            caps = _json_or_none(http.get(root + CAPABILITIES_PATH))
            if caps is None and configured != "vllm":
                version = _json_or_none(http.get(root + "/version"))
    except httpx.HTTPError as exc:
        if configured == "vllm":
            return VLLMAdapter()
        _warn_once(root, f"the capability probe failed ({type(exc).__name__})")
        return GenericAdapter()
    return adapter_from_probe(root, caps, version, configured=configured)


async def probe_adapter_async(
    base_url: str, *, api_key: str | None, timeout_s: float, configured: str = "auto"
) -> BackendAdapter:
    """The same probe with ``httpx.AsyncClient`` (for ``AsyncOpenAI``)."""
    import httpx

    root = server_root(base_url)
    caps: Any = None
    version: Any = None
    try:
        async with httpx.AsyncClient(timeout=timeout_s, headers=_headers(api_key)) as http:
            caps = _json_or_none(await http.get(root + CAPABILITIES_PATH))
            if caps is None and configured != "vllm":
                version = _json_or_none(await http.get(root + "/version"))
    except httpx.HTTPError as exc:
        if configured == "vllm":
            return VLLMAdapter()
        _warn_once(root, f"the capability probe failed ({type(exc).__name__})")
        return GenericAdapter()
    return adapter_from_probe(root, caps, version, configured=configured)
