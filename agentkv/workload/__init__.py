"""agentkv.workload: the agent workload that ``agentkv bench`` replays and ``agentkv sim``
simulates.

A :class:`Workload` is a pure function of a trace (:mod:`agentkv.traces`) and a
:class:`Scaling`: its trajectories are selected, cut and scaled the same way for both
tools, so a figure from one compares with the other. :class:`Arrival` says how the
trajectories arrive. :func:`record_trace` and :func:`write_recorded_trace` turn your own
runs (turn records and trajectory events) into a trace file to replay.

>>> from agentkv.traces import Trace, TraceTrajectory, TraceTurn
>>> turns = (TraceTurn(0.0, 300, 20, 0, "bash", 1.0), TraceTurn(1.5, 400, 20, 320))
>>> workload = make_workload(Trace((TraceTrajectory(0, turns),)), Scaling(time_scale=0.5))
>>> workload.num_turns, workload.trajectories[0].turns[0].tool_gap_s
(2, 0.5)

Inside agentkv, the pool planning both tools share (``_pool``), the client's gap-model
warm-up before each replay (``_warm``) and the command-line flags both commands take
(``_flags``) live here too.
"""

from __future__ import annotations

from agentkv.workload._arrival import Arrival
from agentkv.workload._recorder import read_jsonl, record_trace, write_recorded_trace
from agentkv.workload._workload import (
    PlannedTrajectory,
    PlannedTurn,
    Scaling,
    Workload,
    make_workload,
)

__all__ = [
    "Arrival",
    "PlannedTrajectory",
    "PlannedTurn",
    "Scaling",
    "Workload",
    "make_workload",
    "read_jsonl",
    "record_trace",
    "write_recorded_trace",
]
