"""The ``/agentkv/v1/`` control route, added to vLLM's API server with ``--middleware``.

Pass ``--middleware agentkv.vllm._control.control_middleware``. The middleware runs
in the API-server process: it validates input there (bad input gets a 4xx with a
message, never a 500 and never reaches the engine), then calls the engine-core
utility method ``agentkv_control`` that the scheduler plugin installs, which hands
the operation to the scheduler. It also adds ``agentkv_*`` series to ``/metrics``.

Routes (the contract is ``docs/protocol.md``): ``POST /agentkv/v1/events``,
``GET /agentkv/v1/capabilities``, ``GET /agentkv/v1/trajectories/{id}``,
``GET /agentkv/v1/outcomes/{id}`` (per-hint outcomes, :mod:`agentkv.vllm._outcomes`),
``GET /agentkv/v1/stats``, and the operator's ``POST /agentkv/v1/mode`` (the policy's
``act`` / ``shadow`` / ``off`` switch; with an API key it needs the key, without one a
loopback caller). On a data-parallel server an operation goes to the rank
named by the request's ``X-data-parallel-rank`` header, else to every rank, and the
answers are combined (:mod:`agentkv.vllm._fanout`). With ``--api-key`` (or
``VLLM_API_KEY``) they, and ``GET /metrics``, require the same bearer token as the
OpenAI routes.

Hostile input is cheap to refuse: a body is refused on its ``Content-Length`` before it
is read and read in chunks up to a cap otherwise; ``POST`` needs ``application/json``
(a browser page cannot send that cross-origin without a preflight, which this route
refuses) and, when the server has no key, no ``Origin`` header at all; nesting too deep
for the JSON parser is a 400; an id in the path is percent-decoded exactly once; each
caller spends a token of its own bucket per request (:mod:`agentkv.vllm._ratelimit`) and
an empty bucket is a 429 with ``Retry-After``, counted as ``control_requests_limited``. Stats
are served from a snapshot at most :data:`STATS_MAX_AGE_S` old, shared by the stats
route and ``/metrics``, so scrapes and polls cost the engine at most one call a second.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from agentkv._version import __version__
from agentkv.protocol._events import BodyError, decode_events_body
from agentkv.protocol._wire import (
    MAX_BODY_BYTES,
    MAX_EVENTS_PER_BATCH,
    MAX_ID_CHARS,
    PROTOCOL_VERSION,
    ROUTE_PREFIX,
    SALT_HEADER,
    valid_salt,
)
from agentkv.vllm._auth import api_tokens, bearer_accepted
from agentkv.vllm._fanout import DP_RANK_HEADER, call_engines, combine_answers
from agentkv.vllm._metrics import StatsCollector
from agentkv.vllm._ratelimit import ControlLimit, TokenBuckets, caller_key, retry_after_header
from agentkv.vllm._saltgate import get_salt_gate

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_EVENTS_PER_BATCH",
    "PROTOCOL_VERSION",
    "ControlInputError",
    "bearer_accepted",
    "configure_limit",
    "control_middleware",
    "get_limiter",
    "is_authorized",
    "read_body",
    "route_of",
    "validate_events_body",
]

ENGINE_TIMEOUT_S = 10.0
STATS_MAX_AGE_S = 1.0
PREFIX = ROUTE_PREFIX

_log = logging.getLogger("agentkv.control")


class ControlInputError(BodyError):
    """Bad control-route input; carries the HTTP status to answer with (``status``,
    ``message``)."""


def validate_events_body(
    body: bytes, default_salt: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Decode a ``POST /agentkv/v1/events`` body (the event codec,
    :func:`agentkv.protocol._events.decode_events_body`).

    ``default_salt`` is the scope of events that name none (the request's
    ``X-AgentKV-Cache-Salt`` header). Returns ``(normalized events, rejected entries)``;
    a body that is not usable as a whole raises :class:`ControlInputError` with status
    400 or 413.
    """
    try:
        return decode_events_body(body, default_salt)
    except BodyError as exc:
        raise ControlInputError(exc.status, exc.message) from None


