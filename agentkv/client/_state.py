"""Per-client state of a wrapped client: the backend adapter, advisor, salts and load.

The adapter comes from the configuration or from a capability probe. A probe that
fails transiently leaves the adapter undecided: calls meanwhile use headers only and
the probe is asked again after a back-off (``probe_retry_s``, doubling up to a minute),
so one slow answer never settles a client on headers only for good. Converting what the
server advertised never fails the choice: a value that does not convert (an absurd
``num_blocks``, a wrong type) falls back to the default once, with one warning, and the
adapter is kept.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from agentkv._guard import warn_once
from agentkv.advice._advisor import Advisor
from agentkv.advice._costmodel import CostModel
from agentkv.client import _lifecycle
from agentkv.client._affinity import Affinity, RouteKeys
from agentkv.client._load import LoadTracker
from agentkv.client._options import ClientOptions
from agentkv.client._sdk_span import sdk_traces_here
from agentkv.client.backends import (
    BackendAdapter,
    GenericAdapter,
    ProbeResult,
    VLLMAdapter,
    is_hosted_openai,
    make_adapter,
    probe_adapter,
    probe_adapter_async,
)
from agentkv.events import _pipeline
from agentkv.events._otel import get_tracer_provider

__all__ = ["ClientState"]

# The probe back-off is not tenacity's: tenacity retries a call in a loop, sleeping between
# attempts, while here no one waits. The failed probe's call goes on at once with headers
# only, and the next call past ``_next_probe_s`` probes again; what is left is one line of
# arithmetic (``probe_retry_s * 2**(failures - 1)``, capped). tenacity does drive the
# lifecycle channel's event posts (``_lifecycle``), which do retry in a loop.
_MAX_PROBE_BACKOFF_S = 60.0
_PATIENCE = 5.0  # a patient probe waits this many probe timeouts


def _capacity(caps: dict[str, Any]) -> tuple[int, int]:
    """(num_blocks, block_size) from capabilities; (0, 0) where they do not convert."""
    num_blocks = int(caps.get("num_blocks") or 0)
    block_size = int(caps.get("block_size") or 0)
    if not (0 <= num_blocks < 1 << 40 and 0 <= block_size < 1 << 20):
        raise ValueError("capacity out of range")
    return num_blocks, block_size


class ClientState:
    """Per-client state: options, the chosen adapter, salts, the default advisor.

    ``tracker`` (the server's load, refreshed by the lifecycle channel) and
    ``cost_model`` exist once an adapter with a control route / any adapter is chosen.
    ``body_hints_off`` is set when the server rejected agentkv's body fields but took
    the request with the salt alone (later calls send the salt and headers only);
    ``salt_rejected`` when it answered a salted request with an error naming
    ``cache_salt``; ``stream_usage_refused`` when it refused a stream request whose
    ``stream_options.include_usage`` agentkv had added (never asked again).
    """

    def __init__(self, client: Any, options: ClientOptions) -> None:
        self.options = options
        try:
            self._client: Callable[[], Any] = weakref.ref(client)
        except TypeError:  # a client without weak references: no SDK span detection
            self._client = lambda: None
        self.base_url = str(getattr(client, "base_url", "") or "")
        self.api_key: str | None = getattr(client, "api_key", None)
        self.adapter: BackendAdapter | None = None
        self.body_hints_off = False
        self.salt_rejected = False
        self.stream_usage_refused = False
        self.probe_why = ""  # why the adapter is still undecided (for error messages)
        self.taken: frozenset[str] = frozenset()  # header names the client sets itself
        self._lock = threading.Lock()
        self._salts: dict[str, str] = {}
        self._advisor: Advisor | None = None
        self._advisor_gap_id: int | None = None
        self._probe_failures = 0
        self._next_probe_s = 0.0
        self._next_patient_s = 0.0  # a patient probe waits out the same back-off
        self._fallback: BackendAdapter = GenericAdapter()
        self.tracker: LoadTracker | None = None
        self.cost_model: CostModel | None = None
        affinity = Affinity.parse(options.affinity) if options.affinity is not None else None
        self.route_keys = RouteKeys(
            affinity, agentic_context=options.agentic_context, scope_of=self.cache_salt
        )
        self.route_keys.install_cookie_hook(client)
        if options.backend != "auto" and options.backend != "vllm":
            self._set_adapter(make_adapter(options.backend))
        elif options.backend == "auto" and is_hosted_openai(self.base_url):
            self._set_adapter(make_adapter("openai"))

    def sdk_traces(self) -> bool:
        """Whether the client's SDK makes the chat span of each call itself, to the
        provider agentkv's spans go to (see :mod:`agentkv.client._sdk_span`)."""
        client = self._client()
        return client is not None and sdk_traces_here(client, get_tracer_provider())

    # --- adapter -------------------------------------------------------------------
    def _set_adapter(self, adapter: BackendAdapter) -> None:
        caps = adapter.capabilities if isinstance(adapter, VLLMAdapter) else {}
        platform = caps.get("platform")
        if not isinstance(platform, str) or not platform:
            platform = "hosted" if adapter.name == "openai" else "cuda"
        cm = CostModel(platform=platform, bytes_per_token=self.options.kv_bytes_per_token)
        try:
            num_blocks, block_size = _capacity(caps)
            cm.set_capacity(num_blocks=num_blocks, block_size=block_size)
        except (ArithmeticError, TypeError, ValueError):
            warn_once(
                "caps:" + self.base_url,
                "agentkv: %s advertised a KV capacity that does not convert; using defaults",
                self.base_url or "the server",
            )
        self.cost_model = cm
        self.route_keys.set_backend(adapter.name, caps)
        if adapter.control_url is not None:
            features = caps.get("features")
            lower = bool(features.get("offload")) if isinstance(features, dict) else False
            self.tracker = _lifecycle.get_channel().tracker(
                adapter.control_url, self.auth_headers(), has_lower_tier=lower
            )
        self.adapter = adapter

    def auth_headers(self) -> dict[str, str]:
        key = self.api_key
        return {"Authorization": f"Bearer {key}"} if key and key not in ("-", "EMPTY") else {}

    def ready_adapter(self) -> BackendAdapter | None:
        """The adapter to use now, or None when a probe is due (the driver probes)."""
        adapter = self.adapter
        if adapter is not None:
            return adapter
        if time.monotonic() >= self._next_probe_s:
            return None
        return self._fallback

    def take_probe(self, result: ProbeResult) -> BackendAdapter:
        """Record a probe's outcome; the adapter for this call (pure, no I/O)."""
        with self._lock:
            if self.adapter is not None:
                return self.adapter
            if not result.transient:
                self._set_adapter(result.adapter)
                return result.adapter
            self._probe_failures += 1
            delay = min(
                self.options.probe_retry_s * 2 ** (self._probe_failures - 1), _MAX_PROBE_BACKOFF_S
            )
            self._next_probe_s = time.monotonic() + delay
            self._fallback = result.adapter
            self.probe_why = result.why
            warn_once(
                "probe-retry:" + self.base_url,
                "agentkv: %s at %s; headers only until it answers (asking again in %.1f s)",
                result.why,
                self.base_url or "<no base_url>",
                delay,
            )
            return result.adapter

    def patient_probe_due(self) -> bool:
        """May a tenant's call wait for a patient probe now? Once per back-off window:
        a slow server costs one call the wait, not every call."""
        return time.monotonic() >= self._next_patient_s

    def _after_patient(self) -> None:
        if self.adapter is None:  # it failed too: no patient probe until the back-off ends
            self._next_patient_s = self._next_probe_s

    def _probe_args(self, patient: bool) -> dict[str, Any]:
        timeout_s = self.options.probe_timeout_s * (_PATIENCE if patient else 1.0)
        return {"api_key": self.api_key, "timeout_s": timeout_s, "configured": self.options.backend}

    def probe(self, *, patient: bool = False) -> BackendAdapter:
        """Ask the server (blocking) and record the outcome; ``patient``: a longer timeout."""
        adapter = self.take_probe(probe_adapter(self.base_url, **self._probe_args(patient)))
        if patient:
            self._after_patient()
        return adapter

    async def probe_async(self, *, patient: bool = False) -> BackendAdapter:
        """Ask the server (awaiting) and record the outcome; ``patient``: a longer timeout."""
        args = self._probe_args(patient)
        adapter = self.take_probe(await probe_adapter_async(self.base_url, **args))
        if patient:
            self._after_patient()
        return adapter

    # --- advisor, salts, load --------------------------------------------------------
    def advisor(self) -> Advisor:
        if self.options.advisor is not None:
            return self.options.advisor
        gap_model = _pipeline.ensure_gap_model()
        if self._advisor is None or self._advisor_gap_id != id(gap_model):
            self._advisor = Advisor(gap_model, self.cost_model, mode=self.options.mode or "active")
            self._advisor_gap_id = id(gap_model)
        return self._advisor

    def load(self) -> Any:
        return self.tracker.get() if self.tracker is not None else None

    def cache_salt(self, tenant: str | None) -> str | None:
        if tenant is None:
            return None
        salt = self._salts.get(tenant)
        if salt is None:
            from agentkv.prefix._namespace import CacheNamespace

            ns = self.options.namespace or CacheNamespace()
            secret = self.options.salt_secret
            if secret is None:
                from agentkv.prefix._secret import install_secret

                secret = install_secret()
            salt = ns.cache_salt(tenant, secret=secret)
            self._salts[tenant] = salt
        return salt
