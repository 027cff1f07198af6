"""The lifecycle channel: tool and trajectory events posted to the server's control route.

Events that happen between requests — a tool started (its class now known, so the
lease can be refined), a tool finished, a trajectory finished or was cancelled (release)
— cannot ride on a model request. The channel listens to agentkv's event pipeline
(``agentkv.events._pipeline.subscribe``), and for trajectories whose model calls went to an
agentkv-served vLLM it queues the event (with advice for ``tool_started``) and returns.
A background thread batches the queue into ``POST /agentkv/v1/events`` with a short
timeout and a few tenacity retries. A slow, dead or confused server costs the tool at
most a queue put: the queue is bounded (oldest dropped, counted), a server that fails a
whole batch is skipped for a few seconds, and nothing here raises into the caller. A
server that rate-limits the route (HTTP 429) gets the post once more after its
``Retry-After`` when that is at most ``max_limit_wait_s``; otherwise, or when it refuses
again, the events are dropped and counted as ``dropped_rate_limited``, and posts to it
are dropped the same way until the wait it asked for has passed.

The same thread refreshes each active server's load at most once a second (from
``/agentkv/v1/stats`` ``kv_usage`` / ``num_waiting`` where the server has them, else
``/metrics``: ``vllm:kv_cache_usage_perc``, ``vllm:num_requests_waiting``), so
the advisor reads a recent snapshot without ever waiting on I/O. The lag from an event's
``emittedAtMs`` to the server's acknowledgement is recorded (``agentkv.stats()``), and
the stats answers also carry the server's tier split into ``agentkv.stats()``.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentkv._clock import Clock, as_clock
from agentkv.advice._advisor import Advisor, TrajectoryState
from agentkv.advice._change import unchanged
from agentkv.advice._costmodel import LoadSnapshot
from agentkv.client import _accounting, _tier
from agentkv.client._affinity import RouteKeys
from agentkv.client._load import LoadTracker, load_from_stats, parse_prometheus_load
from agentkv.client._sessions import RouterSessions
from agentkv.events import _pipeline
from agentkv.events._schema import CacheAdvice, TrajectoryEvent
from agentkv.protocol._events import encode_event
from agentkv.protocol._wire import (
    EVENT_SALT_FIELD,
    EVENTS_PATH,
    MAX_EVENTS_PER_BATCH,
    STATS_PATH,
)

__all__ = [
    "LifecycleChannel",
    "TrajectoryRoute",
    "get_channel",
    "reset_channel",
    "retry_after_s",
    "route_of",
    "set_channel",
]

logger = logging.getLogger("agentkv")


@dataclass
class TrajectoryRoute:
    """Where a trajectory's lifecycle events go, and what the advisor needs for them."""

    control_url: str
    headers: dict[str, str]
    advisor: Advisor
    tracker: LoadTracker
    prefix_tokens: int = 0
    attained_service_s: float = 0.0
    last_advice: CacheAdvice | None = None  # what the server already has for this trajectory
    cache_salt: str | None = None  # the scope the server keys this trajectory by
    keys: RouteKeys | None = None  # the affinity key a router needs (docs/scale-out.md)
    #: The tenant's salt, sent or not: the router session key is scoped by it.
    session_scope: str | None = None

    def post_shape(self, event: TrajectoryEvent) -> tuple[dict[str, str], dict[str, str]]:
        """Headers and extra top-level body fields of a post carrying ``event``: the
        auth headers plus the trajectory's affinity key (and data-parallel rank)."""
        if self.keys is None:
            return self.headers, {}
        tid, scope = event.trajectory_id, self.session_scope
        session = self.keys.session_headers(tid, event.parent_trajectory_id, scope=scope)
        return {**self.headers, **session}, self.keys.session_body(tid, scope)


def _same_advice(a: CacheAdvice | None, b: CacheAdvice) -> bool:
    """True when ``b`` would tell the server nothing new after ``a``."""
    if a is None or a.action != b.action:
        return False
    return unchanged(a.ttl_ms, b.ttl_ms) and unchanged(a.predicted_gap_ms, b.predicted_gap_ms)


class _Retryable(Exception):
    pass


# url, headers, payload, extra body fields, and the trajectory a post must not share with
# another (behind a router; "" when any trajectories may share a post)
_Queued = tuple[str, dict[str, str], dict[str, Any], dict[str, str], str]


