"""The agentkv trace format: load, validate and write agent traces.

A trace file is JSON Lines. Each line is one trajectory (one agent run):
``{"traj_idx": int, "turns": [turn, ...]}`` with the turns in order. A turn is one
model call:

=========================================  =========================================================
field                                      meaning
=========================================  =========================================================
``arrival_s``                              when the call was sent, seconds since the trajectory's
                                           first call
``prompt_tokens``                          prefill tokens of the call (may be null: unknown)
``output_tokens``                          decode tokens of the call (may be null: unknown)
``tool_name``                              the tool the answer invoked (null: none, final answer)
``tool_gap_s``                             time from this call's answer to the next call being
                                           sent: how long the KV sits idle (null on the last turn)
``tool_exec_s``                            optional: the tool's own execution time
``shared_prefix_tokens_with_previous_turn``  tokens of this prompt that are an exact prefix of the
                                           previous call's prompt (0 on the first turn)
=========================================  =========================================================

Unknown extra fields are kept in :attr:`TraceTurn.extra`. An optional first line
``{"agentkv_trace": 1, ...}`` is a header with the format version and free metadata.
The format is versioned by :data:`TRACE_FORMAT_VERSION`.

Prefix breaks (context compaction: the shared prefix drops below what the previous
prompt held) are kept as data and flagged on the turn; trajectories without token counts
are loaded and flagged so that consumers can choose to skip them. A negative
``tool_gap_s`` (clock skew between the recorder's clocks) is data too: it is clamped to
0 and counted in :attr:`Trace.num_negative_gaps_clamped`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkv._errors import TraceFormatError

__all__ = [
    "TRACE_FORMAT_VERSION",
    "Trace",
    "TraceTrajectory",
    "TraceTurn",
    "dump_trace",
    "load_trace",
]

TRACE_FORMAT_VERSION = 1

_KNOWN = {
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "tool_name",
    "tool_gap_s",
    "tool_exec_s",
    "shared_prefix_tokens_with_previous_turn",
}


@dataclass(frozen=True, slots=True)
class TraceTurn:
    """One model call of a recorded trajectory."""

    arrival_s: float
    prompt_tokens: int | None
    output_tokens: int | None
    shared_prefix_tokens: int | None
    tool_name: str | None = None
    tool_gap_s: float | None = None
    tool_exec_s: float | None = None
    prefix_break: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def has_tokens(self) -> bool:
        """True when prompt, output and shared-prefix token counts are all known."""
        return (
            self.prompt_tokens is not None
            and self.output_tokens is not None
            and self.shared_prefix_tokens is not None
        )

    def to_json(self) -> dict[str, Any]:
        """Return the turn in trace-file form."""
        out: dict[str, Any] = {
            "arrival_s": self.arrival_s,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "tool_name": self.tool_name,
            "tool_gap_s": self.tool_gap_s,
            "shared_prefix_tokens_with_previous_turn": self.shared_prefix_tokens,
        }
        if self.tool_exec_s is not None:
            out["tool_exec_s"] = self.tool_exec_s
        out.update(self.extra)
        return out


@dataclass(frozen=True, slots=True)
class TraceTrajectory:
    """One recorded agent run: its turns in order."""

    traj_idx: int
    turns: tuple[TraceTurn, ...]
    line_no: int = 0

    @property
    def has_tokens(self) -> bool:
        """True when every turn has its token counts."""
        return all(t.has_tokens for t in self.turns)

    @property
    def num_prefix_breaks(self) -> int:
        """How many turns lost part of the previous prompt (compaction)."""
        return sum(t.prefix_break for t in self.turns)


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace file."""

    trajectories: tuple[TraceTrajectory, ...]
    source: str = ""
    sha256: str = ""
    header: dict[str, Any] = field(default_factory=dict)
    num_negative_gaps_clamped: int = 0  # negative tool gaps (clock skew) read as 0

    @property
    def num_turns(self) -> int:
        """Total model calls over all trajectories."""
        return sum(len(t.turns) for t in self.trajectories)

    def with_tokens(self) -> Trace:
        """Return a trace holding only the trajectories whose token counts are all known."""
        kept = tuple(t for t in self.trajectories if t.has_tokens)
        return Trace(kept, self.source, self.sha256, self.header, self.num_negative_gaps_clamped)

    def tool_gaps(self) -> Iterator[tuple[str, float]]:
        """Yield ``(tool_name, tool_gap_s)`` for every turn that has both."""
        for traj in self.trajectories:
            for turn in traj.turns:
                if turn.tool_name is not None and turn.tool_gap_s is not None:
                    yield turn.tool_name, turn.tool_gap_s


# Validation is written here rather than as pydantic models (pydantic is a dependency and
# validates the event and advice schemas): half of the rules are across turns, not per
# field — a prefix break needs the previous turn, a negative ``tool_gap_s`` is clamped and
# counted rather than refused, a trajectory without token counts is loaded and flagged — and
# every error must name the file's line and field (``trace line 12: field 'arrival_s': ...``),
# which users fix traces by. The per-field number rule below is the part a model would
# replace, and it is one function.
def _bad(line_no: int, field_name: str, why: str) -> TraceFormatError:
    return TraceFormatError(f"trace line {line_no}: field {field_name!r}: {why}")