async def read_body(request: Any, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refused (413) from its ``Content-Length`` before any of it is
    read, or as soon as the chunks read so far pass ``max_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise ControlInputError(400, "Content-Length is not a number")
        if int(declared) > max_bytes:
            raise ControlInputError(413, f"body larger than {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise ControlInputError(413, f"body larger than {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _request_salt(request: Any) -> str | None:
    salt = request.headers.get(SALT_HEADER)
    if salt is None:
        return None
    if not valid_salt(salt):
        raise ControlInputError(400, f"{SALT_HEADER} must be the cache_salt the requests carried")
    return str(salt)


def route_of(request: Any) -> str:
    """The path after ``/agentkv/v1/``, percent-decoded exactly once."""
    scope = request.scope
    raw = scope.get("raw_path")
    if isinstance(raw, (bytes, bytearray)):
        try:
            path = unquote(bytes(raw).decode("latin-1").split("?", 1)[0], errors="strict")
        except UnicodeDecodeError:
            raise ControlInputError(400, "the path is not percent-encoded UTF-8") from None
    else:
        path = str(scope["path"])  # the server decoded it once already
    root = str(scope.get("root_path", ""))
    if root and path.startswith(root + PREFIX):
        path = path[len(root) :]
    return path[len(PREFIX) :]


# -- auth ------------------------------------------------------------------------------
def is_authorized(request: Any) -> bool:
    """True when ``request`` carries the server's API key as a bearer token (or none is set)."""
    return bearer_accepted(request.app, request.headers.get("authorization", ""))


# -- engine calls ----------------------------------------------------------------------
async def _engine(request: Any, op: dict[str, Any], timeout_s: float = ENGINE_TIMEOUT_S) -> Any:
    client = getattr(request.app.state, "engine_client", None)
    core = getattr(client, "engine_core", None)
    if core is None:
        raise ControlInputError(503, "the engine is not ready")
    try:
        # Data parallel: the rank the request names, else every rank (one answer each).
        answers = await call_engines(
            core,
            "agentkv_control",
            json.dumps(op),
            rank_header=request.headers.get(DP_RANK_HEADER),
            timeout_s=timeout_s,
        )
    except TimeoutError:
        raise ControlInputError(503, "the engine did not answer in time") from None
    except Exception as exc:
        raise ControlInputError(
            503,
            "the engine did not accept the agentkv call; is the server running with "
            f"--scheduler-cls agentkv.vllm._scheduler.AgentKVScheduler? ({type(exc).__name__})",
        ) from None
    return combine_answers(str(op["op"]), answers)


def _json(status: int, content: Any, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(status_code=status, content=content, headers=headers)


# -- the rate limit ----------------------------------------------------------------------
_LIMITER: TokenBuckets | None = None


def get_limiter() -> TokenBuckets:
    """The route's token buckets (built on first use from ``AGENTKV_CONTROL_*``)."""
    global _LIMITER
    if _LIMITER is None:
        _LIMITER = TokenBuckets(ControlLimit.from_env())
    return _LIMITER


def configure_limit(limit: ControlLimit | None) -> TokenBuckets:
    """Replace the route's buckets with fresh ones for ``limit`` (None: from the
    environment); returns them."""
    global _LIMITER
    _LIMITER = None if limit is None else TokenBuckets(limit)
    return get_limiter()


def _limited(request: Any) -> Any | None:
    """The 429 answer when the caller's bucket is empty, else None (a token spent)."""
    client = getattr(request, "client", None)
    wait_s = get_limiter().take(caller_key(request.headers, getattr(client, "host", None)))
    if wait_s <= 0:
        return None
    retry = retry_after_header(wait_s)
    return _json(
        429,
        {"error": f"too many control requests from this caller; retry after {retry} s"},
        {"Retry-After": retry},
    )


def _with_route_counters(stats: dict[str, Any]) -> dict[str, Any]:
    """The engine's stats plus what this API server counts itself."""
    return {
        **stats,
        "control_requests_limited": get_limiter().limited,
        **get_salt_gate().stats(),
    }


def _engine_answer(result: Any) -> Any:
    if isinstance(result, dict) and "status" in result:
        status = int(result.pop("status"))
        return _json(status, result)
    return _json(200, result)


def _check_post(request: Any) -> None:
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        raise ControlInputError(415, "send the body as Content-Type: application/json")
    if request.headers.get("origin") is not None and not api_tokens(request.app):
        raise ControlInputError(
            403, "browser requests to the control route need the server to run with --api-key"
        )


async def _handle(request: Any) -> Any:
    if not is_authorized(request):
        return _json(401, {"error": "Unauthorized: send Authorization: Bearer <api key>"})
    if (refused := _limited(request)) is not None:
        return refused
    route = route_of(request)
    method = request.method
    if route == "events":
        if method != "POST":
            return _json(405, {"error": "use POST for /agentkv/v1/events"})
        _check_post(request)
        body = await read_body(request)
        good, rejected = validate_events_body(body, _request_salt(request))
        now_ms = time.time() * 1000.0
        result: dict[str, Any] = {"accepted": 0, "rejected": []}
        if good:
            result = await _engine(request, {"op": "events", "events": good, "now_ms": now_ms})
            if "status" in result:
                return _engine_answer(result)
        bad = {r["index"] for r in rejected}
        good_indexes = [i for i in range(len(good) + len(rejected)) if i not in bad]
        for r in result.get("rejected", []):
            i = r.get("index", -1)
            if 0 <= i < len(good_indexes):
                rejected.append({"index": good_indexes[i], "error": str(r.get("error"))})
        outcomes = [
            {"index": good_indexes[o["index"]], "turns": o.get("turns", [])}
            for o in result.get("hint_outcomes", [])
            if isinstance(o, dict) and 0 <= int(o.get("index", -1)) < len(good_indexes)
        ]
        return _json(
            200,
            {
                "accepted": int(result.get("accepted", 0)),
                "rejected": sorted(rejected, key=lambda r: int(r["index"])),
                "server_time_ms": int(now_ms),
                "hintOutcomes": outcomes,
            },
        )
    if route == "mode":
        return await _switch_mode(request)
    if method != "GET":
        return _json(405, {"error": f"use GET for /agentkv/v1/{route.split('/')[0]}"})
    if route == "capabilities":
        caps: Any = await _engine(request, {"op": "capabilities"})
        if isinstance(caps, dict) and "status" not in caps:
            caps = {
                "protocol_version": PROTOCOL_VERSION,
                "agentkv_version": __version__,
                **caps,
            }
            limits = caps.setdefault("limits", {})
            limits["max_events_per_batch"] = MAX_EVENTS_PER_BATCH
            limit = get_limiter().limit
            limits["control_burst"] = limit.burst
            limits["control_rate_per_s"] = limit.rate_per_s
            salts = get_salt_gate().limit
            limits["new_salt_burst"] = salts.burst
            limits["new_salt_rate_per_s"] = salts.rate_per_s
        return _engine_answer(caps)
    if route == "stats":
        stats = await _STATS.get(request)
        if stats is None:
            return _json(503, _STATS.error)
        return _engine_answer(_with_route_counters(stats))
    for prefix, name in (("trajectories/", "trajectory"), ("outcomes/", "outcomes")):
        if route.startswith(prefix):
            traj = route[len(prefix) :]
            if not 0 < len(traj) <= MAX_ID_CHARS:
                return _json(400, {"error": f"a trajectory id has 1..{MAX_ID_CHARS} characters"})
            op = {"op": name, "trajectory_id": traj, "cache_salt": _request_salt(request)}
            return _engine_answer(await _engine(request, op))
    return _json(404, {"error": f"no agentkv route {request.url.path!r}"})


_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


async def _switch_mode(request: Any) -> Any:
    """``POST /agentkv/v1/mode`` ``{"mode": "act" | "shadow" | "off"}``: the operator's
    switch of the server's policy. With an API key the caller must send it (checked
    before this); without one only a loopback caller may switch (anyone who can reach
    the server could otherwise switch the policy off for every tenant)."""
    if request.method != "POST":
        return _json(405, {"error": "use POST for /agentkv/v1/mode"})
    _check_post(request)
    client = getattr(request, "client", None)
    if not api_tokens(request.app) and getattr(client, "host", None) not in _LOOPBACK:
        return _json(
            403,
            {"error": "switching the policy mode needs the server to run with --api-key "
                      "(or a caller on the same host)"},
        )  # fmt: skip
    body = await read_body(request, 4096)
    try:
        obj = json.loads(body)
    except ValueError:
        raise ControlInputError(400, 'send {"mode": "act" | "shadow" | "off"}') from None
    mode = obj.get("mode") if isinstance(obj, dict) else None
    if mode not in ("act", "shadow", "off"):
        raise ControlInputError(400, "mode must be one of act, shadow, off")
    _STATS.snapshots.clear()  # the next stats show the new mode
    return _engine_answer(await _engine(request, {"op": "mode", "mode": mode}))


# -- /metrics --------------------------------------------------------------------------
class _StatsCache:
    """The engine's stats, at most :data:`STATS_MAX_AGE_S` old, per rank selection (every
    rank, or the one a request names in ``X-data-parallel-rank``); one engine call at a
    time."""

    def __init__(self) -> None:
        self.snapshots: dict[str, tuple[float, dict[str, Any]]] = {}
        self.error: dict[str, Any] = {"error": "the engine has not answered yet"}
        self.engine_calls = 0
        self._lock: asyncio.Lock | None = None

    def _fresh(self, scope: str) -> dict[str, Any] | None:
        hit = self.snapshots.get(scope)
        return hit[1] if hit is not None and time.monotonic() - hit[0] < STATS_MAX_AGE_S else None

    async def get(self, request: Any) -> dict[str, Any] | None:
        rank = (request.headers.get(DP_RANK_HEADER) or "").strip()
        scope = rank if rank.isdigit() and len(rank) <= 4 else ""  # else: every rank
        if (snapshot := self._fresh(scope)) is not None:
            return snapshot
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # callers that queued here take the fresh snapshot
            if (snapshot := self._fresh(scope)) is None:
                self.engine_calls += 1
                try:
                    stats = await _engine(request, {"op": "stats"}, timeout_s=2.0)
                except ControlInputError as exc:
                    self.error = {"error": exc.message}
                    return None
                if not isinstance(stats, dict) or "status" in stats:
                    self.error = {"error": str((stats or {}).get("error", "no stats"))}
                    return None
                if len(self.snapshots) >= 64:
                    self.snapshots.clear()
                self.snapshots[scope] = (time.monotonic(), stats)
                snapshot = stats
        return snapshot


_STATS = _StatsCache()
_COLLECTOR: StatsCollector | None = None


async def _refresh_metrics(request: Any) -> None:
    global _COLLECTOR
    try:
        stats = await _STATS.get(request)
        if stats is None:
            return
        if _COLLECTOR is None:
            from vllm.v1.metrics.prometheus import get_prometheus_registry

            collector = StatsCollector()
            get_prometheus_registry().register(collector)  # type: ignore[arg-type]
            _COLLECTOR = collector
        _COLLECTOR.snapshot = _with_route_counters(stats)
    except Exception:  # metrics are best-effort; never fail the scrape
        _log.debug("agentkv metrics refresh failed", exc_info=True)


async def control_middleware(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """HTTP middleware: serve ``/agentkv/v1/*`` and enrich ``/metrics``; pass the rest on."""
    path = request.url.path
    if path.startswith("/agentkv/"):
        try:
            if not path.startswith(PREFIX):
                return _json(
                    404, {"error": f"no agentkv route {path!r}; routes live under {PREFIX}"}
                )
            return await _handle(request)
        except ControlInputError as exc:
            return _json(exc.status, {"error": exc.message})
        except RecursionError:
            return _json(400, {"error": "input nested too deeply"})
        except Exception as exc:
            _log.exception("agentkv control route failed")
            return _json(500, {"error": f"agentkv control route failed: {type(exc).__name__}"})
    if path.rstrip("/") == "/metrics" and request.method == "GET":
        if not is_authorized(request):
            return _json(401, {"error": "Unauthorized: send Authorization: Bearer <api key>"})
        await _refresh_metrics(request)
    return await call_next(request)
