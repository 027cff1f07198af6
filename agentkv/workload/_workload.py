"""From a trace to a replayable workload: selection, scaling and the working set.

A :class:`Workload` is a pure function of a :class:`~agentkv.traces.Trace` and a
:class:`Scaling`. Scaling exists for small machines: token counts are multiplied by
``token_scale`` and tool gaps by ``time_scale``, and the trace can be cut to its first
``max_trajectories`` trajectories and each trajectory to its first ``max_turns`` turns.
Every knob is recorded in the manifest of a run.

The shared prefix of a turn is measured against the previous turn's *context* (its
prompt followed by its answer): real agents append the answer to the history, so a
trace may report a shared prefix longer than the previous prompt. Scaled values are
clamped so the structure stays valid: a turn never shares more than the previous
context held, nor more than its own prompt.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from agentkv._errors import ConfigError
from agentkv.traces import Trace

__all__ = [
    "PlannedTrajectory",
    "PlannedTurn",
    "Scaling",
    "Workload",
    "eligible_prefix_tokens",
    "make_workload",
]


@dataclass(frozen=True, slots=True)
class Scaling:
    """How a trace is cut and scaled before replay (recorded in the manifest)."""

    token_scale: float = 1.0
    time_scale: float = 1.0
    max_trajectories: int | None = None
    max_turns: int | None = None
    min_output_tokens: int = 1
    max_output_tokens: int | None = None
    system_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if not (self.token_scale > 0 and math.isfinite(self.token_scale)):
            raise ConfigError(f"token_scale must be a positive number, got {self.token_scale}")
        if not (self.time_scale >= 0 and math.isfinite(self.time_scale)):
            raise ConfigError(f"time_scale must be zero or positive, got {self.time_scale}")
        for name in ("max_trajectories", "max_turns", "max_output_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1 (or unset), got {value}")
        if self.min_output_tokens < 1:
            raise ConfigError("min_output_tokens must be at least 1")
        if self.system_prefix_tokens < 0:
            raise ConfigError("system_prefix_tokens must not be negative")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PlannedTurn:
    """One turn to replay, already scaled."""

    index: int
    prompt_tokens: int
    output_tokens: int
    shared_prefix_tokens: int  # with the previous turn's prompt + answer
    tool_name: str | None
    tool_gap_s: float | None  # sleep after this turn's answer (None on the last turn)
    prefix_break: bool = False

    @property
    def context_tokens(self) -> int:
        """Prompt plus answer: what this turn leaves in the KV cache."""
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class PlannedTrajectory:
    """One trajectory to replay."""

    traj_idx: int
    turns: tuple[PlannedTurn, ...]

    @property
    def peak_context_tokens(self) -> int:
        """The largest prompt + answer of any turn: the trajectory's KV footprint."""
        return max(t.context_tokens for t in self.turns)

    @property
    def total_gap_s(self) -> float:
        """Sum of the (scaled) tool gaps."""
        return sum(t.tool_gap_s or 0.0 for t in self.turns)


