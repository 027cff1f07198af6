"""Turn your own runs into a trace file, so ``agentkv bench`` can replay your workload.

Inputs are what agentkv already records, and neither holds prompt text:

- turn records (:class:`agentkv.TurnRecord`, or their ``to_dict()`` form), one per
  model call seen by :func:`agentkv.wrap_openai`: start time, latency, prompt and
  output token counts, the reusable prefix;
- optionally the trajectory events (:class:`agentkv.TrajectoryEvent`, objects or the
  JSON lines :class:`agentkv.JsonlSink` writes), which name the tool run between two
  calls and its duration.

Per trajectory, turns are ordered by start time. ``arrival_s`` is the start relative to
the trajectory's first call; ``tool_gap_s`` is the time from an answer to the next call;
``shared_prefix_tokens_with_previous_turn`` is the record's tokenizer-exact prefix when
one was configured, else its estimate (``eligible_prefix_tokens``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentkv._errors import TraceFormatError
from agentkv.traces import Trace, TraceTrajectory, TraceTurn, dump_trace

__all__ = ["read_jsonl", "record_trace", "write_recorded_trace"]


def _as_dict(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    if hasattr(item, "to_wire"):  # TrajectoryEvent
        return dict(item.to_wire())
    if hasattr(item, "to_dict"):  # TurnRecord
        return dict(item.to_dict())
    raise TypeError(f"cannot record {type(item).__name__}: pass TurnRecords, events or dicts")


def _get(d: dict[str, Any], snake: str, camel: str | None = None) -> Any:
    if snake in d:
        return d[snake]
    return d.get(camel) if camel else None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON Lines file (events or turn records) into dicts."""
    out: list[dict[str, Any]] = []
    with Path(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(f"{path} line {n}: not valid JSON ({exc.msg})") from None
            if isinstance(row, dict):
                out.append(row)
    return out


def record_trace(records: Iterable[Any], events: Iterable[Any] = ()) -> Trace:
    """Build a :class:`~agentkv.traces.Trace` from turn records and (optional) events."""
    turns_by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in map(_as_dict, records):
        tid = _get(rec, "trajectory_id", "trajectoryId")
        if tid is None or _get(rec, "prompt_tokens") is None:
            continue
        turns_by[str(tid)].append(rec)
    tools_by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in map(_as_dict, events):
        if _get(ev, "event") in ("tool_started", "tool_finished"):
            tools_by[str(_get(ev, "trajectory_id", "trajectoryId"))].append(ev)
    order = sorted(turns_by, key=lambda t: min(r["started_at_ms"] for r in turns_by[t]))
    trajectories: list[TraceTrajectory] = []
    for idx, tid in enumerate(order):
        recs = sorted(turns_by[tid], key=lambda r: (r["started_at_ms"], r.get("turn_id", 0)))
        tools = sorted(tools_by.get(tid, []), key=lambda e: _get(e, "emitted_at_ms", "emittedAtMs"))
        t_first = recs[0]["started_at_ms"]
        turns: list[TraceTurn] = []
        for i, rec in enumerate(recs):
            end_ms = rec["started_at_ms"] + float(rec.get("latency_ms") or 0.0)
            nxt = recs[i + 1]["started_at_ms"] if i + 1 < len(recs) else None
            window = [
                e
                for e in tools
                if end_ms - 1 <= _get(e, "emitted_at_ms", "emittedAtMs") <= (nxt or float("inf"))
            ]
            started = [e for e in window if _get(e, "event") == "tool_started"]
            tool = None
            if started:
                tool = _get(started[0], "tool_name", "toolName") or _get(
                    started[0], "tool_class", "toolClass"
                )
            durations = [
                float(d)
                for e in window
                if _get(e, "event") == "tool_finished"
                and (d := _get(e, "duration_ms", "durationMs")) is not None
            ]
            shared = rec.get("expected_prefix_tokens")
            if shared is None:
                shared = rec.get("eligible_prefix_tokens") or 0
            prev_prompt = turns[-1].prompt_tokens if turns else None
            turns.append(
                TraceTurn(
                    arrival_s=(rec["started_at_ms"] - t_first) / 1000.0,
                    prompt_tokens=int(rec["prompt_tokens"]),
                    output_tokens=(
                        int(rec["completion_tokens"])
                        if rec.get("completion_tokens") is not None
                        else None
                    ),
                    shared_prefix_tokens=0
                    if i == 0
                    else min(int(shared), int(rec["prompt_tokens"])),
                    tool_name=tool,
                    tool_gap_s=None if nxt is None else max(nxt - end_ms, 0.0) / 1000.0,
                    tool_exec_s=sum(durations) / 1000.0 if durations else None,
                    prefix_break=bool(
                        i
                        and prev_prompt is not None
                        and min(int(shared), prev_prompt) < prev_prompt
                    ),
                )
            )
        trajectories.append(TraceTrajectory(idx, tuple(turns)))
    if not trajectories:
        raise TraceFormatError(
            "no turn records with token counts to record; run your agent through "
            "agentkv.wrap_openai so each call leaves a TurnRecord"
        )
    header = {"source": "agentkv recorder", "trajectory_ids": order}
    return Trace(tuple(trajectories), "recorded", "", header)


def write_recorded_trace(
    records: Iterable[Any] | str | Path,
    out_path: str | Path,
    events: Iterable[Any] | str | Path = (),
) -> Trace:
    """Record a trace (records and events may be JSONL paths) and write it to ``out_path``."""
    recs = read_jsonl(records) if isinstance(records, str | Path) else records
    evs = read_jsonl(events) if isinstance(events, str | Path) else events
    trace = record_trace(recs, evs)
    dump_trace(trace, out_path)
    return trace