def _number(
    raw: dict[str, Any],
    key: str,
    line_no: int,
    *,
    integer: bool,
    required: bool,
    signed: bool = False,
) -> Any:
    value = raw.get(key)
    if value is None:
        if required:
            raise _bad(line_no, key, "is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(line_no, key, f"must be a number, got {type(value).__name__}")
    if integer:
        if isinstance(value, float):
            if not value.is_integer():
                raise _bad(line_no, key, f"must be a whole number, got {value}")
            value = int(value)
    elif not math.isfinite(value):
        raise _bad(line_no, key, f"must be finite, got {value}")
    if value < 0 and not signed:
        raise _bad(line_no, key, f"must not be negative, got {value}")
    return float(value) if not integer else value


def _parse_turn(
    raw: Any, line_no: int, index: int, prev: TraceTurn | None, clamped: list[int]
) -> TraceTurn:
    where = f"turns[{index}]"
    if not isinstance(raw, dict):
        raise _bad(line_no, where, "each turn must be a JSON object")
    try:
        arrival = _number(raw, "arrival_s", line_no, integer=False, required=True)
        prompt = _number(raw, "prompt_tokens", line_no, integer=True, required=False)
        output = _number(raw, "output_tokens", line_no, integer=True, required=False)
        shared = _number(
            raw, "shared_prefix_tokens_with_previous_turn", line_no, integer=True, required=False
        )
        gap = _number(raw, "tool_gap_s", line_no, integer=False, required=False, signed=True)
        exec_s = _number(raw, "tool_exec_s", line_no, integer=False, required=False)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{exc} (in {where})") from None
    if gap is not None and gap < 0:
        gap = 0.0  # clock skew: the next call cannot start before this answer
        clamped[0] += 1
    tool = raw.get("tool_name")
    if tool is not None and not isinstance(tool, str):
        raise _bad(line_no, f"{where}.tool_name", "must be a string or null")
    if prev is not None and arrival < prev.arrival_s:
        raise _bad(line_no, f"{where}.arrival_s", "turns must be in arrival order")
    if prev is None and shared is None and prompt is not None:
        shared = 0
    if prompt is not None and shared is not None and shared > prompt:
        raise _bad(
            line_no,
            f"{where}.shared_prefix_tokens_with_previous_turn",
            f"{shared} exceeds prompt_tokens {prompt}",
        )
    prefix_break = False
    if prev is not None and shared is not None and prev.prompt_tokens is not None:
        # The previous prompt plus its answer is what could be reused; losing part of the
        # previous *prompt* means the history was rewritten (compaction).
        prefix_break = shared < prev.prompt_tokens
    extra = {k: v for k, v in raw.items() if k not in _KNOWN}
    return TraceTurn(
        arrival_s=arrival,
        prompt_tokens=prompt,
        output_tokens=output,
        shared_prefix_tokens=shared,
        tool_name=tool,
        tool_gap_s=gap,
        tool_exec_s=exec_s,
        prefix_break=prefix_break,
        extra=extra,
    )


def _parse_lines(lines: Iterable[str], source: str) -> Trace:
    digest = hashlib.sha256()
    trajectories: list[TraceTrajectory] = []
    header: dict[str, Any] = {}
    seen: set[int] = set()
    clamped = [0]
    for line_no, line in enumerate(lines, start=1):
        digest.update(line.encode("utf-8"))
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"trace line {line_no}: not valid JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise TraceFormatError(f"trace line {line_no}: each line must be a JSON object")
        if "agentkv_trace" in raw and not trajectories and not header:
            version = raw["agentkv_trace"]
            if version != TRACE_FORMAT_VERSION:
                raise _bad(
                    line_no,
                    "agentkv_trace",
                    f"format version {version!r} is not supported "
                    f"(this agentkv reads version {TRACE_FORMAT_VERSION})",
                )
            header = raw
            continue
        idx = raw.get("traj_idx")
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise _bad(line_no, "traj_idx", "is required and must be an integer")
        if idx in seen:
            raise _bad(line_no, "traj_idx", f"duplicate trajectory index {idx}")
        seen.add(idx)
        turns_raw = raw.get("turns")
        if not isinstance(turns_raw, list) or not turns_raw:
            raise _bad(line_no, "turns", "must be a non-empty list of turns")
        turns: list[TraceTurn] = []
        for i, t in enumerate(turns_raw):
            turns.append(_parse_turn(t, line_no, i, turns[-1] if turns else None, clamped))
        trajectories.append(TraceTrajectory(idx, tuple(turns), line_no))
    if not trajectories:
        raise TraceFormatError(f"{source or 'trace'}: holds no trajectories")
    return Trace(tuple(trajectories), source, digest.hexdigest(), header, clamped[0])


def load_trace(path: str | Path) -> Trace:
    """Load and validate a trace file.

    Raises :class:`~agentkv.TraceFormatError` naming the line and field of the first
    problem, or when the file cannot be read.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace file {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceFormatError(f"trace file {p} is not UTF-8 text") from None
    return _parse_lines(text.splitlines(), str(p))


def dump_trace(trace: Trace | Iterable[TraceTrajectory], path: str | Path) -> None:
    """Write trajectories to ``path`` in the trace format, with a version header."""
    trajs = trace.trajectories if isinstance(trace, Trace) else tuple(trace)
    header: dict[str, Any] = {"agentkv_trace": TRACE_FORMAT_VERSION}
    if isinstance(trace, Trace):
        header.update({k: v for k, v in trace.header.items() if k != "agentkv_trace"})
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(header) + "\n")
        for traj in trajs:
            row = {"traj_idx": traj.traj_idx, "turns": [t.to_json() for t in traj.turns]}
            fh.write(json.dumps(row) + "\n")
    tmp.replace(p)
