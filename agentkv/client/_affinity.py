"""Keeping a trajectory on the replica that holds its KV: :class:`Affinity`.

A router in front of several replicas keeps a session's calls together when every call
carries the same key. Routers disagree on where the key goes:

=====================  ==================================  ==============================
router                 enable                              key on the wire
=====================  ==================================  ==============================
vllm-router            ``--policy sticky_least_loaded``    header ``X-Session-ID``
                       (or ``consistent_hash``)
production-stack       ``--routing-logic session           header ``<session-key>``, or
                       --session-key <name>``              the body field of that name
llm-d (EPP)            ``session-affinity-scorer``         cookie ``llm-d-session`` that
                                                           the gateway sets; echoed back
NVIDIA Dynamo          ``--router-mode kv                  header ``X-Dynamo-Session-ID``
                       --router-session-affinity-ttl-s``   (+ parent header)
=====================  ==================================  ==============================

:class:`Affinity` names one of these shapes; the value is the trajectory's session key
(:func:`session_key`: the trajectory id, scoped by its tenant; a subagent's own; its
parent's goes in the parent header where the router has one). The same key rides on the model calls *and* on the lifecycle posts to
``/agentkv/v1/events``, so a router that forwards the control route sends a trajectory's
events to the replica that holds it. A cookie cannot be chosen by the client: the jar
keeps one per trajectory, learned from the first answer's ``Set-Cookie``.

Session keys are tenant-scoped: a router keeps one table of sessions for every client, so
two tenants of one process (or of two processes) running trajectory "1" must not share a
key, or one tenant's ``/finish_session`` for "1" would unpin the other's. A trajectory
with a tenant is keyed ``<trajectory id>.<MAC>``, the MAC computed from the tenant's salt
(the scope the server keys its state by) and the id; the salt itself never leaves in it,
and a tenant that does not hold another's salt cannot compute the other's keys. A
trajectory without a tenant is keyed by its id, as before.

:class:`RouteKeys` is the per-client state that applies it, plus two things the server
side asks for: ``X-data-parallel-rank`` pinned per trajectory when the server reports
``data_parallel_size`` > 1, and vllm-router's Program-scheduling metadata
(``vllm_xargs.agentic_context``, a JSON *string*: vLLM 0.32 answers a nested object with
HTTP 400) when :attr:`ClientOptions.agentic_context` is on.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING, Any, Literal

from agentkv._errors import ConfigError
from agentkv._guard import internal_error
from agentkv.events._context import current_trajectory

if TYPE_CHECKING:  # pragma: no cover
    from agentkv.client.backends import RequestHints

__all__ = [
    "AFFINITY_PRESETS",
    "DP_RANK_HEADER",
    "Affinity",
    "RouteKeys",
    "data_parallel_rank",
    "make_agentic_context",
    "session_key",
]

#: vLLM's header that pins a request to one data-parallel engine.
DP_RANK_HEADER = "X-data-parallel-rank"

AffinityKind = Literal["header", "cookie", "body"]


@dataclass(frozen=True, slots=True)
class Affinity:
    """Where a router looks for the session key (immutable).

    Build one from a spec string with :meth:`parse`: a preset (``"vllm-router"``,
    ``"production-stack"``, ``"llm-d"``, ``"dynamo"``) or ``"header:<name>"``,
    ``"cookie:<name>"``, ``"body:<field>"``.

    Attributes:
        kind: ``header`` (the trajectory id in a request header), ``cookie`` (a cookie
            the router sets and the client echoes, one jar per trajectory) or ``body``
            (the trajectory id in a top-level JSON field).
        name: the header, cookie or field name.
        parent_header: a header for the parent trajectory of a subagent (Dynamo's
            ``X-Dynamo-Parent-Session-ID``), or None.
    """

    kind: AffinityKind
    name: str
    parent_header: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("header", "cookie", "body"):
            raise ConfigError(f"affinity kind must be header, cookie or body, got {self.kind!r}")
        if not self.name or not all(" " < ch <= "~" for ch in self.name):
            raise ConfigError(f"affinity name must be a printable token, got {self.name!r}")

    @classmethod
    def parse(cls, spec: str | Affinity) -> Affinity:
        """An :class:`Affinity` from a preset name or ``kind:name`` (an Affinity passes)."""
        if isinstance(spec, Affinity):
            return spec
        preset = AFFINITY_PRESETS.get(spec.strip().lower())
        if preset is not None:
            return preset
        kind, sep, name = spec.partition(":")
        if not sep or kind.strip() not in ("header", "cookie", "body"):
            raise ConfigError(
                f"affinity {spec!r}: use a preset ({', '.join(sorted(AFFINITY_PRESETS))}) or "
                "'header:<name>', 'cookie:<name>' or 'body:<field>'"
            )
        return cls(kind.strip(), name.strip())  # type: ignore[arg-type]

    def spec(self) -> str:
        """The ``kind:name`` form (parent header not included)."""
        return f"{self.kind}:{self.name}"


#: The shapes documented in docs/scale-out.md (production-stack's key is whatever its
#: ``--session-key`` says; ``x-user-id`` is the name its examples use).
AFFINITY_PRESETS: dict[str, Affinity] = {
    "vllm-router": Affinity("header", "X-Session-ID"),
    "production-stack": Affinity("header", "x-user-id"),
    "llm-d": Affinity("cookie", "llm-d-session"),
    "dynamo": Affinity("header", "X-Dynamo-Session-ID", "X-Dynamo-Parent-Session-ID"),
}


def session_key(trajectory_id: str, scope: str | None) -> str:
    """The router session key of a trajectory in the tenant scope ``scope`` (its salt).

    None (no tenant): the trajectory id. Else ``<trajectory id>.<16 hex digits>``, a keyed
    BLAKE2b of the id under the scope: stable across processes of one tenant, distinct
    between tenants, and free of the salt itself.
    """
    if scope is None:
        return trajectory_id
    secret = hashlib.blake2b(scope.encode("utf-8", "surrogatepass"), digest_size=32).digest()
    mac = hashlib.blake2b(
        trajectory_id.encode("utf-8", "surrogatepass"),
        key=secret,
        digest_size=8,
        person=b"agentkv-session",
    )
    return f"{trajectory_id}.{mac.hexdigest()}"


def data_parallel_rank(trajectory_id: str, size: int) -> int:
    """The data-parallel rank a trajectory is pinned to: a stable hash modulo ``size``."""
    digest = hashlib.blake2b(trajectory_id.encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") % max(1, size)


def make_agentic_context(hints: RequestHints) -> str:
    """vllm-router's Program identity for one call, as the JSON string vLLM accepts.

    ``program_id`` is the trajectory's session key (:func:`session_key`: the router keeps
    one table of programs for every tenant), ``parent_program_id`` / ``root_program_id``
    its parent's and root's, ``step_id`` the turn; ``expected_resume`` is false when the harness
    marked the turn as the last or the advice releases the trajectory; ``kv_retention_ttl_seconds`` is the advised lease
    (a retain's TTL), else the gap model's predicted gap, when there is one;
    ``blocks_parent`` is a subagent's ``critical_path`` (its parent's join waits on it), when
    the harness said; ``expected_output_length`` the trajectory's mean answer length so far.
    """
    scope = hints.session_scope
    context: dict[str, Any] = {
        "program_id": session_key(hints.trajectory_id, scope),
        "step_id": hints.turn_id,
        "root_program_id": session_key(hints.root_id or hints.trajectory_id, scope),
    }
    if hints.parent_id is not None:
        context["parent_program_id"] = session_key(hints.parent_id, scope)
        if hints.critical_path is not None:
            context["blocks_parent"] = hints.critical_path
    advice = hints.advice
    released = advice is not None and advice.action == "release"
    context["expected_resume"] = not (hints.final or released)
    if advice is not None:
        ttl_ms = advice.ttl_ms if advice.action == "retain" else advice.predicted_gap_ms
        if ttl_ms is not None and ttl_ms > 0:
            context["kv_retention_ttl_seconds"] = round(float(ttl_ms) / 1000.0, 3)
    if hints.expected_output_tokens is not None and hints.expected_output_tokens > 0:
        context["expected_output_length"] = hints.expected_output_tokens
    return json.dumps(context, separators=(",", ":"))


class RouteKeys:
    """Per-client routing state: the affinity key, the cookie jar, the DP rank.

    ``affinity`` None means the backend's own session header (the adapters already send
    ``X-Session-ID`` or ``X-Dynamo-Session-ID``); control posts carry that same header.
    Every key is the trajectory's :func:`session_key` in the ``scope`` a caller names (the
    tenant's salt; ``scope_of`` maps a tenant to it where only the tenant is known, as in
    the cookie hook). Thread-safe; the jar is bounded (least recently used trajectories
    forgotten).
    """

    def __init__(
        self,
        affinity: Affinity | None,
        *,
        agentic_context: bool = False,
        max_trajectories: int = 10_000,
        scope_of: Callable[[str | None], str | None] | None = None,
    ) -> None:
        self.affinity = affinity
        self.agentic_context = agentic_context
        self.scope_of = scope_of
        self.default_header = "X-Session-ID"
        self.data_parallel_size = 1
        self._max = max_trajectories
        self._jar: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    # --- what the server told us ----------------------------------------------------
    def set_backend(self, name: str, capabilities: Mapping[str, Any]) -> None:
        """Take the backend's session header and the server's data-parallel size."""
        self.default_header = "X-Dynamo-Session-ID" if name == "dynamo" else "X-Session-ID"
        try:
            self.data_parallel_size = max(1, int(capabilities.get("data_parallel_size") or 1))
        except (TypeError, ValueError):
            self.data_parallel_size = 1

    def observe_response(self, trajectory_id: str, headers: Any, scope: str | None = None) -> None:
        """Learn the affinity cookie of a trajectory (in ``scope``) from an answer's
        ``Set-Cookie`` headers."""
        if self.affinity is None or self.affinity.kind != "cookie":
            return
        values = headers.get_list("set-cookie") if hasattr(headers, "get_list") else []
        for raw in values:
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(raw)
            except CookieError:
                continue
            morsel = jar.get(self.affinity.name)
            if morsel is not None and morsel.value:
                key = session_key(trajectory_id, scope)
                with self._lock:
                    self._jar[key] = morsel.value
                    self._jar.move_to_end(key)
                    while len(self._jar) > self._max:
                        self._jar.popitem(last=False)

    def install_cookie_hook(self, client: Any) -> None:
        """Learn cookies from ``client``'s answers (cookie affinity only).

        Adds a response hook to the OpenAI client's HTTP client; the hook runs in the
        calling thread or task, so it knows the current trajectory. The HTTP client's
        own cookie jar, shared by every trajectory, never keeps the affinity cookie.
        """
        if self.affinity is None or self.affinity.kind != "cookie":
            return
        http = getattr(client, "_client", None)
        hooks = getattr(http, "event_hooks", None)
        if not isinstance(hooks, dict) or not isinstance(hooks.get("response"), list):
            return

        name = self.affinity.name
        jar = getattr(http, "cookies", None)

        def observe(response: Any) -> None:
            try:
                traj = current_trajectory()
                if traj is not None:
                    scope = self.scope_of(traj.tenant) if self.scope_of is not None else None
                    self.observe_response(traj.trajectory_id, response.headers, scope)
                # The HTTP client's own jar is shared by every trajectory: keep the affinity
                # cookie out of it, or a new trajectory would inherit another one's replica.
                if jar is not None:
                    jar.delete(name)
            except Exception as exc:  # never break the user's call (invariant 1)
                internal_error("affinity cookie", exc)

        async def observe_async(response: Any) -> None:
            observe(response)

        is_async = type(http).__name__.startswith("Async")
        hooks["response"].append(observe_async if is_async else observe)

    def cookie(self, trajectory_id: str, scope: str | None = None) -> str | None:
        """The affinity cookie learned for a trajectory (in ``scope``), if any."""
        return self._jar.get(session_key(trajectory_id, scope))

    # --- what goes on the wire ---------------------------------------------------------
    def session_headers(
        self,
        trajectory_id: str,
        parent_id: str | None,
        *,
        default: bool = True,
        scope: str | None = None,
    ) -> dict[str, str]:
        """The headers that keep a trajectory's requests together (its session key in
        ``scope``, the tenant's salt).

        ``default``: without a configured affinity, include the backend's own session
        header (control posts need it; model calls already carry it from the adapter).
        """
        out: dict[str, str] = {}
        affinity = self.affinity
        key = session_key(trajectory_id, scope)
        if affinity is None:
            if default:
                out[self.default_header] = key
        elif affinity.kind == "header":
            out[affinity.name] = key
            if affinity.parent_header and parent_id is not None:
                out[affinity.parent_header] = session_key(parent_id, scope)
        elif affinity.kind == "cookie":
            value = self.cookie(trajectory_id, scope)
            if value is not None:
                out["Cookie"] = f"{affinity.name}={value}"
        if self.data_parallel_size > 1:
            out[DP_RANK_HEADER] = str(data_parallel_rank(trajectory_id, self.data_parallel_size))
        return out

    def session_body(self, trajectory_id: str, scope: str | None = None) -> dict[str, str]:
        """Top-level body fields that carry the key (``body:<field>`` affinity only)."""
        affinity = self.affinity
        if affinity is not None and affinity.kind == "body":
            return {affinity.name: session_key(trajectory_id, scope)}
        return {}

    def apply(self, hints: RequestHints, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Add the key (and DP rank, and Program metadata) to a model call's request."""
        if self.affinity is None and self.data_parallel_size <= 1 and not self.agentic_context:
            return  # nothing to add (the adapter's own session header is already there)
        scope = hints.session_scope
        headers.update(
            self.session_headers(hints.trajectory_id, hints.parent_id, default=False, scope=scope)
        )
        body.update(self.session_body(hints.trajectory_id, scope))
        if self.agentic_context:
            xargs = body.setdefault("vllm_xargs", {})
            if isinstance(xargs, dict):
                xargs["agentic_context"] = make_agentic_context(hints)
