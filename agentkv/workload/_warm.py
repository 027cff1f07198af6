"""The client's gap model at the start of every replay: warmed from a train split, or cold.

A replay's hints depend on what the client's gap model has learned. Left to itself the
process's model would carry what earlier replays taught it into later ones, so an arm's
result would depend on its place in the shuffled order. Instead every replay starts from
the same model, built fresh (in memory, never the user's gap store):

- ``train`` (the default): the idle gaps of the trace's trajectories that are *not*
  replayed (the train split), scaled like the workload's, are learned first; the
  replayed trajectories are the test split. With nothing left over (every trajectory
  is replayed) the model starts cold, and the manifest says so.
- ``none``: cold; only the shipped per-tool-class priors answer until samples arrive.

Another trace of the same harness (``agentkv bench --warm-from TRACE``,
:func:`load_warm_trace`) adds the idle gaps of all its trajectories, scaled like the
workload's, before the train split's: the warm model a harness has after earlier runs,
where the replayed trace leaves no train split (every trajectory is replayed).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentkv._errors import ConfigError

if TYPE_CHECKING:
    from agentkv.gaps._model import GapModel
    from agentkv.traces import Trace
    from agentkv.workload._workload import Workload

__all__ = ["WARM_MODES", "GapWarmup", "WarmMode", "load_warm_trace", "make_warmup"]

#: Why ``--warm-from`` and ``--warm-gaps none`` do not go together.
_COLD_AND_WARM = "--warm-from teaches the gap model first: not with --warm-gaps none"

WarmMode = Literal["train", "none"]
WARM_MODES: tuple[str, ...] = ("train", "none")


@dataclass(frozen=True)
class GapWarmup:
    """How each replay's gap model starts: the samples it learns first, and from where."""

    mode: str
    # (tool class, idle gap s, the tool the call before the gap followed or None), in
    # trace order
    samples: tuple[tuple[str, float, str | None], ...] = ()
    train_trajectories: tuple[int, ...] = ()
    warm_from: str | None = None  # another trace whose gaps were learned first
    warm_from_gaps: int = 0  # how many of ``samples`` came from it

    def make_model(self) -> GapModel:
        """A fresh in-memory model with the shipped priors that has learned the samples."""
        from agentkv.gaps._levels import ALL_TOOLS
        from agentkv.gaps._model import GapModel
        from agentkv.gaps._priors import default_priors

        model = GapModel(half_life_s=None, priors=default_priors())
        for tool_class, gap_s, before in self.samples:
            model.observe(tool_class, gap_s, at=0.0)
            model.observe(before or ALL_TOOLS, gap_s, at=0.0, kind="next")
        return model

    def describe(self) -> dict[str, Any]:
        """The manifest entry: mode, split and how many samples were learned."""
        train_gaps = len(self.samples) - self.warm_from_gaps
        if self.mode == "none":
            how = "cold: each replay's gap model starts empty (shipped per-class priors only)"
        elif self.warm_from is not None:
            first = (
                f"each replay's gap model first learns the idle gaps of every trajectory of "
                f"{self.warm_from} ({self.warm_from_gaps} gaps)"
            )
            how = (
                f"{first}, then those of the trace's trajectories that are not replayed "
                f"(train split, {train_gaps} gaps), all scaled like the workload"
                if train_gaps
                else f"{first}, scaled like the workload; the train split is empty (every "
                "trajectory is replayed)"
            )
        elif not train_gaps:
            how = "train split empty (every trajectory is replayed): cold start with priors"
        else:
            how = (
                "each replay's gap model first learns the idle gaps of the trace's "
                "trajectories that are not replayed (train split), scaled like the workload"
            )
        return {
            "mode": self.mode,
            "description": how,
            "train_trajectories": len(self.train_trajectories),
            "train_gaps": train_gaps,
            "warm_from": self.warm_from,
            "warm_from_gaps": self.warm_from_gaps,
        }


def _train_gaps(
    trace: Trace, replayed: set[int], time_scale: float
) -> Iterator[tuple[str, float, str | None]]:
    for traj in trace.trajectories:
        if traj.traj_idx in replayed:
            continue
        before: str | None = None  # the tool the call before this gap followed
        for turn in traj.turns[:-1]:
            tool = turn.tool_name or "tool"
            if turn.tool_gap_s is not None:
                yield tool, max(0.0, turn.tool_gap_s) * time_scale, before
            before = tool


def make_warmup(
    trace: Trace,
    workload: Workload,
    mode: str,
    warm_trace: Trace | None = None,
    warm_from: str | None = None,
) -> GapWarmup:
    """The warm-up of ``mode`` for ``workload`` replayed from ``trace``; ``warm_trace``
    (read from ``warm_from``) adds every one of its trajectories' gaps first."""
    if mode == "none":
        if warm_trace is not None:
            raise ConfigError(_COLD_AND_WARM)
        return GapWarmup("none")
    scale = workload.scaling.time_scale
    extra = tuple(_train_gaps(warm_trace, set(), scale)) if warm_trace is not None else ()
    replayed = {t.traj_idx for t in workload.trajectories}
    train = tuple(t.traj_idx for t in trace.trajectories if t.traj_idx not in replayed)
    gaps = tuple(_train_gaps(trace, replayed, scale))
    source = None if warm_trace is None else (warm_from or "another trace")
    return GapWarmup("train", extra + gaps, train, source, len(extra))


def load_warm_trace(trace_path: str, warm_from: str | None, mode: str) -> Trace | None:
    """The trace ``--warm-from`` names, checked against the replayed one (None: none
    named). Refused with ``--warm-gaps none``, and when it is the replayed trace itself
    (its replayed trajectories would teach the model their own gaps: ``train`` already
    learns the ones not replayed). A file that cannot be read as a trace raises
    :class:`~agentkv.TraceFormatError`."""
    if warm_from is None:
        return None
    if mode == "none":
        raise ConfigError(_COLD_AND_WARM)
    if Path(warm_from).resolve() == Path(trace_path).resolve():
        raise ConfigError(
            f"--warm-from {warm_from} is the replayed trace: its replayed trajectories would "
            "teach the gap model their own gaps (--warm-gaps train already learns the ones "
            "not replayed)"
        )
    from agentkv.traces import load_trace

    return load_trace(warm_from)
