"""A local HTTP server answering like the Anthropic Messages API, for the real SDK.

``MessagesServer`` records each ``POST /v1/messages`` body and answers like the Messages
API (usage with ``cache_read_input_tokens`` and ``cache_creation_input_tokens``), plain
or as a server-sent-event stream.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["MESSAGE", "USAGE", "MessagesServer", "breakpoint_error"]

USAGE = {
    "input_tokens": 10,
    "output_tokens": 3,
    "cache_read_input_tokens": 900,
    "cache_creation_input_tokens": 90,
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": USAGE,
}


def breakpoint_error(body: Any) -> str | None:
    """What the Messages API would refuse in ``body``'s breakpoints (None: nothing): more
    than four, or one on a thinking block or an empty text block."""
    found: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("cache_control"), dict):
                found.append(value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk({k: body.get(k) for k in ("tools", "system", "messages")})
    if len(found) > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {len(found)}."
    for block in found:
        if block.get("type") in ("thinking", "redacted_thinking"):
            return "cache_control cannot be set for thinking blocks"
        if block.get("type") == "text" and not block.get("text"):
            return "cache_control cannot be set for empty text blocks"
    return None


class MessagesServer:
    """Records each request body; answers :data:`MESSAGE` (400 for a refused breakpoint)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append(body)
                error = breakpoint_error(body)
                if error is not None:
                    data = json.dumps(
                        {
                            "type": "error",
                            "error": {"type": "invalid_request_error", "message": error},
                        }
                    ).encode()
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if body.get("stream"):
                    self._stream()
                    return
                data = json.dumps(MESSAGE).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                start = {
                    **MESSAGE,
                    "content": [],
                    "stop_reason": None,
                    "usage": {**USAGE, "output_tokens": 0},
                }
                events = [
                    ("message_start", {"type": "message_start", "message": start}),
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": 0,
                            "content_block": {"type": "text", "text": ""},
                        },
                    ),
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": "ok"},
                        },
                    ),
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    (
                        "message_delta",
                        {
                            "type": "message_delta",
                            "usage": {"output_tokens": 3},
                            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                        },
                    ),
                    ("message_stop", {"type": "message_stop"}),
                ]
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
