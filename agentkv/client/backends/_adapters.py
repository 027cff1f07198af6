"""Backend adapters: one request intent, mapped onto what each server understands.

The client wrapper builds a backend-neutral :class:`RequestHints` for each model call
made inside a trajectory; an adapter writes it into the request's extra body fields and
headers. Adapters only add fields; the caller's own values win (the client merges).
No adapter writes prompt text, tool arguments or outputs: only ids, classes, numbers
and hashes (invariant 2).

- :class:`VLLMAdapter` — ``session_id`` / ``X-Session-ID``, ``X-Request-Id``, the
  tenant's ``cache_salt``, flat ``vllm_xargs`` keys plus the ``agentkv_hints`` envelope
  (docs/protocol.md), and ``priority`` where the server schedules by priority.
- :class:`OpenAIHostedAdapter` — ``prompt_cache_key`` stable per trajectory family and,
  when the predicted gap outlives in-memory caching, the model's retention field.
- :class:`DynamoAdapter` — ``X-Dynamo-Session-*`` headers and ``nvext`` (``agent_context``,
  ``agent_hints``, ``cache_salt``).
- :class:`GenericAdapter` — headers only (``X-Session-ID``, ``X-Request-Id``): harmless
  on any server.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any, ClassVar, Literal, NamedTuple, Protocol

from agentkv._protocol import (
    PROTOCOL_VERSION,
    XARG_ACTION,
    XARG_GAP_MS,
    XARG_GAP_P90_MS,
    XARG_GAP_P99_MS,
    XARG_HINTS,
    XARG_PARENT,
    XARG_POLICY,
    XARG_PRIORITY,
    XARG_REASON,
    XARG_TRAJECTORY,
    XARG_TTL_MS,
    XARG_TURN,
    build_envelope,
    envelope_of_payload_json,
)
from agentkv.events._schema import CacheAdvice

__all__ = [
    "PROTOCOL_VERSION",
    "Api",
    "BackendAdapter",
    "BackendName",
    "DynamoAdapter",
    "GenericAdapter",
    "OpenAIHostedAdapter",
    "RequestHints",
    "VLLMAdapter",
    "hosted_cache_field",
    "make_envelope",
    "make_hints",
]

Api = Literal["chat", "completions", "responses", "messages"]
BackendName = Literal["vllm", "openai", "dynamo", "generic", "anthropic"]


@dataclass(frozen=True)
class RequestHints:
    """Everything agentkv wants a server to know about one model call (no content).

    Frozen, and kept in a ``__dict__`` rather than slots so that the client builds one per
    call in one step (:func:`make_hints`).
    """

    trajectory_id: str
    turn_id: int
    request_id: str
    api: Api = "chat"
    parent_id: str | None = None
    tenant: str | None = None
    cache_salt: str | None = None
    family_key: str | None = None  # stable id of the trajectory family (hosted cache key)
    advice: CacheAdvice | None = None  # None in observe / shadow mode
    #: False in observe / shadow mode: only cache identity (the tenant's salt) is
    #: written, nothing that could change how the server schedules or keeps the request.
    scheduling: bool = True
    session_type: str | None = None  # the workload class (Dynamo's session_type_id)
    final: bool = False  # the harness marked this turn as the trajectory's last
    model: str | None = None  # the requested model (hosted retention is model-aware)
    gap_p50_s: float | None = None  # the learned gap before the next call (median)
    gap_p90_s: float | None = None  # ... and its 90th percentile
    root_id: str | None = None  # the outermost trajectory (a subagent's root)


_new = object.__new__
_setattr = object.__setattr__
_HINT_FIELDS = frozenset(RequestHints.__dataclass_fields__)


def make_hints(fields: dict[str, Any]) -> RequestHints:
    """``RequestHints(**fields)`` for ``fields`` naming every field, at a fraction of the
    frozen dataclass's per-field cost (the client makes one per model call). ``fields``
    becomes the instance's state: pass a fresh dict."""
    if fields.keys() != _HINT_FIELDS:
        return RequestHints(**fields)
    hints = _new(RequestHints)
    _setattr(hints, "__dict__", fields)
    return hints


