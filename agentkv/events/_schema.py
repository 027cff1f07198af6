"""The event and advice contract: :class:`TrajectoryEvent` and :class:`CacheAdvice`.

Both are frozen pydantic models. In Python they use snake_case attributes and keyword
arguments; on the wire (``model_dump(by_alias=True)``, ``model_dump_json``) they use the
camelCase field names of the contract, and they parse either form. Fields beyond the
seed schema are optional and additive.

Invariant 2: no field carries prompt text, tool arguments, tool output or secrets: only
ids, classes, timings, token counts and hashes.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator
from pydantic.alias_generators import to_camel

__all__ = [
    "ADVICE_ACTIONS",
    "ADVICE_REASONS",
    "EVENT_KINDS",
    "AdviceAction",
    "AdviceReason",
    "CacheAdvice",
    "EventKind",
    "ToolStatus",
    "TrajectoryEvent",
]

EventKind = Literal[
    "model_started",
    "tool_started",
    "tool_finished",
    "trajectory_finished",
    "trajectory_cancelled",
]
AdviceAction = Literal["default", "retain", "offload", "prefetch", "release"]
AdviceReason = Literal[
    "short_tool_gap",
    "capacity_pressure",
    "next_step_known",
    "terminal_state",
    "insufficient_evidence",
]
ToolStatus = Literal["ok", "error", "cancelled"]

EVENT_KINDS: tuple[str, ...] = EventKind.__args__  # type: ignore[attr-defined]
ADVICE_ACTIONS: tuple[str, ...] = AdviceAction.__args__  # type: ignore[attr-defined]
ADVICE_REASONS: tuple[str, ...] = AdviceReason.__args__  # type: ignore[attr-defined]

_CONFIG = ConfigDict(
    frozen=True,
    alias_generator=to_camel,
    populate_by_name=True,
    extra="forbid",
    strict=False,
)

_Id = Field(min_length=1, max_length=256)


class TrajectoryEvent(BaseModel):
    """One lifecycle event of an agent trajectory.

    Seed fields: ``trajectory_id``, ``turn_id``, ``event``, ``tool_class``,
    ``emitted_at_ms``, ``expected_next_agent``, ``critical_path``. On the wire ``turnId``
    is a string and ``emittedAtMs`` any number (a fraction is cut to whole milliseconds).
    In Python ``turn_id`` is the turn number, an ``int``, when the string is one
    (``"3"`` or ``3``), and otherwise the string itself (a harness's own turn label,
    ``"run-3/turn-7"``). A label says nothing about order: ``turn_index`` carries the
    trajectory's own 0-based turn counter next to a label (agentkv's trajectories set it),
    and :attr:`turn_number` gives whichever of the two is the order. The rest are
    optional extensions: the parent trajectory of a subagent, the tenant, the outcome and
    duration of a tool, the framework's tool call id, the KV idle gap seen by a
    ``model_started`` event and the tool class that caused it, and a stable fingerprint
    of the prompt prefix.
    """

    model_config = _CONFIG

    trajectory_id: str = _Id
    turn_id: int | str = Field(union_mode="left_to_right")
    event: EventKind
    tool_class: str | None = Field(default=None, min_length=1, max_length=256)
    emitted_at_ms: int = Field(ge=0)
    expected_next_agent: str | None = Field(default=None, max_length=256)
    critical_path: bool | None = None
    # --- extensions (additive, optional) ---
    parent_trajectory_id: str | None = Field(default=None, min_length=1, max_length=256)
    tenant: str | None = Field(default=None, min_length=1, max_length=256)
    status: ToolStatus | None = None
    tool_name: str | None = Field(default=None, min_length=1, max_length=256)
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=256)
    duration_ms: float | None = Field(default=None, ge=0)
    idle_gap_ms: float | None = Field(default=None, ge=0)
    after_tool_class: str | None = Field(default=None, min_length=1, max_length=256)
    prefix_fingerprint: str | None = Field(default=None, max_length=128)
    turn_index: int | None = Field(default=None, ge=0)

    @field_validator("turn_id", mode="before")
    @classmethod
    def _turn_id_from_wire(cls, value: Any) -> Any:
        """``turnId`` is a string on the wire: a turn number (``"3"``, or ``3``) becomes an
        ``int``; any other non-empty string of at most 256 characters is kept as a label."""
        if isinstance(value, str):
            if value.isascii() and value.isdecimal():
                return int(value)
            if not value or len(value) > 256:
                raise ValueError("turnId must be a non-empty string of at most 256 characters")
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("turnId must be a string or a non-negative integer")
        if value < 0:
            raise ValueError("turnId must be a string or a non-negative integer")
        return value

    @field_validator("emitted_at_ms", mode="before")
    @classmethod
    def _emitted_from_wire(cls, value: Any) -> Any:
        """``emittedAtMs`` is any JSON number; a fraction is cut to whole milliseconds."""
        if isinstance(value, float) and math.isfinite(value):
            return int(value)
        return value

    @field_serializer("turn_id", when_used="json")
    def _turn_id_to_wire(self, value: int | str) -> str:
        return str(value)

    @property
    def turn_number(self) -> int | None:
        """The turn's place in its trajectory: ``turn_index`` when set, else an integer
        ``turn_id``; None for a label without an index (its order is unknown)."""
        if self.turn_index is not None:
            return self.turn_index
        return self.turn_id if isinstance(self.turn_id, int) else None

    def to_wire(self) -> dict[str, object]:
        """Return the camelCase dict sent over the wire (unset optional fields left out;
        ``turnId`` as a string, as the contract says)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class CacheAdvice(BaseModel):
    """What agentkv advises the server to do with a trajectory's KV cache.

    Every retain carries a TTL (invariant 3) and every advice records its reason and
    policy version (invariant 7).
    """

    model_config = _CONFIG

    trajectory_id: str = _Id
    action: AdviceAction
    ttl_ms: int | None = Field(default=None, ge=0)
    priority: int | None = Field(default=None, ge=-1000, le=1000)
    reason: AdviceReason
    policy_version: str = Field(min_length=1, max_length=64)
    # --- extensions ---
    turn_id: int | None = Field(default=None, ge=0)
    predicted_gap_ms: float | None = Field(default=None, ge=0)  # the gap's median
    predicted_gap_p90_ms: float | None = Field(default=None, ge=0)
    predicted_gap_p99_ms: float | None = Field(default=None, ge=0)

    def to_wire(self) -> dict[str, object]:
        """Return the camelCase dict sent over the wire (unset optional fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True)
