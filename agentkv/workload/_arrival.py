"""How a workload's trajectories arrive, labelled in every report.

- ``closed``: ``concurrency`` trajectories in flight; a new one starts when one ends.
- ``poisson``: trajectories start at exponential inter-arrival times of mean
  ``1/rate_per_s``, whatever the server's speed (open loop).

The arrival process also says how many trajectories are expected in flight at once
(:meth:`Arrival.effective_concurrency`), which sizes the working set a pool fraction is
taken of.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentkv.workload._workload import Workload

__all__ = ["Arrival"]


@dataclass(frozen=True, slots=True)
class Arrival:
    """How trajectories arrive: ``closed`` (N concurrent) or ``poisson`` (open loop)."""

    process: str = "closed"
    concurrency: int = 4
    rate_per_s: float = 0.5
    seed: int = 0

    def label(self) -> str:
        """Human-readable label for reports."""
        if self.process == "poisson":
            return f"open loop, Poisson arrivals at {self.rate_per_s:g} trajectories/s"
        return f"closed loop, {self.concurrency} concurrent trajectories"

    def effective_concurrency(self, workload: Workload) -> int:
        """Trajectories expected in flight (sizes the working set)."""
        if self.process == "poisson":
            mean_gap = sum(t.total_gap_s for t in workload.trajectories) / len(
                workload.trajectories
            )
            return max(1, round(self.rate_per_s * max(mean_gap, 1.0)))
        return max(1, self.concurrency)
