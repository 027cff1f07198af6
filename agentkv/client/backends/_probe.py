"""Choosing a backend adapter: configured, or found by a capability probe.

``backend="auto"`` asks the server once per client: an agentkv-served vLLM answers
``GET /agentkv/v1/capabilities`` (protocol ``agentkv/1``) and gets the full vLLM
adapter with its control route; a stock vLLM answers ``GET /version`` and gets the vLLM
fields (which it reads or ignores harmlessly); a hosted OpenAI URL gets the hosted
adapter without a probe; anything else gets headers only, with one warning.

A probe that fails *transiently* (a timeout, a refused connection, a 5xx) decides
nothing: :class:`ProbeResult` says so, and the client keeps asking with a back-off
instead of settling on headers only for good. The probe itself is sans-I/O
(:func:`probe_flow` yields the URLs to GET and receives their answers); the sync and
async drivers only do the GETs.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentkv._guard import warn_once
from agentkv.client.backends._adapters import (
    BackendAdapter,
    DynamoAdapter,
    GenericAdapter,
    OpenAIHostedAdapter,
    VLLMAdapter,
)
from agentkv.protocol._wire import CAPABILITIES_PATH, PROTOCOL_VERSION

__all__ = [
    "BACKENDS",
    "ProbeResult",
    "adapter_from_probe",
    "is_hosted_openai",
    "make_adapter",
    "probe_adapter",
    "probe_adapter_async",
    "probe_flow",
    "server_root",
]

logger = logging.getLogger("agentkv")

BACKENDS: tuple[str, ...] = ("auto", "vllm", "openai", "dynamo", "generic", "anthropic")

#: What one GET answered: (HTTP status, JSON body or None); None: a transport failure.
Answer = tuple[int, Any] | None


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """An adapter, or ``transient=True`` when the server could not be asked (retry later)."""

    adapter: BackendAdapter
    transient: bool = False
    why: str = ""


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
    if backend == "anthropic":
        from agentkv.client.backends._anthropic import AnthropicAdapter

        return AnthropicAdapter()
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


_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _transient(answer: Answer) -> bool:
    return answer is None or answer[0] in _TRANSIENT_STATUS


def _body(answer: Answer) -> Any:
    return answer[1] if answer is not None and answer[0] == 200 else None


def probe_flow(root: str, configured: str) -> Generator[str, Answer, ProbeResult]:
    """The probe's decisions: yields each URL to GET, receives its :data:`Answer`."""
    caps = yield root + CAPABILITIES_PATH
    if _transient(caps):
        if configured == "vllm":  # told it is vLLM: the fields are safe, the route unknown
            return ProbeResult(VLLMAdapter(), transient=True, why="capability probe failed")
        return ProbeResult(GenericAdapter(), transient=True, why="capability probe failed")
    version: Answer = None
    if _body(caps) is None and configured != "vllm":
        version = yield root + "/version"
        if _transient(version):
            return ProbeResult(GenericAdapter(), transient=True, why="version probe failed")
    return ProbeResult(adapter_from_probe(root, _body(caps), _body(version), configured=configured))


_ssl_context: Any = None


def _client_args(api_key: str | None, timeout_s: float) -> dict[str, Any]:
    """httpx client settings for a probe: one TLS context for every probe of the process
    (building one reads the CA bundle: tens of milliseconds each time)."""
    global _ssl_context
    if _ssl_context is None:
        import ssl

        _ssl_context = ssl.create_default_context()
    return {"timeout": timeout_s, "headers": _headers(api_key), "verify": _ssl_context}


def _headers(api_key: str | None) -> dict[str, str]:
    if api_key and api_key not in ("-", "EMPTY"):
        return {"Authorization": f"Bearer {api_key}"}
    return {}


def _answer(response: Any) -> Answer:
    try:
        return response.status_code, response.json() if response.status_code == 200 else None
    except ValueError:
        return response.status_code, None


def probe_adapter(
    base_url: str, *, api_key: str | None, timeout_s: float, configured: str = "auto"
) -> ProbeResult:
    """Probe the server synchronously (at most two short GETs)."""
    import httpx

    flow = probe_flow(server_root(base_url), configured)
    with httpx.Client(**_client_args(api_key, timeout_s)) as http:
        url = next(flow)
        while True:
            try:
                answer: Answer = _answer(http.get(url))
            except httpx.HTTPError:
                answer = None
            try:
                url = flow.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


async def probe_adapter_async(
    base_url: str, *, api_key: str | None, timeout_s: float, configured: str = "auto"
) -> ProbeResult:
    """The same probe with ``httpx.AsyncClient`` (for ``AsyncOpenAI``)."""
    import httpx

    flow = probe_flow(server_root(base_url), configured)
    async with httpx.AsyncClient(**_client_args(api_key, timeout_s)) as http:
        url = next(flow)
        while True:
            try:
                answer: Answer = _answer(await http.get(url))
            except httpx.HTTPError:
                answer = None
            try:
                url = flow.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
