"""A real local HTTP server (127.0.0.1, in a thread) playing a session-affinity router.

Each instance stands for one router shape in front of two replicas: it finds the session
key where that router looks (``key_of``), picks a replica from it the way a router
would, answers like an agentkv-served vLLM (chat completions, capabilities, events), and
records every request with the replica that served it. Shapes (docs/scale-out.md):

- :func:`header_key` — vllm-router (``X-Session-ID``), production-stack
  (``--session-key <name>``: the header), Dynamo (``X-Dynamo-Session-ID``);
- :func:`body_key` — production-stack's fallback: the top-level body field;
- :class:`CookieGateway` — llm-d: the gateway picks a pod for a request without its
  cookie and sets ``llm-d-session=<base64("namespace/pod")>``; a request with the
  cookie goes to that pod.

:func:`real_router` starts the real vllm-router in front of given worker URLs instead.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.client_fakes import CAPABILITIES
from tests.support.requires import unavailable

__all__ = ["CookieGateway", "RouterFake", "body_key", "header_key", "real_router"]

REPLICAS = ("replica-0", "replica-1")
KeyOf = Callable[[dict[str, str], dict[str, Any] | None], str | None]


def header_key(name: str) -> KeyOf:
    """The session key is the value of header ``name``."""
    return lambda headers, body: headers.get(name.lower())


def body_key(name: str) -> KeyOf:
    """The session key is the top-level body field ``name``."""
    return lambda headers, body: str(body[name]) if body and name in body else None


def _chat(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
                  "prompt_tokens_details": {"cached_tokens": 64}},
    }  # fmt: skip


class RouterFake:
    """A router shape in front of two replicas; ``requests`` records who served what."""

    def __init__(self, key_of: KeyOf, *, capabilities: dict[str, Any] | None = None) -> None:
        self.key_of = key_of
        self.capabilities = dict(capabilities or CAPABILITIES)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                headers = {k.lower(): v for k, v in self.headers.items()}
                replica, extra = fake.pick(headers, body)
                path = self.path.split("?")[0]
                with fake._lock:
                    fake.requests.append({"method": method, "path": path, "headers": headers,
                                          "body": body, "replica": replica})  # fmt: skip
                status, answer = fake.answer(path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def pick(self, headers: dict[str, str], body: Any) -> tuple[str | None, dict[str, str]]:
        """The replica for a request (None: no key) and extra response headers."""
        key = self.key_of(headers, body if isinstance(body, dict) else None)
        if not key:
            return None, {}
        digest = hashlib.sha256(key.encode()).digest()
        return REPLICAS[digest[0] % len(REPLICAS)], {}

    def answer(self, path: str, body: Any) -> tuple[int, Any]:
        if path == "/agentkv/v1/capabilities":
            return 200, self.capabilities
        if path == "/agentkv/v1/events":
            n = len(body.get("events", [])) if isinstance(body, dict) else 0
            return 200, {"accepted": n, "rejected": [], "server_time_ms": int(time.time() * 1000)}
        if path == "/agentkv/v1/stats":
            return 200, {"kv_usage": 0.1, "num_waiting": 0}
        if path in ("/v1/chat/completions",):
            return 200, _chat(str((body or {}).get("model", "m")))
        return 404, {"detail": "Not Found"}

    def served(self, path: str) -> list[dict[str, Any]]:
        """Recorded requests to ``path``, in order."""
        with self._lock:
            return [r for r in self.requests if r["path"] == path]

    def events_by_trajectory(self) -> dict[str, set[str | None]]:
        """trajectory id -> replicas its lifecycle posts reached."""
        out: dict[str, set[str | None]] = {}
        for r in self.served("/agentkv/v1/events"):
            for ev in r["body"]["events"]:
                out.setdefault(ev["trajectoryId"], set()).add(r["replica"])
        return out

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class CookieGateway(RouterFake):
    """llm-d's session affinity: the gateway names the pod in a cookie it sets."""

    COOKIE = "llm-d-session"

    def __init__(self) -> None:
        self._next = itertools.cycle(REPLICAS)
        super().__init__(lambda headers, body: None)

    def pick(self, headers: dict[str, str], body: Any) -> tuple[str | None, dict[str, str]]:
        jar: SimpleCookie = SimpleCookie()
        jar.load(headers.get("cookie", ""))
        morsel = jar.get(self.COOKIE)
        if morsel is not None:
            return base64.b64decode(morsel.value).decode().split("/", 1)[1], {}
        pod = next(self._next)
        value = base64.b64encode(f"default/{pod}".encode()).decode()
        return pod, {"Set-Cookie": f"{self.COOKIE}={value}; Path=/; HttpOnly; SameSite=Lax"}


@contextlib.contextmanager
def real_router(urls: Sequence[str], policy: str = "consistent_hash") -> Iterator[str]:
    """The real vllm-router with ``policy`` in front of ``urls``; yields its base URL once
    it answers /health (waits up to 30 s; fails with its output otherwise) and stops it
    on exit."""
    import httpx

    from agentkv.vllm._launch import find_free_port, stop_process_group
    from agentkv.vllm._replicas import router_command

    if shutil.which("vllm-router") is None:
        unavailable("vllm-router is not installed (pip install 'agentkv-cache[router]')")
    port, prom = find_free_port(), find_free_port()
    cmd = router_command(urls, host="127.0.0.1", port=port, prometheus_port=prom, policy=policy)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-2000:]
                    raise AssertionError(f"vllm-router did not come up on {base}:\n{tail}")
                time.sleep(0.2)
            yield base
        finally:
            stop_process_group(proc, 10)
