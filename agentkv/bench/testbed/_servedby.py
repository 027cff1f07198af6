"""Which replica served each model call of a bench run behind a router.

Under round-robin routing, which replica a call reaches depends on every request that
passed through the router before it (lifecycle posts and probes included), so the
simulator cannot re-derive it. The bench therefore starts every replica with
:class:`ServedBy`, an ASGI middleware (vLLM's ``--middleware``) that tags each response
with the port the replica listens on (header :data:`SERVED_BY_HEADER`); vllm-router
forwards response headers, streamed ones included. The bench maps the port back to the
replica's index (:func:`replica_of`) and records, per repetition, the replica of every
call, which the simulator's check then follows call by call.

The tag carries no request content and changes nothing in how the server schedules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "SERVED_BY_HEADER",
    "SERVED_BY_MIDDLEWARE",
    "ServedBy",
    "call_replicas",
    "replica_of",
    "tagged",
]

#: Response header naming the port of the replica that answered.
SERVED_BY_HEADER = "x-agentkv-served-by"
#: The import path vLLM's ``--middleware`` takes.
SERVED_BY_MIDDLEWARE = "agentkv.bench.testbed._servedby.ServedBy"

_Scope = Mapping[str, Any]
_Send = Callable[[dict[str, Any]], Awaitable[None]]


class ServedBy:
    """ASGI middleware: every HTTP response names the port its server listens on."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: Any, send: _Send) -> None:
        server = scope.get("server") if scope.get("type") == "http" else None
        if not server or len(server) < 2 or server[1] is None:
            await self.app(scope, receive, send)
            return
        tag = (SERVED_BY_HEADER.encode(), str(server[1]).encode())

        async def tagged(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), tag]}
            await send(message)

        await self.app(scope, receive, tagged)


def replica_of(value: str | None, ports: Sequence[int]) -> int | None:
    """The index in ``ports`` of the replica a :data:`SERVED_BY_HEADER` value names, or
    None (no header, a malformed one, or a port that is not a replica's)."""
    if not value:
        return None
    try:
        port = int(value.strip())
    except ValueError:
        return None
    try:
        return list(ports).index(port)
    except ValueError:
        return None


def tagged(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with :class:`~agentkv.bench.testbed._servedby.ServedBy` among the replica's
    middleware, so each response names the replica that served it."""
    extra = list(options.get("extra_args") or [])
    return {**options, "extra_args": [*extra, "--middleware", SERVED_BY_MIDDLEWARE]}


def call_replicas(trajectories: Sequence[Any], ports: Sequence[int]) -> dict[str, int]:
    """``"<trajectory index>/<turn position>" -> replica index`` for every call of one
    replay whose answer named its replica (see the module doc)."""
    out: dict[str, int] = {}
    for traj in trajectories:
        for position, turn in enumerate(traj.turns):
            replica = replica_of(turn.served_by, ports)
            if replica is not None:
                out[f"{traj.traj_idx}/{position}"] = replica
    return out
