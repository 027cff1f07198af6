"""The server's API keys, as the OpenAI routes check them (``--api-key`` or
``VLLM_API_KEY``), for the agentkv middlewares (:mod:`agentkv.vllm._control`,
:mod:`agentkv.vllm._saltgate`)."""

from __future__ import annotations

import hashlib
import os
import secrets
from typing import Any

__all__ = ["api_tokens", "bearer_accepted"]


def api_tokens(app: Any) -> list[bytes]:
    """SHA-256 digests of ``app``'s API keys (empty: the server has none)."""
    args = getattr(getattr(app, "state", None), "args", None)
    keys = getattr(args, "api_key", None)
    if isinstance(keys, str):
        keys = [keys]
    if not keys:
        env_key = os.environ.get("VLLM_API_KEY")
        keys = [env_key] if env_key else []
    return [hashlib.sha256(k.encode()).digest() for k in keys if k]


def bearer_accepted(app: Any, authorization: str) -> bool:
    """True when the ``Authorization`` header value carries one of ``app``'s API keys as
    a bearer token (or the server has none)."""
    tokens = api_tokens(app)
    if not tokens:
        return True
    scheme, _, param = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    digest = hashlib.sha256(param.encode()).digest()
    ok = False
    for t in tokens:
        ok |= secrets.compare_digest(digest, t)
    return ok
