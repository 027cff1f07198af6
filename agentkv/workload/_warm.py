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
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from agentkv.gaps._model import GapModel
    from agentkv.traces import Trace
    from agentkv.workload._workload import Workload

__all__ = ["WARM_MODES", "GapWarmup", "WarmMode", "make_warmup"]

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
        if self.mode == "none":
            how = "cold: each replay's gap model starts empty (shipped per-class priors only)"
        elif not self.samples:
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
            "train_gaps": len(self.samples),
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


def make_warmup(trace: Trace, workload: Workload, mode: str) -> GapWarmup:
    """The warm-up of ``mode`` for ``workload`` replayed from ``trace``."""
    if mode == "none":
        return GapWarmup("none")
    replayed = {t.traj_idx for t in workload.trajectories}
    train = tuple(t.traj_idx for t in trace.trajectories if t.traj_idx not in replayed)
    gaps = tuple(_train_gaps(trace, replayed, workload.scaling.time_scale))
    return GapWarmup("train", gaps, train)
