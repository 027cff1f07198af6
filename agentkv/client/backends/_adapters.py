"""Backend adapters: one request intent, mapped onto what each server understands.

The client wrapper builds a backend-neutral :class:`RequestHints` for each model call
made inside a trajectory; an adapter writes it into the request's extra body fields and
headers. Adapters only add fields; the caller's own values win (the client merges).
No adapter writes prompt text, tool arguments or outputs: only ids, classes, numbers
and hashes (invariant 2).

- :class:`VLLMAdapter` — ``session_id`` / ``X-Session-ID``, ``X-Request-Id``, the
  tenant's ``cache_salt``, the hint in ``vllm_xargs`` in one form (the envelope where the
  server advertises it, else flat keys: docs/protocol.md), and ``priority`` where the
  server schedules by priority.
- :class:`OpenAIHostedAdapter` — ``prompt_cache_key`` stable per trajectory family,
  when the predicted gap outlives in-memory caching the model's retention field (a TTL
  from the gap forecast), and an explicit ``prompt_cache_breakpoint`` after the
  instructions.
- :class:`DynamoAdapter` — ``X-Dynamo-Session-*`` headers and ``nvext`` (``agent_context``,
  ``agent_hints``, ``cache_salt``).
- :class:`GenericAdapter` — headers only (``X-Session-ID``, ``X-Request-Id``): harmless
  on any server.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from agentkv.client._affinity import session_key
from agentkv.events._schema import CacheAdvice
from agentkv.protocol._hints import encode_hint, encode_kv_hints_field
from agentkv.protocol._wire import (
    ENVELOPE_FEATURE,
    KV_HINTS_FIELD_FEATURE,
    PROTOCOL_VERSION,
    XARG_HINTS,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Api",
    "BackendAdapter",
    "BackendName",
    "DynamoAdapter",
    "GenericAdapter",
    "HostedCachePlan",
    "OpenAIHostedAdapter",
    "RequestHints",
    "VLLMAdapter",
    "hosted_cache_field",
    "make_envelope",
    "make_hints",
    "plan_hosted_cache",
    "prewarm_pays",
]

Api = Literal["chat", "completions", "responses", "messages"]
BackendName = Literal["vllm", "openai", "dynamo", "generic", "anthropic"]


@dataclass(frozen=True)
class RequestHints:
    """Everything agentkv wants a server to know about one model call (no content)."""

    trajectory_id: str
    turn_id: int
    request_id: str
    api: Api = "chat"
    parent_id: str | None = None
    #: The trajectory scope's ``critical_path`` (the join waits on it; None: not said).
    #: Only the vLLM adapter sends it: no hosted API has such a field.
    critical_path: bool | None = None
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
    #: The output length this call is expected to have: the mean of the trajectory's
    #: answered turns (capped by the request's own limit); None before the first answer.
    expected_output_tokens: int | None = None
    root_id: str | None = None  # the outermost trajectory (a subagent's root)
    #: The tenant's salt, whether or not this call sends it: router session keys are
    #: scoped by it (``session_key``); it is never written as a key itself.
    session_scope: str | None = None

    def session_key(self) -> str:
        """This trajectory's router session key (tenant-scoped: ``_affinity.session_key``)."""
        return session_key(self.trajectory_id, self.session_scope)

    def parent_session_key(self) -> str | None:
        """The parent trajectory's router session key, for a subagent."""
        return None if self.parent_id is None else session_key(self.parent_id, self.session_scope)


def make_hints(fields: dict[str, Any]) -> RequestHints:
    """``RequestHints(**fields)``."""
    return RequestHints(**fields)


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


def make_envelope(hints: RequestHints) -> str:
    """The ``agentkv_hints`` value for ``hints``: JSON of a KvHintsEnvelope carrying the
    advice (the request-hint codec's envelope form)."""
    xargs = encode_hint(
        hints.trajectory_id,
        hints.turn_id,
        hints.parent_id,
        hints.advice,
        envelope=True,
        critical_path=hints.critical_path,
    )
    return str(xargs[XARG_HINTS])


