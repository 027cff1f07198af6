"""A bound on the new salt scopes one source may open per unit time (API-server side).

The scheduler plugin keys its state by the request's ``cache_salt`` (the tenant scope,
:mod:`agentkv.vllm._tenancy`), and anyone may send any salt: a client that makes up a
fresh salt on every request opens a new scope each time, and each scope is a tenant with
a share of the retained cap and a quota of tracked trajectories. The gate bounds how
fast one *source* opens scopes, and tells the engine each hinted request's source:

- A source is the request's bearer token, else its client address (as a MAC under a
  per-process secret, like the control route's callers, :mod:`agentkv.vllm._ratelimit`).
  The salt is never the source: a source that names many salts is what is bounded.
- A salt the gate has seen in a hinted request before (from any source) is *known* and
  costs nothing. A new one spends a token of its source's bucket: at most ``burst`` at
  once, then ``rate_per_s`` (0: no bound). At most :data:`MAX_KNOWN_SALTS` salts are
  remembered (least recently used forgotten first: more than the plugin tracks tenants).
- A hinted request whose new salt finds its source's bucket empty is served as stock vLLM:
  the gate removes the ``agentkv_*`` keys from its ``vllm_xargs`` (the salt stays: it is
  the request's cache identity), counts it in ``new_salts_limited`` and lets it through.
  The user's call never fails for it.
- Every other hinted request is forwarded with its source in ``vllm_xargs``
  (:data:`~agentkv.protocol._wire.XARG_SOURCE`; a value the client sent under that key is
  replaced, so a client cannot name another's source). The plugin divides tenant shares
  of the retained cap by source first
  (:meth:`agentkv.residency._book.TrajectoryBook.set_group`): the salts of one source
  share one part. This is the only channel from the API server to the scheduler that
  needs no change to vLLM; it costs a re-encoding of the hinted request's body.

Only ``POST`` bodies that can carry a hint are parsed: a body with neither
``agentkv_`` nor a ``\\u`` escape in it cannot name an ``agentkv_*`` key and passes
untouched. A request the server will refuse for its API key passes untouched too (vLLM
answers it 401; it spends no token and makes no salt known). With the bound off (rate 0)
the gate still tags sources.

:class:`SaltGate` holds the decision (pure apart from the injected clock);
:class:`SaltGateMiddleware` is the ASGI middleware the launch profile adds with a second
``--middleware`` (it must rewrite a body, which a function middleware cannot do without
reaching into Starlette's internals). Each API-server process has its own gate.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agentkv._guard import internal_error
from agentkv.protocol._wire import ROUTE_PREFIX, XARG_PREFIX, XARG_SOURCE
from agentkv.vllm._auth import bearer_accepted
from agentkv.vllm._ratelimit import ControlLimit, TokenBuckets

__all__ = [
    "ENV_SALT_BURST",
    "ENV_SALT_RATE",
    "MAX_KNOWN_SALTS",
    "SALT_GATE_MIDDLEWARE",
    "SaltGate",
    "SaltGateMiddleware",
    "SaltLimit",
    "configure_salt_gate",
    "get_salt_gate",
    "source_key",
]

ENV_SALT_BURST = "AGENTKV_NEW_SALT_BURST"
ENV_SALT_RATE = "AGENTKV_NEW_SALT_RATE_PER_S"
MAX_KNOWN_SALTS = 16_384
SALT_GATE_MIDDLEWARE = "agentkv.vllm._saltgate.SaltGateMiddleware"

_SECRET = os.urandom(32)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SaltLimit(ControlLimit):
    """How many new salt scopes one source may open: ``burst`` at once, then
    ``rate_per_s`` (0: no bound)."""

    burst: int = 64
    rate_per_s: float = 1.0

    ENV_BURST: ClassVar[str] = ENV_SALT_BURST
    ENV_RATE: ClassVar[str] = ENV_SALT_RATE
    WHAT: ClassVar[str] = "new salt scopes"


def _mac(kind: str, value: str) -> str:
    digest = hmac.new(_SECRET, f"{kind}\0{value}".encode(), hashlib.sha256).hexdigest()
    return f"{kind}:{digest[:32]}"


def source_key(headers: Mapping[str, str], client_host: str | None) -> str:
    """Whose bucket a new salt spends: the bearer token, else the client address (each
    as a MAC; ``"anonymous"`` when neither is known)."""
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and token:
        return _mac("bearer", token)
    if client_host:
        return _mac("addr", client_host)
    return "anonymous"


class SaltGate:
    """Which hinted requests may open a new salt scope (see the module docstring)."""

    def __init__(
        self,
        limit: ControlLimit,
        *,
        max_known: int = MAX_KNOWN_SALTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.buckets = TokenBuckets(limit, clock=clock)
        self.max_known = max(1, max_known)
        self.admitted = 0  # new salts that opened a scope
        self._known: OrderedDict[str, None] = OrderedDict()

    @property
    def limit(self) -> ControlLimit:
        """The bound in force."""
        return self.buckets.limit

    @property
    def limited(self) -> int:
        """Hinted requests served without their hints (their source's bucket was empty)."""
        return self.buckets.limited

    def admit(self, source: str, salt: str) -> bool:
        """May a hinted request of ``source`` use ``salt``? A known salt may; a new one
        spends a token of ``source``'s bucket (and is known from then on) or may not."""
        key = _mac("salt", salt)
        if key in self._known:
            self._known.move_to_end(key)
            return True
        if self.buckets.take(source) > 0:
            return False
        self._known[key] = None
        while len(self._known) > self.max_known:
            self._known.popitem(last=False)
        self.admitted += 1
        return True

    def filter_body(self, body: bytes, source: str) -> bytes | None:
        """The body to forward in place of ``body`` (its hints removed, or its source
        set), or None to forward it unchanged."""
        if XARG_PREFIX.encode() not in body and b"\\u" not in body:
            return None
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return None  # vLLM answers it 400
        if not isinstance(obj, dict):
            return None
        xargs = obj.get("vllm_xargs")
        if not isinstance(xargs, dict):
            return None  # no hint
        hinted = [k for k in xargs if isinstance(k, str) and k.startswith(XARG_PREFIX)]
        if not hinted:
            return None
        salt = obj.get("cache_salt")
        # The unsalted scope is one scope, never a new one.
        if isinstance(salt, str) and salt and self.limit.enabled and not self.admit(source, salt):
            for k in hinted:
                del xargs[k]
            if not xargs:
                del obj["vllm_xargs"]
        else:
            xargs[XARG_SOURCE] = source  # whatever the client put there
        return json.dumps(obj).encode()

    def stats(self) -> dict[str, int]:
        """What the gate counted (served with the control route's stats)."""
        return {"new_salts_admitted": self.admitted, "new_salts_limited": self.limited}


_GATE: SaltGate | None = None


def get_salt_gate() -> SaltGate:
    """This process's gate (built on first use from ``AGENTKV_NEW_SALT_*``)."""
    global _GATE
    if _GATE is None:
        _GATE = SaltGate(SaltLimit.from_env())
    return _GATE


def configure_salt_gate(limit: ControlLimit | None) -> SaltGate:
    """Replace this process's gate with a fresh one for ``limit`` (None: from the
    environment); returns it."""
    global _GATE
    _GATE = None if limit is None else SaltGate(limit)
    return get_salt_gate()


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope.get("headers") or ():
        out[bytes(name).decode("latin-1").lower()] = bytes(value).decode("latin-1")
    return out


class SaltGateMiddleware:
    """ASGI middleware: a hinted ``POST`` whose new salt is over its source's bound is
    forwarded without its hints, any other with its source (:meth:`SaltGate.filter_body`);
    everything else passes as it came."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = get_salt_gate()
        path = str(scope.get("path", ""))
        if (
            scope.get("type") != "http"
            or scope.get("method") != "POST"
            or path.startswith(ROUTE_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        disconnected = False
        while True:
            message = await receive()
            messages.append(message)
            if message.get("type") != "http.request":
                disconnected = True  # replayed as it came: the app sees the disconnect
                break
            if not message.get("more_body", False):
                break
        replay = messages
        if not disconnected:
            body = b"".join(bytes(m.get("body", b"")) for m in messages)
            try:
                new_body = self._filter(scope, body, gate)
            except Exception as exc:  # never fail a user's call for the gate
                internal_error("salt_gate", exc)
                new_body = None
            if new_body is not None:
                scope = dict(scope)
                headers = [
                    (n, v)
                    for n, v in scope.get("headers") or ()
                    if bytes(n).lower() != b"content-length"
                ]
                headers.append((b"content-length", str(len(new_body)).encode()))
                scope["headers"] = headers
                replay = [{"type": "http.request", "body": new_body, "more_body": False}]

        async def replayed() -> Message:
            if replay:
                return replay.pop(0)
            return await receive()

        await self.app(scope, replayed, send)

    @staticmethod
    def _filter(scope: Scope, body: bytes, gate: SaltGate) -> bytes | None:
        headers = _headers(scope)
        if not bearer_accepted(scope.get("app"), headers.get("authorization", "")):
            return None
        client = scope.get("client")
        host = str(client[0]) if client else None
        return gate.filter_body(body, source_key(headers, host))
