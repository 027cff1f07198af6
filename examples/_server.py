"""Where the examples find a server: ``AGENTKV_BASE_URL`` if set, else ``agentkv.serve()``.

``AGENTKV_BASE_URL`` is the server root (``http://127.0.0.1:8000``, without ``/v1``) of
a running ``agentkv serve``; ``AGENTKV_MODEL`` names its model (default ``smollm2``).
Without them an example starts the embedded real model, SmolLM2-135M-Instruct, itself
(about a minute on a laptop CPU; built once from the wheel ``scripts/install.sh``
fetches) and stops it at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    """A server to talk to: its root, its OpenAI API and the model name."""

    base_url: str  # the server root; the control route lives under /agentkv/v1/
    openai_base_url: str  # base_url + "/v1", for OpenAI clients
    model: str


@contextmanager
def endpoint() -> Iterator[Endpoint]:
    """Yield a server: the one named by AGENTKV_BASE_URL, or SmolLM2 started here."""
    url = os.environ.get("AGENTKV_BASE_URL")
    if url:
        root = url.rstrip("/").removesuffix("/v1")
        yield Endpoint(root, root + "/v1", os.environ.get("AGENTKV_MODEL", "smollm2"))
        return
    import agentkv

    with agentkv.serve(model="smollm2") as server:  # stopped when the block ends
        yield Endpoint(server.base_url, server.openai_base_url, server.model)


def control_stats(base_url: str) -> dict[str, object]:
    """The server's agentkv counters (GET /agentkv/v1/stats), after flushing our events."""
    import httpx

    import agentkv

    agentkv.flush(5)
    stats: dict[str, object] = httpx.get(base_url + "/agentkv/v1/stats", timeout=10).json()
    return stats
