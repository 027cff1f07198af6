"""A scripted OpenAI-compatible endpoint on an in-memory transport (no sockets).

``FakeOpenAI(script)`` answers ``POST /v1/chat/completions`` with the next scripted
assistant turn — a string (final answer) or a list of ``(tool name, args)`` pairs (tool
calls) — and records every request body and header set, so tests can read the hints
agentkv attached. Usage reports ``cached_tokens`` so reuse accounting has data.
"""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import httpx2

from agentkv.vllm._launch import find_free_port

Turn = str | list[tuple[str, dict[str, Any]]]


class FakeOpenAI:
    """Scripted chat completions; ``requests`` holds ``(json body, headers)`` per call."""

    def __init__(self, script: list[Turn], *, loop_last: bool = True) -> None:
        self.script = list(script)
        self.loop_last = loop_last
        self.requests: list[tuple[dict[str, Any], dict[str, str]]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count()
        # Nothing listens here: agentkv's capability probe fails fast and
        # backend="vllm" falls back to plain vLLM fields.
        self.base_url = f"http://127.0.0.1:{find_free_port()}/v1"

    def _next(self) -> Turn:
        with self._lock:
            if len(self.script) > 1 or not self.loop_last:
                return self.script.pop(0)
            return self.script[0]

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content or b"{}")
        with self._lock:
            self.requests.append((body, {k.lower(): v for k, v in request.headers.items()}))
        turn = self._next()
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = "stop"
        if isinstance(turn, str):
            message["content"] = turn
        else:
            finish = "tool_calls"
            message["tool_calls"] = [
                {
                    "id": f"call_{next(self._ids)}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for name, args in turn
            ]
        prompt = 40 + 10 * len(body.get("messages", []))
        payload = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 5,
                "total_tokens": prompt + 5,
                "prompt_tokens_details": {"cached_tokens": max(prompt - 20, 0)},
            },
        }
        return httpx2.Response(200, json=payload)

    def sync_http(self) -> httpx2.Client:
        """An httpx2 client answering from the script."""
        return httpx2.Client(transport=httpx2.MockTransport(self.handler))

    def async_http(self) -> httpx2.AsyncClient:
        """An async httpx2 client answering from the script."""
        return httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler))

    def openai(self) -> Any:
        """A plain ``openai.OpenAI`` client on this endpoint."""
        from openai import OpenAI

        return OpenAI(
            base_url=self.base_url, api_key="-", http_client=self.sync_http(), max_retries=0
        )

    def async_openai(self) -> Any:
        """A plain ``openai.AsyncOpenAI`` client on this endpoint."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            base_url=self.base_url, api_key="-", http_client=self.async_http(), max_retries=0
        )

    def xargs(self) -> list[dict[str, Any]]:
        """The ``vllm_xargs`` of every request (empty dicts where absent)."""
        return [body.get("vllm_xargs") or {} for body, _ in self.requests]