def _session_headers(hints: RequestHints, headers: dict[str, str]) -> None:
    headers["X-Session-ID"] = hints.session_key()
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
    """vLLM (with or without the agentkv plugin): body fields and the hint in ``vllm_xargs``.

    ``capabilities`` are what the probe read. The hint goes, one form per request: in
    vLLM's own ``kv_hints`` request field (the envelope as a JSON object) where they list
    the ``kv_hints_field`` feature (the server's HTTP API takes the field and its scheduler
    reads agentkv's hint from it); else in ``vllm_xargs``, in the envelope form where they
    list ``hint_envelope``, else in the flat form.
    ``priority_supported`` comes from the capability probe (the server runs
    ``--scheduling-policy priority``); without it the advised priority travels only as
    the hint's ``priority`` inside ``vllm_xargs``, which the plugin bounds and applies.
    """

    name: ClassVar[BackendName] = "vllm"
    carries_salt: ClassVar[bool] = True
    control_url: str | None = None
    priority_supported: bool = False
    capabilities: dict[str, Any] = field(default_factory=dict)
    #: The server reads the envelope form of hints (its capabilities list the feature).
    envelope: bool = field(init=False, default=False)
    #: The server takes the envelope in vLLM's ``kv_hints`` request field.
    kv_hints_field: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        features = self.capabilities.get("features")
        if not isinstance(features, dict):
            return
        self.envelope = features.get(ENVELOPE_FEATURE) is True
        self.kv_hints_field = features.get(KV_HINTS_FIELD_FEATURE) is True

    def apply(self, hints: RequestHints, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Add ``session_id``, ``cache_salt``, ``priority`` and the hint (``kv_hints`` where
        advertised, else ``vllm_xargs``)."""
        if hints.cache_salt is not None:
            body["cache_salt"] = hints.cache_salt
        if not hints.scheduling:
            return
        _session_headers(hints, headers)
        body["session_id"] = hints.session_key()
        advice = hints.advice
        if advice is not None and advice.priority is not None and self.priority_supported:
            body["priority"] = int(advice.priority)
        ids = (hints.trajectory_id, hints.turn_id, hints.parent_id, advice)
        if self.kv_hints_field:
            body.update(encode_kv_hints_field(*ids, critical_path=hints.critical_path))
            return
        body["vllm_xargs"] = encode_hint(
            *ids, envelope=self.envelope, critical_path=hints.critical_path
        )


#: Predicted gaps beyond this outlive OpenAI's in-memory prompt cache (5-10 min idle).
_IN_MEMORY_WINDOW_MS = 300_000
#: ``prompt_cache_options.ttl`` values: ``30m`` everywhere it exists, ``12h`` on the
#: Responses API only (the Chat Completions API takes ``30m`` alone; openai 3.57's types).
_TTL_30M_MS = 1_800_000
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


@dataclass(frozen=True)
class HostedCachePlan:
    """What agentkv adds to one hosted OpenAI request for its prompt cache (pure decision).

    - ``ttl``: ``prompt_cache_options.ttl`` (``30m`` / ``12h``), or None;
    - ``retention``: the deprecated ``prompt_cache_retention`` (``24h``) on ``gpt-5.1`` to
      ``gpt-5.5``, or None. At most one of ``ttl`` and ``retention`` is set: a request never
      carries both the old and the new field;
    - ``breakpoint``: place one explicit ``prompt_cache_breakpoint`` at the end of the
      leading system / developer text (models with ``prompt_cache_options`` only).

    ``prompt_cache_options.prewarm`` is never part of a plan: it makes the request write
    the cache *instead of* generating output, so on the caller's own call it would return
    no answer. It pays only as a separate request sent before the cache expires when the
    gap outlasts the longest TTL a request can buy (12 h on the Responses API); agentkv
    buys the TTL instead and sends no request of its own (docs/client.md).
    :func:`prewarm_pays` is that rule, for a caller who sends one.
    """

    ttl: Literal["30m", "12h"] | None = None
    retention: Literal["24h"] | None = None
    breakpoint: bool = False


def _gap_horizon_ms(advice: CacheAdvice | None) -> float | None:
    """The gap to cover: its 90th percentile where the forecast has one, else the median."""
    if advice is None:
        return None
    for value in (advice.predicted_gap_p90_ms, advice.predicted_gap_ms):
        if value is not None:
            return float(value)
    return None


def plan_hosted_cache(model: str | None, api: Api, advice: CacheAdvice | None) -> HostedCachePlan:
    """The cache fields for a hosted OpenAI request of ``model`` on ``api`` (pure).

    Retention follows the gap forecast: nothing while the predicted gap (p90 where known)
    stays within the in-memory cache (5 min) or the advice does not retain; past it,
    ``prompt_cache_options.ttl`` on ``gpt-5.6`` and later — ``30m`` for a gap up to
    30 minutes, ``12h`` beyond on the Responses API (Chat Completions takes only ``30m``) —
    and ``prompt_cache_retention="24h"`` on ``gpt-5.1`` to ``gpt-5.5``. A breakpoint is
    planned on every ``gpt-5.6``+ chat or responses request (the advice aside): it marks
    the shared instructions so other trajectories of the family and branches reuse them.
    """
    kind = hosted_cache_field(model)
    if api not in ("chat", "responses") or kind is None:
        return HostedCachePlan()
    breakpoint = kind == "options"
    horizon = _gap_horizon_ms(advice)
    if (
        advice is None
        or advice.action not in ("retain", "prefetch")
        or horizon is None
        or horizon <= _IN_MEMORY_WINDOW_MS
    ):
        return HostedCachePlan(breakpoint=breakpoint)
    if kind == "retention":
        return HostedCachePlan(retention="24h")
    long_ttl = api == "responses" and horizon > _TTL_30M_MS
    return HostedCachePlan(ttl="12h" if long_ttl else "30m", breakpoint=True)


def prewarm_pays(model: str | None, api: Api, predicted_gap_ms: float | None) -> bool:
    """Whether a separate ``prewarm`` request before the return would pay (pure rule).

    Only on the Responses API of a ``gpt-5.6``+ model (the only place the field exists),
    and only when the gap outlasts the longest TTL a request can buy there (12 h): within
    it, buying the TTL on the request keeps the cache for free, and a prewarm request
    would bill the whole prefix again for nothing.
    """
    if api != "responses" or hosted_cache_field(model) != "options":
        return False
    return predicted_gap_ms is not None and predicted_gap_ms > 12 * 3600 * 1000


@dataclass
class OpenAIHostedAdapter:
    """Hosted OpenAI API: ``prompt_cache_key`` per trajectory family, retention, breakpoints.

    The key is a hash of the tenant and the family (the root trajectory id, or
    ``metadata["cache_family"]``), so related calls route to the same cache without
    fragmenting it per request. When the advice retains across a gap longer than the
    in-memory cache lasts, the model's longer-retention field is added
    (:func:`plan_hosted_cache`): ``prompt_cache_options.ttl`` (``30m``, or ``12h`` for a
    gap beyond 30 minutes on the Responses API) on models that take it,
    ``prompt_cache_retention="24h"`` on the models before them. On ``gpt-5.6``+ the end of
    the leading system / developer text gets an explicit ``prompt_cache_breakpoint``
    (:meth:`rewrite`). No headers and no unknown body fields are sent: the API rejects
    unknown parameters. The provider isolates caches per organization; agentkv has no salt
    to add here. A caller who set either retention field (``prompt_cache_retention`` or
    ``prompt_cache_options``, as an argument or through ``extra_body``) keeps theirs alone:
    agentkv adds neither, so a request never carries both the old and the new field
    (:meth:`yield_to_caller`); a caller's own breakpoint, or ``mode="explicit"``, leaves the
    messages as they are. ``prewarm`` is never set on a caller's request
    (:class:`HostedCachePlan`).
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
        plan = plan_hosted_cache(hints.model, hints.api, hints.advice)
        if plan.ttl is not None:
            body["prompt_cache_options"] = {"ttl": plan.ttl}
        elif plan.retention is not None:
            body["prompt_cache_retention"] = plan.retention

    def rewrite(self, hints: RequestHints, request: Mapping[str, Any]) -> dict[str, Any]:
        """``messages`` (Chat) or ``input`` (Responses) with one explicit breakpoint at the
        end of the leading system / developer text; empty when there is none to mark, the
        model has no breakpoints, or the caller placed breakpoints (or chose
        ``mode="explicit"``) themselves."""
        if not hints.scheduling or hints.api not in ("chat", "responses"):
            return {}
        if not plan_hosted_cache(hints.model, hints.api, hints.advice).breakpoint:
            return {}
        options = request.get("prompt_cache_options")
        if isinstance(options, Mapping) and options.get("mode") == "explicit":
            return {}
        key = "messages" if hints.api == "chat" else "input"
        items = request.get(key)
        if not isinstance(items, list) or _has_openai_breakpoint(items):
            return {}
        marked = _mark_instructions(items, "text" if key == "messages" else "input_text")
        return {} if marked is None else {key: marked}

    def yield_to_caller(self, request: Mapping[str, Any], body: dict[str, Any]) -> None:
        """Drop agentkv's retention field where the caller's ``request`` sets one."""
        if any(_given(request.get(k)) for k in _RETENTION_FIELDS):
            for k in _RETENTION_FIELDS:
                body.pop(k, None)


#: OpenAI's longer-retention fields: the deprecated one and its successor.
_RETENTION_FIELDS = ("prompt_cache_retention", "prompt_cache_options")
_BREAKPOINT = {"mode": "explicit"}


def _has_openai_breakpoint(value: Any) -> bool:
    """A ``prompt_cache_breakpoint`` anywhere in ``value`` (the caller's own)."""
    if isinstance(value, Mapping):
        return "prompt_cache_breakpoint" in value or any(
            _has_openai_breakpoint(v) for v in value.values()
        )
    if isinstance(value, list):
        return any(_has_openai_breakpoint(v) for v in value)
    return False


def _mark_instructions(items: list[Any], part_type: str) -> list[Any] | None:
    """A copy of ``items`` whose last leading system / developer message ends in a marked
    text part, or None when the leading messages hold no non-empty text to mark. Nothing
    of the caller's is changed in place."""
    last = None
    for i, item in enumerate(items):
        if not (isinstance(item, Mapping) and item.get("role") in ("system", "developer")):
            break
        last = i
    if last is None:
        return None
    message = items[last]
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return None
        parts: list[Any] = [
            {"type": part_type, "text": content, "prompt_cache_breakpoint": dict(_BREAKPOINT)}
        ]
    elif isinstance(content, list) and content:
        tail = content[-1]
        if not (
            isinstance(tail, Mapping)
            and tail.get("type") in ("text", "input_text")
            and isinstance(tail.get("text"), str)
            and tail["text"]
        ):
            return None  # the prefix would end on a non-text or empty part: leave it implicit
        parts = [*content[:-1], {**tail, "prompt_cache_breakpoint": dict(_BREAKPOINT)}]
    else:
        return None
    return [*items[:last], {**message, "content": parts}, *items[last + 1 :]]


def _given(value: Any) -> bool:
    """A field the caller set (the SDK leaves an omitted one out, or as a sentinel)."""
    return isinstance(value, (str, Mapping))


@dataclass
class DynamoAdapter:
    """NVIDIA Dynamo: session headers and ``nvext`` (``agent_context``, ``agent_hints``).

    - headers: ``X-Dynamo-Session-ID`` (this trajectory: one reasoning/tool chain),
      ``X-Dynamo-Parent-Session-ID`` for a subagent, ``X-Dynamo-Session-Final: true``
      on a turn the harness marked as the last (:attr:`RequestHints.final`);
    - ``nvext.agent_context``: ``session_type_id`` (the workload class), ``session_id``
      (the root run), ``trajectory_id`` and ``parent_trajectory_id``, each id the
      tenant-scoped session key (as in the headers);
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
            headers["X-Dynamo-Session-ID"] = hints.session_key()
            parent_key = hints.parent_session_key()
            if parent_key is not None:
                headers["X-Dynamo-Parent-Session-ID"] = parent_key
            if hints.final:
                headers["X-Dynamo-Session-Final"] = "true"
            headers["X-Request-Id"] = hints.request_id
            # Every id is the tenant-scoped session key, as in the headers: a router or
            # a worker keying by these cannot mix two tenants' "1".
            context: dict[str, Any] = {
                "session_type_id": hints.session_type or "agentkv",
                "session_id": session_key(
                    hints.family_key or hints.trajectory_id, hints.session_scope
                ),
                "trajectory_id": hints.session_key(),
            }
            if parent_key is not None:
                context["parent_trajectory_id"] = parent_key
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
