"""Per-client state of a wrapped client: the backend adapter, advisor, salts and load."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from agentkv.client import _lifecycle
from agentkv.client._options import ClientOptions
from agentkv.client.backends import (
    BackendAdapter,
    GenericAdapter,
    VLLMAdapter,
    is_hosted_openai,
    make_adapter,
    probe_adapter,
    probe_adapter_async,
)
from agentkv.events import _pipeline
from agentkv.policy._advisor import Advisor
from agentkv.policy._costmodel import CostModel, LoadTracker

__all__ = ["ClientState"]


class ClientState:
    """Per-client state: options, the chosen adapter, salts, the default advisor.

    ``tracker`` (the server's load, refreshed by the lifecycle channel) and
    ``cost_model`` exist once an adapter with a control route / any adapter is chosen.
    """

    def __init__(self, client: Any, options: ClientOptions) -> None:
        self.options = options
        self.base_url = str(getattr(client, "base_url", "") or "")
        self.api_key: str | None = getattr(client, "api_key", None)
        self.adapter: BackendAdapter | None = None
        self.body_hints_off = False
        self._lock = threading.Lock()
        self._salts: dict[str, str] = {}
        self._advisor: Advisor | None = None
        self._advisor_gap_id: int | None = None
        self.tracker: LoadTracker | None = None
        self.cost_model: CostModel | None = None
        if options.backend != "auto" and options.backend != "vllm":
            self._set_adapter(make_adapter(options.backend))
        elif options.backend == "auto" and is_hosted_openai(self.base_url):
            self._set_adapter(make_adapter("openai"))

    # --- adapter -------------------------------------------------------------------
    def _set_adapter(self, adapter: BackendAdapter) -> None:
        caps = adapter.capabilities if isinstance(adapter, VLLMAdapter) else {}
        platform = str(caps.get("platform") or ("hosted" if adapter.name == "openai" else "cuda"))
        cm = CostModel(platform=platform, bytes_per_token=self.options.kv_bytes_per_token)
        with contextlib.suppress(TypeError, ValueError):
            cm.set_capacity(
                num_blocks=int(caps.get("num_blocks") or 0),
                block_size=int(caps.get("block_size") or 0),
            )
        self.cost_model = cm
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

    def get_adapter(self) -> BackendAdapter:
        if self.body_hints_off:
            return GenericAdapter()
        if self.adapter is None:
            with self._lock:
                if self.adapter is None:
                    self._set_adapter(
                        probe_adapter(
                            self.base_url,
                            api_key=self.api_key,
                            timeout_s=self.options.probe_timeout_s,
                            configured=self.options.backend,
                        )
                    )
        assert self.adapter is not None
        return self.adapter

    async def get_adapter_async(self) -> BackendAdapter:
        if self.body_hints_off:
            return GenericAdapter()
        if self.adapter is None:
            adapter = await probe_adapter_async(
                self.base_url,
                api_key=self.api_key,
                timeout_s=self.options.probe_timeout_s,
                configured=self.options.backend,
            )
            if self.adapter is None:
                self._set_adapter(adapter)
        assert self.adapter is not None
        return self.adapter

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
            salt = ns.cache_salt(tenant, secret=self.options.salt_secret)
            self._salts[tenant] = salt
        return salt
