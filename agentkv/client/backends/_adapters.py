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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from agentkv.client._affinity import session_key
from agentkv.events._schema import CacheAdvice
from agentkv.protocol._hints import encode_hint
from agentkv.protocol._wire import ENVELOPE_FEATURE, PROTOCOL_VERSION, XARG_HINTS

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
    """Everything agentkv wants a server to know about one model call (no content)."""

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
        hints.trajectory_id, hints.turn_id, hints.parent_id, hints.advice, envelope=True
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

    ``capabilities`` are what the probe read; the hint goes in the envelope form where
    they list the ``hint_envelope`` feature, else in the flat form.
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

    def __post_init__(self) -> None:
        features = self.capabilities.get("features")
        self.envelope = isinstance(features, dict) and features.get(ENVELOPE_FEATURE) is True

    def apply(self, hints: RequestHints, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Add ``session_id``, ``cache_salt``, ``priority`` and ``vllm_xargs``."""
        if hints.cache_salt is not None:
            body["cache_salt"] = hints.cache_salt
        if not hints.scheduling:
            return
        _session_headers(hints, headers)
        body["session_id"] = hints.session_key()
        advice = hints.advice
        if advice is not None and advice.priority is not None and self.priority_supported:
            body["priority"] = int(advice.priority)
        body["vllm_xargs"] = encode_hint(
            hints.trajectory_id, hints.turn_id, hints.parent_id, advice, envelope=self.envelope
        )


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
    isolates caches per organization; agentkv has no salt to add here. A caller who set
    either retention field (``prompt_cache_retention`` or ``prompt_cache_options``, as an
    argument or through ``extra_body``) keeps theirs alone: agentkv adds neither, so a
    request never carries both the old and the new field (:meth:`yield_to_caller`).
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

    def yield_to_caller(self, request: Mapping[str, Any], body: dict[str, Any]) -> None:
        """Drop agentkv's retention field where the caller's ``request`` sets one."""
        if any(_given(request.get(k)) for k in _RETENTION_FIELDS):
            for k in _RETENTION_FIELDS:
                body.pop(k, None)


#: OpenAI's longer-retention fields: the deprecated one and its successor.
_RETENTION_FIELDS = ("prompt_cache_retention", "prompt_cache_options")


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
