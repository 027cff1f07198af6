"""A real local HTTP server (127.0.0.1, in a thread) that speaks just enough OpenAI and agentkv.

Shared by the client, backend and lifecycle tests (``tests.support.client_fakes``).
It records every request (path, headers, JSON body) and can play an agentkv-served vLLM
(capabilities, events, stats, metrics), a stock vLLM (``/version`` only), or a broken
control route: ``down`` (404 / connection refused), ``slow`` (answers after a delay),
``garbage`` (200 with non-JSON).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

CAPABILITIES = {
    "protocol_version": "agentkv/1",
    "agentkv_version": "0.1.0",
    "vllm_version": "0.32.0",
    "platform": "cpu",
    "block_size": 32,
    "num_blocks": 64,
    "features": {
        "retain": True,
        "release": True,
        "priority": True,
        "offload": False,
        "prefetch": False,
        "pressure_override": True,
    },
    "limits": {"max_ttl_ms": 600000, "max_events_per_batch": 256},
}


def _chat_body(model: str, cached: int, content: str = "ok") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "total_tokens": 105,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


class FakeServer:
    """Configurable fake; ``control`` is one of agentkv, stock, down, slow, garbage."""

    def __init__(self, control: str = "agentkv", *, slow_s: float = 10.0) -> None:
        self.control = control
        self.slow_s = slow_s
        self.requests: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.cached_tokens = 64
        self.reject_unknown_body = False
        #: body fields answered with a 400 naming them (e.g. {"vllm_xargs"}, {"cache_salt"})
        self.reject_fields: set[str] = set()
        #: keys answered with a 400 wherever they sit in the body (a nested field such as a
        #: content part's ``prompt_cache_breakpoint``)
        self.reject_anywhere: set[str] = set()
        self.capabilities: dict[str, Any] = dict(CAPABILITIES)
        self.slow_probes = 0  # this many capability probes answer after slow_s
        self.stats_extra: dict[str, Any] = {}  # merged into the stats answer
        #: the events answer's ``hintOutcomes``, from the events of one post
        self.hint_outcomes: Any = lambda events: []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _json(self, status: int, obj: Any) -> None:
                self._send(status, json.dumps(obj).encode())

            def _control(self) -> bool:
                """Misbehave as configured; True when the request was answered."""
                if server.control == "down":
                    self._json(404, {"detail": "Not Found"})
                    return True
                if server.control == "slow":
                    server._stop.wait(server.slow_s)
                if server.control == "garbage":
                    self._send(200, b"<html>definitely not json", "text/html")
                    return True
                return False

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                with server._lock:
                    server.requests.append(
                        {"method": "GET", "path": path, "headers": dict(self.headers), "body": None}
                    )
                if path == "/version":
                    if server.control in ("stock", "agentkv"):
                        self._json(200, {"version": "0.32.0"})
                    else:
                        self._json(404, {"detail": "Not Found"})
                    return
                if path == "/metrics":
                    self._send(
                        200,
                        b'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
                        b'vllm:num_requests_waiting{engine="0"} 0.0\n',
                        "text/plain",
                    )
                    return
                if path.startswith("/agentkv/v1/"):
                    if server.control == "stock" or self._control():
                        if server.control == "stock":
                            self._json(404, {"detail": "Not Found"})
                        return
                    if path == "/agentkv/v1/capabilities":
                        if server.slow_probes > 0:
                            server.slow_probes -= 1
                            time.sleep(server.slow_s)
                        body = json.dumps(server.capabilities).replace('"HUGE"', "1" + "0" * 400)
                        self._send(200, body.encode())
                    elif path == "/agentkv/v1/stats":
                        self._json(
                            200,
                            {
                                "hints_received": len(server.requests),
                                "events_received": len(server.events),
                                **server.stats_extra,
                            },
                        )
                    else:
                        self._json(404, {"error": "unknown"})
                    return
                self._json(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                path = self.path.split("?")[0]
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                with server._lock:
                    server.requests.append(
                        {
                            "method": "POST",
                            "path": path,
                            "headers": dict(self.headers),
                            "body": body,
                            "raw": raw,
                        }
                    )
                if path == "/finish_session":  # vllm-router's; vLLM has no such route
                    self._json(404, {"detail": "Not Found"})
                    return
                if path == "/agentkv/v1/events":
                    if server.control == "stock" or self._control():
                        if server.control == "stock":
                            self._json(404, {"detail": "Not Found"})
                        return
                    events = body.get("events", []) if isinstance(body, dict) else []
                    with server._lock:
                        server.events.extend(events)
                    self._json(
                        200,
                        {
                            "accepted": len(events),
                            "rejected": [],
                            "server_time_ms": int(time.time() * 1000),
                            "hintOutcomes": server.hint_outcomes(events),
                        },
                    )
                    return
                if not isinstance(body, dict):
                    self._json(400, {"error": "bad json"})
                    return
                refused = sorted(server.reject_fields & set(body)) + sorted(
                    k for k in server.reject_fields if k in (body.get("nvext") or {})
                )
                text = json.dumps(body)
                refused += sorted(k for k in server.reject_anywhere if f'"{k}"' in text)
                if refused:
                    self._json(
                        400,
                        {
                            "error": {
                                "message": f"Extra inputs are not permitted: {refused}",
                                "type": "invalid_request_error",
                            }
                        },
                    )
                    return
                if server.reject_unknown_body and any(
                    k in body for k in ("vllm_xargs", "session_id", "cache_salt", "priority")
                ):
                    self._json(
                        400,
                        {
                            "error": {
                                "message": "Unrecognized request argument",
                                "type": "invalid_request_error",
                            }
                        },
                    )
                    return
                model = str(body.get("model", "m"))
                if model == "bad-model":
                    self._json(
                        400,
                        {"error": {"message": "no such model", "type": "invalid_request_error"}},
                    )
                    return
                if path == "/v1/chat/completions":
                    if body.get("stream"):
                        self._stream_chat(
                            model, bool((body.get("stream_options") or {}).get("include_usage"))
                        )
                    else:
                        content = '{"answer": "ok"}' if body.get("response_format") else "ok"
                        self._json(200, _chat_body(model, server.cached_tokens, content))
                elif path == "/v1/completions":
                    self._json(
                        200,
                        {
                            "id": "cmpl-1",
                            "object": "text_completion",
                            "created": 1,
                            "model": model,
                            "choices": [
                                {
                                    "index": 0,
                                    "text": "ok",
                                    "finish_reason": "stop",
                                    "logprobs": None,
                                }
                            ],
                            "usage": {
                                "prompt_tokens": 50,
                                "completion_tokens": 2,
                                "total_tokens": 52,
                                "prompt_tokens_details": {"cached_tokens": 32},
                            },
                        },
                    )
                elif path == "/v1/responses":
                    self._json(
                        200,
                        {
                            "id": "resp_1",
                            "object": "response",
                            "created_at": 1,
                            "model": model,
                            "status": "completed",
                            "output": [],
                            "parallel_tool_calls": False,
                            "tool_choice": "auto",
                            "tools": [],
                            "usage": {
                                "input_tokens": 80,
                                "output_tokens": 3,
                                "total_tokens": 83,
                                "input_tokens_details": {"cached_tokens": 48},
                                "output_tokens_details": {"reasoning_tokens": 0},
                            },
                        },
                    )
                else:
                    self._json(404, {"detail": "Not Found"})

            def _stream_chat(self, model: str, include_usage: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for piece in ("o", "k"):
                    chunk = {
                        "id": "c1",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model,
                        "choices": [
                            {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                        ],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if include_usage:
                    chunk = {
                        "id": "c1",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": 100,
                            "completion_tokens": 2,
                            "total_tokens": 102,
                            "prompt_tokens_details": {"cached_tokens": 96},
                        },
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.root = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def model_requests(self) -> list[dict[str, Any]]:
        """POSTs to the OpenAI API paths (not the control route)."""
        with self._lock:
            return [
                r for r in self.requests if r["method"] == "POST" and r["path"].startswith("/v1/")
            ]

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    """An agentkv-served fake on a free port."""
    server = FakeServer("agentkv")
    try:
        yield server
    finally:
        server.close()