class LifecycleChannel:
    """Batches lifecycle events to ``POST /agentkv/v1/events`` from a daemon thread."""

    def __init__(
        self,
        *,
        timeout_s: float = 1.0,
        max_attempts: int = 3,
        max_queue: int = 10_000,
        max_batch: int = MAX_EVENTS_PER_BATCH,
        flush_interval_s: float = 0.02,
        load_refresh_s: float = 1.0,
        down_backoff_s: float = 5.0,
        max_routes: int = 10_000,
        max_limit_wait_s: float = 2.0,
        autostart: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_attempts = max(1, max_attempts)
        self.max_batch = max_batch
        self.flush_interval_s = flush_interval_s
        self.load_refresh_s = load_refresh_s
        self.down_backoff_s = down_backoff_s
        self.max_routes = max_routes
        self.max_limit_wait_s = max_limit_wait_s
        self.autostart = autostart
        self._clock = as_clock(clock)
        self._queue: deque[_Queued] = deque(maxlen=max_queue)
        # by (tenant, trajectory id): two tenants of one process may run the same id
        self._routes: OrderedDict[tuple[str | None, str], TrajectoryRoute] = OrderedDict()
        self._sessions = RouterSessions(max_queue)  # ended sessions for a sticky router
        self._trackers: dict[str, tuple[LoadTracker, dict[str, str], float]] = {}
        self._down_until: dict[str, float] = {}
        self._limited_until: dict[str, float] = {}  # a 429's Retry-After, per server
        self._stop = threading.Event()  # cuts a Retry-After wait short at close()
        self._stats_load: dict[str, bool] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._http: Any = None
        self._unsubscribe: Callable[[], None] | None = None
        self._refreshed: list[threading.Event] = []  # waiters of refresh_loads()

    # --- registration (called from the client on each model call) --------------------
    def ensure_subscribed(self) -> None:
        """(Re)attach the listener to the event pipeline if it is not attached."""
        if not _pipeline.is_subscribed(self._on_event):
            self._unsubscribe = _pipeline.subscribe(self._on_event, flush=self.flush)

    def tracker(
        self, control_url: str, headers: dict[str, str], *, has_lower_tier: bool
    ) -> LoadTracker:
        """The load tracker of a server (created on first use; refreshed in the background)."""
        with self._lock:
            item = self._trackers.get(control_url)
            if item is None:
                tracker = LoadTracker(
                    max_age_s=self.load_refresh_s, has_lower_tier=has_lower_tier, clock=self._clock
                )
                self._trackers[control_url] = (tracker, headers, self._clock.monotonic())
                return tracker
            self._trackers[control_url] = (item[0], headers, self._clock.monotonic())
            return item[0]

    def register(
        self, trajectory_id: str, route: TrajectoryRoute, tenant: str | None = None
    ) -> None:
        """Route the lifecycle events of ``tenant``'s ``trajectory_id`` to ``route``
        (bounded, LRU)."""
        self.ensure_subscribed()
        if self.autostart:
            self._start()
        key = (tenant, trajectory_id)
        with self._lock:
            self._routes[key] = route
            self._routes.move_to_end(key)
            while len(self._routes) > self.max_routes:
                self._routes.popitem(last=False)

    def route(self, trajectory_id: str, tenant: str | None = None) -> TrajectoryRoute | None:
        """The registered route of ``tenant``'s trajectory, if any."""
        return self._routes.get((tenant, trajectory_id))

    # --- the listener: cheap, never blocks on I/O --------------------------------------
    def _on_event(self, event: TrajectoryEvent) -> None:
        route = self._routes.get((event.tenant, event.trajectory_id))
        if route is None:
            return
        kind = event.event
        advisor = route.advisor
        if kind in ("model_started", "tool_finished"):
            # The server has nothing to do on them (the request carries the turn); every
            # post costs an engine-core RPC. The client's call scores the shadow log.
            return
        sent_advice: CacheAdvice | None = None
        if kind == "tool_started":
            state = TrajectoryState(
                trajectory_id=event.trajectory_id,
                turn_id=event.turn_number or 0,
                tool_class=event.tool_class,
                prefix_tokens=route.prefix_tokens,
                attained_service_s=route.attained_service_s,
            )
            advice = advisor.advise(state, load=route.tracker.get())
            mode = advisor.mode_for(event.trajectory_id)
            advisor.shadow_log.record(advice, mode=mode)
            if mode == "active":
                if _same_advice(route.last_advice, advice):
                    # The request already carried this advice: posting it again would
                    # only cost the engine an RPC (and arrive after the fact).
                    _accounting.count_lifecycle("skipped_unchanged")
                    return
                route.last_advice = sent_advice = advice
        elif kind in ("trajectory_finished", "trajectory_cancelled"):
            with self._lock:
                self._routes.pop((event.tenant, event.trajectory_id), None)
            advisor.shadow_log.forget(event.trajectory_id)
        payload = encode_event(event, cache_salt=route.cache_salt, advice=sent_advice)
        headers, extra = route.post_shape(event)
        # Behind a router every post carries one trajectory, even before its affinity key
        # is known (a cookie learned from the first answer): keys alone could coincide.
        alone = event.trajectory_id if route.keys is not None else ""
        self._put(route.control_url, headers, payload, extra, alone)

    def _put(
        self,
        url: str,
        headers: dict[str, str],
        payload: dict[str, Any],
        extra: dict[str, str] | None = None,
        alone: str = "",
    ) -> None:
        if len(self._queue) == self._queue.maxlen:
            _accounting.count_lifecycle("dropped_queue_full")
        self._idle.clear()
        self._queue.append((url, headers, payload, extra or {}, alone))
        self._wake.set()

    # --- the worker ------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._closed = False
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="agentkv-lifecycle", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        import httpx

        self._http = httpx.Client(timeout=self.timeout_s)
        try:
            while not self._closed:
                self._wake.wait(timeout=self.load_refresh_s)
                self._wake.clear()
                if self.flush_interval_s > 0 and self._queue:
                    time.sleep(self.flush_interval_s)  # let a burst collect into one batch
                try:
                    self._drain()
                    self._sessions.drain(self._http)
                    self._refresh_loads()
                except Exception as exc:  # the worker must survive anything
                    logger.debug("agentkv: lifecycle worker error %r", exc)
                    _accounting.count_lifecycle("worker_errors")
                with self._lock:
                    refreshed, self._refreshed = self._refreshed, []
                for waiter in refreshed:
                    waiter.set()
                if not self._queue:
                    self._idle.set()
        finally:
            self._http.close()
            self._idle.set()

    def _drain(self) -> None:
        # One post per server and affinity key: behind a router, a post carrying several
        # trajectories could reach only one of their replicas.
        while self._queue:
            groups: dict[tuple[Any, ...], tuple[_Queued, list[dict[str, Any]]]] = {}
            for _ in range(self.max_batch):
                try:
                    item = self._queue.popleft()
                except IndexError:
                    break
                url, headers, payload, extra, alone = item
                key = (url, tuple(sorted(headers.items())), tuple(sorted(extra.items())), alone)
                groups.setdefault(key, (item, []))[1].append(payload)
            for (url, headers, _, extra, _), events in groups.values():
                self._post(url, headers, events, extra)
                self._sessions.after_post(url, headers, events)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _post(
        self,
        url: str,
        headers: dict[str, str],
        events: list[dict[str, Any]],
        extra: dict[str, str] | None = None,
    ) -> None:
        import httpx
        from tenacity import (
            Retrying,
            retry_if_exception_type,
            stop_after_attempt,
            wait_exponential,
        )

        now = self._clock.monotonic()
        if self._down_until.get(url, 0.0) > now:
            _accounting.count_lifecycle("dropped_server_down", len(events))
            return
        if self._limited_until.get(url, 0.0) > now:
            _accounting.count_lifecycle("dropped_rate_limited", len(events))
            return
        endpoint = url + EVENTS_PATH
        body = {**(extra or {}), "events": events}
        try:
            for attempt in Retrying(
                stop=stop_after_attempt(self.max_attempts),
                wait=wait_exponential(multiplier=0.05, max=0.5),
                retry=retry_if_exception_type((_Retryable, httpx.TransportError)),
                reraise=True,
            ):
                with attempt:
                    response = self._http.post(endpoint, json=body, headers=headers)
                    if response.status_code >= 500:
                        raise _Retryable(f"HTTP {response.status_code}")
        except Exception as exc:
            self._down_until[url] = self._clock.monotonic() + self.down_backoff_s
            _accounting.count_lifecycle("failed", len(events))
            self._warn_once(
                "post:" + url,
                "agentkv: lifecycle events to %s failed (%s); tools and requests are "
                "unaffected, hints are skipped while the control route is unreachable",
                url,
                exc,
            )
            return
        if response.status_code == 429:
            response = self._after_limit(url, response, lambda: self._http.post(
                endpoint, json=body, headers=headers
            ))  # fmt: skip
            if response is None:
                _accounting.count_lifecycle("dropped_rate_limited", len(events))
                return
        ack_ms = self._clock.time() * 1000.0
        if response.status_code != 200:
            _accounting.count_lifecycle("rejected", len(events))
            self._warn_once(
                f"status:{url}:{response.status_code}",
                "agentkv: the control route at %s answered HTTP %s to lifecycle events",
                url,
                response.status_code,
            )
            return
        try:
            body = response.json()
            accepted = int(body["accepted"])
        except (ValueError, KeyError, TypeError):
            _accounting.count_lifecycle("bad_response", len(events))
            self._warn_once(
                "garbage:" + url,
                "agentkv: the control route at %s answered lifecycle events with "
                "something that is not the agentkv protocol; ignoring it",
                url,
            )
            return
        _accounting.count_lifecycle("posted", accepted)
        if accepted < len(events):
            _accounting.count_lifecycle("rejected", len(events) - accepted)
        self._take_outcomes(events, body.get("hintOutcomes"))
        for ev in events:
            emitted = ev.get("emittedAtMs")
            if isinstance(emitted, int):
                _accounting.record_hint_lag(ack_ms - emitted)

    @staticmethod
    def _take_outcomes(events: list[dict[str, Any]], outcomes: Any) -> None:
        """Fold the answer's per-hint outcomes (one entry per trajectory, by the index of
        its first event in the post) into the turn records."""
        if not isinstance(outcomes, list):
            return
        for item in outcomes:
            index = item.get("index") if isinstance(item, dict) else None
            if isinstance(index, int) and 0 <= index < len(events):
                ev = events[index]
                salt, tid = ev.get(EVENT_SALT_FIELD), ev.get("trajectoryId")
                if isinstance(tid, str):
                    _accounting.apply_hint_outcomes(salt, tid, item.get("turns"))

    def _after_limit(self, url: str, response: Any, resend: Callable[[], Any]) -> Any | None:
        """A 429's outcome: the answer to one more try after its ``Retry-After`` (when
        that is at most ``max_limit_wait_s``), or None when the post is to be dropped;
        then posts to ``url`` are dropped until the wait the server asked for is over."""
        wait_s = retry_after_s(response.headers.get("retry-after"))
        if wait_s <= self.max_limit_wait_s:
            self._stop.wait(wait_s)  # this thread only; close() cuts it short
            if not self._closed:
                try:
                    again = resend()
                except Exception:  # counted as dropped below, like a second 429
                    again = None
                if again is not None and again.status_code != 429:
                    return again
                if again is not None:
                    wait_s = retry_after_s(again.headers.get("retry-after"))
        self._limited_until[url] = self._clock.monotonic() + wait_s
        self._warn_once(
            "limited:" + url,
            "agentkv: the control route at %s rate-limits this client (HTTP 429); lifecycle "
            "events are dropped while it does (tools and requests are unaffected)",
            url,
        )
        return None

    def _refresh_loads(self) -> None:
        now = self._clock.monotonic()
        with self._lock:
            items = list(self._trackers.items())
        for url, (tracker, headers, last_used) in items:
            if now - last_used > 30.0 or not tracker.needs_refresh():
                continue
            if self._down_until.get(url, 0.0) > now:
                continue
            lower = tracker.get().has_lower_tier
            try:
                snap = self._load_from_stats(url, headers, lower)
                if snap is None:
                    response = self._http.get(url + "/metrics", headers=headers, timeout=0.5)
                    if response.status_code == 200:
                        snap = parse_prometheus_load(response.text, has_lower_tier=lower)
                tracker.update(snap if snap is not None else tracker.get())
            except Exception:
                tracker.update(tracker.get())  # do not ask again before max_age

    def _load_from_stats(
        self, url: str, headers: dict[str, str], has_lower_tier: bool
    ) -> LoadSnapshot | None:
        """Load from the small ``/agentkv/v1/stats`` answer, or None where it has none.

        The stats route answers with a few hundred bytes (``/metrics`` renders every
        vLLM series, which on a small CPU server costs the engine's cores), and its
        ``kv_usage`` counts blocks held only by leases as free: they are given up on
        demand, so the advisor does not mistake its own leases for pressure. Every
        answer also feeds the tier split (:mod:`agentkv.client._tier`). A server
        whose stats lack the load fields is asked at ``/metrics`` from then on.
        """
        if self._stats_load.get(url) is False:
            return None
        response = self._http.get(url + STATS_PATH, headers=headers, timeout=0.5)
        if response.status_code == 429:  # rate-limited: the stats are there, ask later
            raise RuntimeError("the stats route answered HTTP 429")
        body: Any = response.json() if response.status_code == 200 else None
        if isinstance(body, dict):
            _tier.observe_stats(url, body)
        if not isinstance(body, dict) or "kv_usage" not in body or "num_waiting" not in body:
            self._stats_load[url] = False
            return None
        self._stats_load[url] = True
        return load_from_stats(body, has_lower_tier=has_lower_tier)

    # --- control ---------------------------------------------------------------------
    def refresh_loads(self, timeout_s: float = 2.0) -> bool:
        """Have the worker refresh every server load that is due now, and wait for it.

        A load is due when its snapshot is older than ``load_refresh_s`` on the channel's
        clock (a new server's always is). True when the worker got round to it within
        ``timeout_s``; False when no worker runs.
        """
        if self._thread is None or not self._thread.is_alive():
            return False
        done = threading.Event()
        with self._lock:
            self._refreshed.append(done)
        self._wake.set()
        return done.wait(timeout_s)

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Wait until the queue is drained (or ``timeout_s``); True when drained."""
        if self._thread is None or not self._thread.is_alive():
            return not self._queue
        self._wake.set()
        return self._idle.wait(timeout_s)

    def close(self, timeout_s: float = 1.0) -> None:
        """Flush briefly, then stop the worker thread and stop listening to events.

        Registering a trajectory afterwards starts both again.
        """
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        self.flush(timeout_s)
        self._closed = True
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        self._thread = None

    def stats(self) -> dict[str, Any]:
        """Queue depth and routes (for debugging)."""
        return {"queued": len(self._queue), "routes": len(self._routes)}


_channel: LifecycleChannel | None = None
_channel_lock = threading.Lock()


def get_channel() -> LifecycleChannel:
    """The process's lifecycle channel (created on first use; closed at exit)."""
    global _channel
    if _channel is None:
        with _channel_lock:
            if _channel is None:
                _channel = LifecycleChannel()
    return _channel


def route_of(trajectory_id: str, tenant: str | None = None) -> TrajectoryRoute | None:
    """``get_channel().route(trajectory_id, tenant)``, without making a channel: none, no
    route."""
    channel = _channel
    return None if channel is None else channel.route(trajectory_id, tenant)


def set_channel(channel: LifecycleChannel | None) -> LifecycleChannel | None:
    """Make ``channel`` the process's channel (None: a new one on next use); returns the
    previous one, which the caller closes if it is done with it."""
    global _channel
    with _channel_lock:
        previous, _channel = _channel, channel
    return previous


def reset_channel(timeout_s: float = 0.5) -> None:
    """Close the process's channel, if any; the next use makes a fresh one."""
    previous = set_channel(None)
    if previous is not None:
        previous.close(timeout_s)


def retry_after_s(value: str | None, default_s: float = 1.0) -> float:
    """The wait a ``Retry-After`` header asks for, in seconds (delay-seconds form; an
    absent or unreadable value is ``default_s``; a negative one is 0)."""
    try:
        wait_s = float(value) if value is not None else default_s
    except ValueError:
        return default_s
    return min(max(0.0, wait_s), 3600.0) if math.isfinite(wait_s) else default_s


@atexit.register
def _close_at_exit() -> None:  # pragma: no cover - runs at interpreter exit
    channel = _channel
    if channel is not None:
        channel.close(0.5)
