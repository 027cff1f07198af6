"""A scripted OpenAI-compatible endpoint: in memory, or on a real local HTTP server.

``FakeOpenAI(script)`` answers ``POST /v1/chat/completions`` with the next scripted
assistant turn — a string (final answer) or a list of ``(tool name, args)`` pairs (tool
calls) — and records every request body and header set, so tests can read the hints
agentkv attached. Usage reports ``cached_tokens`` so reuse accounting has data.
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
        #: Top-level request fields answered with a 400 naming them (a strict server).
        self.refuse_fields: set[str] = set()
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
        headers = {k.lower(): v for k, v in request.headers.items()}
        refused = sorted(self.refuse_fields & set(body))
        if refused:
            with self._lock:
                self.requests.append((body, headers))
            error = {"message": f"unknown field: {refused[0]}", "type": "BadRequestError"}
            return httpx2.Response(400, json={"error": error})
        answer = self.answer(body, headers)
        if body.get("stream"):
            return httpx2.Response(
                200, content=self.sse(body, answer), headers={"content-type": "text/event-stream"}
            )
        return httpx2.Response(200, json=answer)

    @staticmethod
    def stream_chunks(body: dict[str, Any], answer: dict[str, Any]) -> list[dict[str, Any]]:
        """``answer`` as a chat completions stream, as vLLM sends it: usage comes only in
        one last chunk without choices, and only when ``stream_options.include_usage``."""
        base = {k: answer[k] for k in ("id", "created", "model")}
        base["object"] = "chat.completion.chunk"
        choice = answer["choices"][0]
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}]
        for i, call in enumerate(message.get("tool_calls") or []):
            tool = {"index": i, **call}
            chunks.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [tool]}}]})
        chunks.append(
            {
                **base,
                "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            }
        )
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**base, "choices": [], "usage": answer["usage"]})
        return chunks

    def sse(self, body: dict[str, Any], answer: dict[str, Any]) -> bytes:
        """The server-sent events of :meth:`stream_chunks`, ``[DONE]`` last."""
        lines = [f"data: {json.dumps(c)}\n\n" for c in self.stream_chunks(body, answer)]
        return ("".join(lines) + "data: [DONE]\n\n").encode()

    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """The scripted chat completion for one request (recorded)."""
        with self._lock:
            self.requests.append((body, headers))
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
        return payload

    def serve(self) -> str:
        """Answer on a real local HTTP server too (an agentkv-served vLLM's control route
        included: capabilities, and ``events`` recorded in :attr:`events`); its base URL."""
        from tests.support.client_fakes import CAPABILITIES

        fake = self
        self.events: list[dict[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, obj: Any, status: int = 200) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.startswith("/agentkv/v1/capabilities"):
                    self._reply(CAPABILITIES)
                elif self.path.startswith("/agentkv/v1/stats"):
                    self._reply({})
                else:
                    self._reply({"detail": "Not Found"}, 404)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw or b"{}")
                if self.path.startswith("/agentkv/v1/events"):
                    with fake._lock:
                        fake.events.extend(body.get("events", []))
                    self._reply({"accepted": len(body.get("events", [])), "rejected": []})
                    return
                if not self.path.startswith("/v1/"):  # e.g. vllm-router's /finish_session
                    self._reply({"detail": "Not Found"}, 404)
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                answer = fake.answer(body, headers)
                if not body.get("stream"):
                    self._reply(answer)
                    return
                data = fake.sse(body, answer)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        return self.base_url

    def close(self) -> None:
        """Stop the local HTTP server, if one runs."""
        httpd = getattr(self, "_httpd", None)
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

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