@dataclass(frozen=True, slots=True)
class Workload:
    """The trajectories to replay, their scaling and where they came from."""

    trajectories: tuple[PlannedTrajectory, ...]
    scaling: Scaling
    trace_sha256: str
    trace_source: str
    num_skipped_without_tokens: int = 0
    num_negative_gaps_clamped: int = 0  # in the whole trace file (clock skew, read as 0)

    @property
    def num_turns(self) -> int:
        """Total model calls."""
        return sum(len(t.turns) for t in self.trajectories)

    @property
    def max_context_tokens(self) -> int:
        """Longest prompt + answer of any turn: the server's ``max_model_len`` floor."""
        return max(t.peak_context_tokens for t in self.trajectories)

    @property
    def total_prompt_tokens(self) -> int:
        """Prompt tokens summed over every turn."""
        return sum(u.prompt_tokens for t in self.trajectories for u in t.turns)

    def working_set_tokens(self, concurrency: int) -> int:
        """KV tokens the ``concurrency`` largest trajectories hold at their peaks.

        This is the pool that keeps every live trajectory's context resident; a pool
        fraction of 1.0 means no pressure, lower fractions force eviction.
        """
        peaks = sorted((t.peak_context_tokens for t in self.trajectories), reverse=True)
        return sum(peaks[: max(1, concurrency)])

    def new_blocks_per_turn(self, block_size: int) -> list[int]:
        """KV blocks each turn writes beyond the whole blocks it shares with the
        previous turn's context, every turn of every trajectory (sizes arm L's pool)."""
        return [
            math.ceil(u.context_tokens / block_size) - u.shared_prefix_tokens // block_size
            for t in self.trajectories
            for u in t.turns
        ]

    def describe(self) -> dict[str, Any]:
        """Summary figures for the manifest."""
        return {
            "trace_sha256": self.trace_sha256,
            "trace_source": self.trace_source,
            "num_trajectories": len(self.trajectories),
            "num_turns": self.num_turns,
            "num_skipped_without_tokens": self.num_skipped_without_tokens,
            "num_negative_gaps_clamped": self.num_negative_gaps_clamped,
            "total_prompt_tokens": self.total_prompt_tokens,
            "max_context_tokens": self.max_context_tokens,
            "num_prefix_breaks": sum(u.prefix_break for t in self.trajectories for u in t.turns),
            "scaling": self.scaling.to_dict(),
        }


def eligible_prefix_tokens(shared: int, prompt: int, block_size: int) -> int:
    """The block-aligned part of a shared prefix a server can serve from its cache."""
    # vLLM always recomputes at least the prompt's last token and caches whole blocks.
    usable = min(shared, prompt - 1)
    return max(usable, 0) // block_size * block_size


def _scale_tokens(value: int, scale: float, floor: int) -> int:
    return max(floor, round(value * scale))


def make_workload(trace: Trace, scaling: Scaling | None = None) -> Workload:
    """Select, cut and scale ``trace`` into a :class:`Workload`.

    Trajectories whose token counts are unknown are skipped (and counted). Raises
    :class:`~agentkv.ConfigError` when nothing is left to replay.
    """
    scaling = scaling or Scaling()
    usable = [t for t in trace.trajectories if t.has_tokens]
    skipped = len(trace.trajectories) - len(usable)
    if scaling.max_trajectories is not None:
        usable = usable[: scaling.max_trajectories]
    planned: list[PlannedTrajectory] = []
    for traj in usable:
        turns = traj.turns[: scaling.max_turns] if scaling.max_turns else traj.turns
        out: list[PlannedTurn] = []
        prev: PlannedTurn | None = None
        for i, turn in enumerate(turns):
            assert turn.prompt_tokens is not None and turn.output_tokens is not None
            prompt = _scale_tokens(turn.prompt_tokens, scaling.token_scale, 1)
            if i == 0:
                prompt = max(prompt, min(scaling.system_prefix_tokens, prompt))
            output = _scale_tokens(
                turn.output_tokens, scaling.token_scale, scaling.min_output_tokens
            )
            if scaling.max_output_tokens is not None:
                output = min(output, scaling.max_output_tokens)
            if prev is None:
                shared = 0
            else:
                raw = _scale_tokens(turn.shared_prefix_tokens or 0, scaling.token_scale, 0)
                shared = min(raw, prev.context_tokens, prompt)
            last = i == len(turns) - 1
            gap = None if last or turn.tool_gap_s is None else turn.tool_gap_s * scaling.time_scale
            if not last and gap is None:
                gap = 0.0
            current = PlannedTurn(
                index=i,
                prompt_tokens=prompt,
                output_tokens=output,
                shared_prefix_tokens=shared,
                tool_name=turn.tool_name,
                tool_gap_s=gap,
                prefix_break=turn.prefix_break,
            )
            out.append(current)
            prev = current
        planned.append(PlannedTrajectory(traj.traj_idx, tuple(out)))
    if not planned:
        raise ConfigError(
            f"{trace.source or 'the trace'} has no trajectory with token counts to replay; "
            "record prompt_tokens, output_tokens and shared prefixes, or pick another trace"
        )
    return Workload(
        tuple(planned),
        scaling,
        trace.sha256,
        trace.source,
        skipped,
        trace.num_negative_gaps_clamped,
    )