class BackendAdapter(Protocol):
    """Writes :class:`RequestHints` into a request's extra body and headers."""

    control_url: str | None  # root of the agentkv control route, when the server has one
    #: True when the backend takes a tenant's ``cache_salt`` (cache isolation).
    carries_salt: ClassVar[bool]

    @property
    def name(self) -> BackendName:
        """The backend's name: ``vllm``, ``openai``, ``dynamo`` or ``generic``."""

    def apply(self, hints: RequestHints, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Add this backend's fields for ``hints`` to ``body`` and ``headers``.

        An adapter may also define ``rewrite(hints, request) -> dict``: top-level request
        fields to replace (the Anthropic adapter marks cache breakpoints that way).
        """


def make_envelope(hints: RequestHints, gaps: list[tuple[str, int]] | None = None) -> str:
    """The ``agentkv_hints`` value: JSON of a KvHintsEnvelope carrying the advice.

    ``gaps``: the advice's :func:`_gap_fields`, when the caller has them already.
    """
    advice = hints.advice
    if advice is None:
        return build_envelope(None, {})
    payload: dict[str, Any] = {
        "trajectory_id": hints.trajectory_id,
        "turn_id": hints.turn_id,
        "reason": advice.reason,
        "policy_version": advice.policy_version,
    }
    if advice.ttl_ms is not None:
        payload["ttl_ms"] = advice.ttl_ms
    for key, value in _gap_fields(advice) if gaps is None else gaps:
        payload[key] = value
    if advice.priority is not None:
        payload["priority"] = advice.priority
    if hints.parent_id is not None:
        payload["parent_trajectory_id"] = hints.parent_id
    return build_envelope(advice.action, payload)


class _AdviceParts(NamedTuple):
    """What a decision (an advice less its trajectory, turn and priority) puts on the
    wire, written once: ``vllm_xargs`` entries before and after the priority, and the
    envelope payload's middle (``"reason"`` to the gap fields) as compact JSON."""

    head: dict[str, str | int]
    tail: dict[str, str | int]
    payload_mid: str


_PARTS: dict[tuple[Any, ...], _AdviceParts | None] = {}
_MAX_PARTS = 256
_quote = encode_basestring_ascii  # how ``json.dumps`` writes a str (ASCII)


def _advice_parts(advice: CacheAdvice) -> _AdviceParts | None:
    """The wire parts of ``advice``'s decision (cached), or None when a value is not a
    plain str / int (then the general path writes it)."""
    key = (
        advice.action,
        advice.ttl_ms,
        type(advice.ttl_ms),  # 1 and 1.0 are one key but not one JSON text
        advice.predicted_gap_ms,
        advice.predicted_gap_p90_ms,
        advice.predicted_gap_p99_ms,
        advice.reason,
        advice.policy_version,
    )
    try:
        return _PARTS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable value
        return None
    parts = _make_parts(advice)
    if len(_PARTS) >= _MAX_PARTS:
        _PARTS.clear()
    _PARTS[key] = parts
    return parts


def _make_parts(advice: CacheAdvice) -> _AdviceParts | None:
    if type(advice.action) is not str:
        return None
    head: dict[str, str | int] = {XARG_ACTION: advice.action}
    mid: list[tuple[str, Any]] = [
        ("reason", advice.reason),
        ("policy_version", advice.policy_version),
    ]
    if advice.ttl_ms is not None:
        head[XARG_TTL_MS] = int(advice.ttl_ms)
        mid.append(("ttl_ms", advice.ttl_ms))
    for key, value in _gap_fields(advice):
        head[_GAP_XARGS[key]] = value
        mid.append((key, value))
    written = []
    for key, value in mid:
        if type(value) is str:
            written.append(f',"{key}":{_quote(value)}')
        elif type(value) is int:
            written.append(f',"{key}":{int.__repr__(value)}')
        else:
            return None
    tail: dict[str, str | int] = {XARG_REASON: advice.reason, XARG_POLICY: advice.policy_version}
    return _AdviceParts(head, tail, "".join(written))


def _gap_fields(advice: CacheAdvice) -> list[tuple[str, int]]:
    """The advice's gap forecast as ``(envelope key, whole ms)`` pairs (set ones only)."""
    out = []
    for key, value in (
        ("gap_ms", advice.predicted_gap_ms),
        ("gap_p90_ms", advice.predicted_gap_p90_ms),
        ("gap_p99_ms", advice.predicted_gap_p99_ms),
    ):
        if value is not None:
            out.append((key, round(value)))
    return out


_GAP_XARGS = {"gap_ms": XARG_GAP_MS, "gap_p90_ms": XARG_GAP_P90_MS, "gap_p99_ms": XARG_GAP_P99_MS}


def _session_headers(hints: RequestHints, headers: dict[str, str]) -> None:
    headers["X-Session-ID"] = hints.trajectory_id
    headers["X-Request-Id"] = hints.request_id


@dataclass
class GenericAdapter:
    """Headers only: ``X-Session-ID`` and ``X-Request-Id``. Safe on any server."""

    name: ClassVar[BackendName] = "generic"
    carries_salt: ClassVar[bool] = False
    control_url: str | None = None

    def apply(self, hints: RequestHints, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Add the session and request id headers."""
        if hints.scheduling:
            _session_headers(hints, headers)


@dataclass
class VLLMAdapter:
    """vLLM (with or without the agentkv plugin): body fields and flat ``vllm_xargs``.

    ``priority_supported`` comes from the capability probe (the server runs
    ``--scheduling-policy priority``); without it the advised priority travels only as
    ``agentkv_priority`` inside ``vllm_xargs``, which the plugin bounds and applies.
    """

    name: ClassVar[BackendName] = "vllm"
    carries_salt: ClassVar[bool] = True
    control_url: str | None = None
    priority_supported: bool = False
    capabilities: dict[str, Any] = field(default_factory=dict)

    def apply(self, hints: RequestHints, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Add ``session_id``, ``cache_salt``, ``priority`` and ``vllm_xargs``."""
        if hints.cache_salt is not None:
            body["cache_salt"] = hints.cache_salt
        if not hints.scheduling:
            return
        _session_headers(hints, headers)
        body["session_id"] = hints.trajectory_id
        xargs: dict[str, str | int | float] = {
            XARG_TRAJECTORY: hints.trajectory_id,
            XARG_TURN: hints.turn_id,
        }
        if hints.parent_id is not None:
            xargs[XARG_PARENT] = hints.parent_id
        advice = hints.advice
        if advice is not None and not self._fast_advice(hints, advice, body, xargs):
            xargs[XARG_ACTION] = advice.action
            if advice.ttl_ms is not None:
                xargs[XARG_TTL_MS] = int(advice.ttl_ms)
            gaps = _gap_fields(advice)
            for key, value in gaps:
                xargs[_GAP_XARGS[key]] = value
            if advice.priority is not None:
                xargs[XARG_PRIORITY] = int(advice.priority)
                if self.priority_supported:
                    body["priority"] = int(advice.priority)
            xargs[XARG_REASON] = advice.reason
            xargs[XARG_POLICY] = advice.policy_version
            xargs[XARG_HINTS] = make_envelope(hints, gaps)
        body["vllm_xargs"] = xargs

    def _fast_advice(
        self,
        hints: RequestHints,
        advice: CacheAdvice,
        body: dict[str, Any],
        xargs: dict[str, str | int | float],
    ) -> bool:
        """The advice's xargs and envelope from its decision's cached parts (what the
        general path writes, byte for byte); False when they do not apply."""
        parts = _advice_parts(advice)
        tid, turn, priority, parent = (
            hints.trajectory_id,
            hints.turn_id,
            advice.priority,
            hints.parent_id,
        )
        if (
            parts is None
            or type(tid) is not str
            or type(turn) is not int
            or (priority is not None and type(priority) is not int)
            or (parent is not None and type(parent) is not str)
        ):
            return False
        xargs.update(parts.head)
        payload = (
            f'{{"trajectory_id":{_quote(tid)},"turn_id":{int.__repr__(turn)}{parts.payload_mid}'
        )
        if priority is not None:
            xargs[XARG_PRIORITY] = priority
            if self.priority_supported:
                body["priority"] = priority
            payload += f',"priority":{int.__repr__(priority)}'
        if parent is not None:
            payload += f',"parent_trajectory_id":{_quote(parent)}'
        xargs.update(parts.tail)
        xargs[XARG_HINTS] = envelope_of_payload_json(advice.action, payload + "}")
        return True


#: Predicted gaps beyond this outlive OpenAI's in-memory prompt cache (5-10 min idle).
_IN_MEMORY_WINDOW_MS = 300_000
_GPT_VERSION = re.compile(r"^(?:ft:)?gpt-(\d+)(?:\.(\d+))?")


def hosted_cache_field(model: str | None) -> Literal["options", "retention", None]:
    """Which longer-retention field a hosted OpenAI model takes (model-aware).

    ``gpt-5.6`` and later: ``prompt_cache_options`` (``ttl``; ``prompt_cache_retention``
    is deprecated there); ``gpt-5.1`` to ``gpt-5.5``: ``prompt_cache_retention="24h"``;
    any other model: neither (an unsupported value is an HTTP 400).
    """
    match = _GPT_VERSION.match(model or "")
    if match is None:
        return None
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    if (major, minor) >= (5, 6):
        return "options"
    if (major, minor) >= (5, 1):
        return "retention"
    return None


@dataclass
class OpenAIHostedAdapter:
    """Hosted OpenAI API: ``prompt_cache_key`` per trajectory family, longer retention.

    The key is a hash of the tenant and the family (the root trajectory id, or
    ``metadata["cache_family"]``), so related calls route to the same cache without
    fragmenting it per request. When the advice retains across a gap longer than the
    in-memory cache lasts, the model's longer-retention field is added
    (:func:`hosted_cache_field`): ``prompt_cache_options.ttl`` (``30m``) on models that
    take it, ``prompt_cache_retention="24h"`` on the models before them. No headers and
    no unknown body fields are sent: the API rejects unknown parameters. The provider
    isolates caches per organization; agentkv has no salt to add here.
    """

    name: ClassVar[BackendName] = "openai"
    carries_salt: ClassVar[bool] = False
    control_url: str | None = None

    def apply(self, hints: RequestHints, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Add ``prompt_cache_key`` (and the model's retention field for long gaps)."""
        if hints.api == "completions" or not hints.scheduling:
            return  # the legacy completions endpoint has no prompt-cache fields
        family = hints.family_key or hints.trajectory_id
        material = f"{hints.tenant or ''}\x00{family}".encode("utf-8", "surrogatepass")
        body["prompt_cache_key"] = "akv-" + hashlib.sha256(material).hexdigest()[:32]
        advice = hints.advice
        if (
            advice is None
            or advice.action not in ("retain", "prefetch")
            or (advice.predicted_gap_ms or 0.0) <= _IN_MEMORY_WINDOW_MS
        ):
            return
        field_kind = hosted_cache_field(hints.model)
        if field_kind == "options":
            body["prompt_cache_options"] = {"ttl": "30m"}
        elif field_kind == "retention":
            body["prompt_cache_retention"] = "24h"


@dataclass
class DynamoAdapter:
    """NVIDIA Dynamo: session headers and ``nvext`` (``agent_context``, ``agent_hints``).

    - headers: ``X-Dynamo-Session-ID`` (this trajectory: one reasoning/tool chain),
      ``X-Dynamo-Parent-Session-ID`` for a subagent, ``X-Dynamo-Session-Final: true``
      on a turn the harness marked as the last (:attr:`RequestHints.final`);
    - ``nvext.agent_context``: ``session_type_id`` (the workload class), ``session_id``
      (the root run), ``trajectory_id`` and ``parent_trajectory_id``;
    - ``nvext.cache_salt``: the tenant's salt (cache identity, sent in every mode);
    - ``nvext.agent_hints``: ``priority`` (Dynamo's is "higher runs sooner", the
      opposite of vLLM's, so the advised priority is negated) and
      ``speculative_prefill`` for a prefetch. The deprecated ``nvext.cache_control``
      is not sent.
    """

    name: ClassVar[BackendName] = "dynamo"
    carries_salt: ClassVar[bool] = True
    control_url: str | None = None

    def apply(self, hints: RequestHints, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Add the Dynamo session headers and ``nvext``."""
        nvext: dict[str, Any] = {}
        if hints.cache_salt is not None:
            nvext["cache_salt"] = hints.cache_salt
        if hints.scheduling:
            headers["X-Dynamo-Session-ID"] = hints.trajectory_id
            if hints.parent_id is not None:
                headers["X-Dynamo-Parent-Session-ID"] = hints.parent_id
            if hints.final:
                headers["X-Dynamo-Session-Final"] = "true"
            headers["X-Request-Id"] = hints.request_id
            context: dict[str, Any] = {
                "session_type_id": hints.session_type or "agentkv",
                "session_id": hints.family_key or hints.trajectory_id,
                "trajectory_id": hints.trajectory_id,
            }
            if hints.parent_id is not None:
                context["parent_trajectory_id"] = hints.parent_id
            nvext["agent_context"] = context
            advice = hints.advice
            if advice is not None:
                agent_hints: dict[str, Any] = {}
                if advice.priority is not None:
                    agent_hints["priority"] = -int(advice.priority)
                if advice.action == "prefetch":
                    agent_hints["speculative_prefill"] = True
                if agent_hints:
                    nvext["agent_hints"] = agent_hints
        if nvext:
            body["nvext"] = nvext
