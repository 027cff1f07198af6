"""Telling a sticky router that a trajectory ended: :class:`RouterSessions`.

vllm-router's ``sticky_least_loaded`` policy pins a session key to the replica with the
fewest pinned sessions and counts it there until ``POST /finish_session?session_id=<key>``
(or until the session sat idle past the router's expiry). agentkv knows when a
trajectory ends, so the lifecycle channel sends that call for every finished or
cancelled trajectory whose control post carried ``X-Session-ID``, right after that post
(from the same thread, so the router still routes the post by the pin): the router then
places new trajectories by the ones still running, not by history.

The call goes to the same root as the control posts (the router, behind one). A server
that is not a vllm-router answers 404 (any 4xx but 429 counts): that root is never asked again, so a
client talking to one vLLM server pays one request per process. Nothing here raises.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from agentkv.client import _accounting

__all__ = ["FINISH_SESSION_PATH", "RouterSessions"]

logger = logging.getLogger("agentkv")

FINISH_SESSION_PATH = "/finish_session"
SESSION_HEADER = "x-session-id"
_ENDED = frozenset({"trajectory_finished", "trajectory_cancelled"})


def _names(key: str, trajectory_id: str) -> bool:
    """True when ``key`` is ``trajectory_id``'s session key in some scope (its id, or its id
    and a 16-hex-digit MAC: ``agentkv.client._affinity.session_key``)."""
    if key == trajectory_id:
        return True
    head, dot, mac = key.rpartition(".")
    return bool(dot) and head == trajectory_id and len(mac) == 16 and _is_hex(mac)


def _is_hex(text: str) -> bool:
    return all(ch in "0123456789abcdef" for ch in text)


class RouterSessions:
    """A bounded queue of ended sessions, drained by the lifecycle channel's thread."""

    def __init__(self, max_queue: int = 10_000) -> None:
        self._queue: deque[tuple[str, str, dict[str, str]]] = deque(maxlen=max_queue)
        self._not_a_router: set[str] = set()

    def __len__(self) -> int:
        return len(self._queue)

    def after_post(
        self, root_url: str, headers: dict[str, str], events: list[dict[str, Any]]
    ) -> None:
        """Queue ``/finish_session`` for each ended trajectory among ``events`` that were
        just posted to ``root_url`` under an ``X-Session-ID`` header naming it.

        The header's value is the trajectory's session key (tenant-scoped:
        ``<id>.<MAC>``, or the bare id without a tenant), and that key is what is
        finished, so a tenant only ever finishes its own session."""
        if root_url in self._not_a_router:
            return
        key = next((v for k, v in headers.items() if k.lower() == SESSION_HEADER), None)
        if key is None:
            return
        for event in events:
            tid = event.get("trajectoryId")
            if event.get("event") in _ENDED and isinstance(tid, str) and _names(key, tid):
                self._queue.append((root_url, key, headers))

    def drain(self, http: Any) -> None:
        """Send every queued call with ``http`` (an ``httpx.Client``); count outcomes."""
        import httpx

        while self._queue:
            root, key, headers = self._queue.popleft()
            if root in self._not_a_router:
                continue
            try:
                response = http.post(
                    root + FINISH_SESSION_PATH, params={"session_id": key}, headers=headers
                )
            except httpx.HTTPError as exc:
                _accounting.count_lifecycle("finish_session_failed")
                logger.debug("agentkv: finish_session at %s failed: %r", root, exc)
                continue
            if response.status_code == 200:
                _accounting.count_lifecycle("sessions_finished")
            elif 400 <= response.status_code < 500 and response.status_code != 429:
                self._not_a_router.add(root)  # vLLM answers 404: the route is not there
            else:
                _accounting.count_lifecycle("finish_session_failed")
