"""Routing calls across replicas: round robin, session affinity, prefix-aware with load balance.

- ``round_robin``: call ``n`` goes to replica ``n mod R``; it ignores where a prefix lives.
- ``session``: a consistent-hash ring (64 virtual nodes per replica, BLAKE2b) maps each
  trajectory id to one replica, so a trajectory's calls stay together, and adding a
  replica moves only about ``1/R`` of the trajectories. A ``placement`` (trajectory id
  -> replica, e.g. what a real run behind vllm-router observed: :func:`load_placement`)
  takes precedence over the ring, so a simulation can follow a real router's split.
- ``sticky``: vllm-router's ``sticky_least_loaded``: a trajectory's first call pins it
  to the replica with the fewest pinned trajectories (ties to the lowest index), and its
  end (:meth:`Router.finish`, the client's ``/finish_session``) unpins it. A
  ``placement`` takes precedence here too.
- ``prefix``: Preble-style explore/exploit. Exploit: send the call to the replica that
  holds the longest cached prefix of it, unless that replica's load exceeds the least
  loaded one's by more than ``imbalance`` calls; explore: otherwise, or when no replica
  holds any of it, pick the least loaded replica (load = running plus waiting calls).

``calls`` ((trajectory id, turn) -> replica, what a real run recorded call by call)
overrides all four: under round robin the replica a call reaches depends on every
request the real router saw, lifecycle posts and probes included, which the simulator
does not model. A call it does not name is routed by ``mode``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError

__all__ = ["ROUTINGS", "Router", "load_placement"]

#: The routing modes the simulator knows.
ROUTINGS = ("round_robin", "session", "sticky", "prefix")


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Router:
    """Picks a replica for each call (see the module docstring for the rules)."""

    def __init__(
        self,
        mode: str,
        num_replicas: int,
        *,
        vnodes: int = 64,
        imbalance: int = 4,
        placement: Mapping[str, int] | None = None,
        calls: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        if mode not in ROUTINGS:
            raise ConfigError(f"routing {mode!r}: choose {', '.join(ROUTINGS)}")
        self.mode = mode
        self.num_replicas = num_replicas
        self.imbalance = imbalance
        self._rr = 0
        ring = sorted(
            (_hash64(f"replica-{r}-{v}"), r) for r in range(num_replicas) for v in range(vnodes)
        )
        self._points = [p for p, _ in ring]
        self._owners = [r for _, r in ring]
        self._affinity: dict[str, int] = {
            tid: r for tid, r in (placement or {}).items() if 0 <= r < num_replicas
        }
        self._calls = {k: r for k, r in (calls or {}).items() if 0 <= r < num_replicas}
        self._pinned: dict[str, int] = {}  # sticky: live trajectory -> replica
        self._pins = [0] * num_replicas

    def sticky_replica(self, trajectory_id: str) -> int:
        """The replica a sticky router keeps ``trajectory_id`` on (pinned at first sight)."""
        r = self._pinned.get(trajectory_id)
        if r is None:
            r = self._affinity.get(trajectory_id)
            if r is None:
                r = min(range(self.num_replicas), key=lambda i: (self._pins[i], i))
            self._pinned[trajectory_id] = r
            self._pins[r] += 1
        return r

    def finish(self, trajectory_id: str) -> None:
        """A trajectory ended: a sticky router forgets its pin."""
        r = self._pinned.pop(trajectory_id, None)
        if r is not None:
            self._pins[r] -= 1

    def session_replica(self, trajectory_id: str) -> int:
        """The replica that the consistent-hash ring assigns to ``trajectory_id``."""
        r = self._affinity.get(trajectory_id)
        if r is None:
            i = bisect.bisect(self._points, _hash64(trajectory_id)) % len(self._points)
            r = self._affinity[trajectory_id] = self._owners[i]
        return r

    def route(
        self,
        trajectory_id: str,
        keys: Sequence[int],
        max_hit: int,
        replicas: Sequence[Any],
        turn: int | None = None,
    ) -> int:
        """Return the index of the replica that serves this call (turn ``turn``)."""
        if self.num_replicas == 1:
            return 0
        recorded = self._calls.get((trajectory_id, turn)) if turn is not None else None
        if recorded is not None:
            return recorded
        if self.mode == "round_robin":
            self._rr += 1
            return (self._rr - 1) % self.num_replicas
        if self.mode == "session":
            return self.session_replica(trajectory_id)
        if self.mode == "sticky":
            return self.sticky_replica(trajectory_id)
        loads = [len(r.running) + len(r.waiting) for r in replicas]
        least = min(range(self.num_replicas), key=lambda i: (loads[i], i))
        hits = [r.pool.match(keys, max_hit) for r in replicas]
        best = max(range(self.num_replicas), key=lambda i: (hits[i], -loads[i], -i))
        if hits[best] > 0 and loads[best] <= loads[least] + self.imbalance:
            return best
        return least


def load_placement(results_json: str | Path) -> dict[str, int]:
    """The trajectory -> replica split a real ``agentkv bench --replicas`` run observed.

    Reads ``results.json``: the first arm whose replicas reported a placement (arms with
    the agentkv plugin do). Keys are the simulator's trajectory ids (``t<index>``, the
    bench's trajectory order). Raises :class:`~agentkv.ConfigError` when there is none.
    """
    try:
        data = json.loads(Path(results_json).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read a placement from {results_json}: {exc}") from None
    for arm in (data.get("arms") or {}).values():
        by_index = ((arm or {}).get("replicas") or {}).get("placement_by_index")
        if by_index:
            return {f"t{int(i)}": int(r) for i, r in by_index.items()}
    raise ConfigError(
        f"{results_json}: no arm recorded where its trajectories ran (run agentkv bench "
        "--replicas N with an arm that has the agentkv plugin, e.g. E or G)"
    )
