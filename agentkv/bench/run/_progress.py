"""Progress display for bench runs: a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any

from agentkv.bench.run._gapscale import describe_gap_scale

__all__ = ["ProgressDisplay"]


class ProgressDisplay:
    """Receives runner notifications (``kind, data``) and shows them.

    Use as a context manager; pass the instance as the runner's ``notify`` callback.
    """

    def __init__(self, title: str, *, force_plain: bool = False) -> None:
        self.title = title
        self.plain = force_plain or not sys.stderr.isatty()
        self._progress: Any = None
        self._task: Any = None
        self._t0 = time.monotonic()
        self._turns_per_replay = 0

    def __enter__(self) -> ProgressDisplay:
        if not self.plain:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )
            except ImportError:
                self.plain = True
                return self
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("turns"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            print(f"[{time.monotonic() - self._t0:7.1f}s] {text}", file=sys.stderr, flush=True)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        """Handle one runner notification."""
        if kind == "plan":
            self._turns_per_replay = int(data["turns_per_replay"])
            total = int(data["total"]) * self._turns_per_replay
            if self._progress is not None:
                self._progress.update(self._task, total=total)
            self._line(
                f"{data['total']} replays of {self._turns_per_replay} turns; arms {', '.join(data['arms'])}"
            )
        elif kind == "turn":
            if self._progress is not None:
                self._progress.advance(self._task)
        elif kind == "server_starting":
            self._line(f"starting server for arm {data['arm']}")
        elif kind == "server_ready":
            self._line(f"arm {data['arm']} server ready in {data['startup_s']:.0f} s")
        elif kind == "server_restart":
            self._line(f"arm {data['arm']}: cache reset refused, restarting its server")
        elif kind == "replay_start":
            desc = (
                f"{self.title}: arm {data['arm']} rep {data['rep'] + 1} (pool {data['fraction']:g})"
            )
            if self._progress is not None:
                self._progress.update(self._task, description=desc)
            else:
                self._line(desc)
        elif kind == "testbed":
            self._line(f"arm {data['arm']} testbed: {_testbed_line(data)}")
        elif kind == "gap_scale":
            self._line(describe_gap_scale(data))
        elif kind == "replay_done":
            self._line(f"arm {data['arm']} rep {data['rep'] + 1} done in {data['wall_s']:.1f} s")


def _testbed_line(data: dict[str, Any]) -> str:
    if "error" in data:
        return f"not measured ({data['error']})"
    fixed = data.get("fixed_turn") or {}
    ttft = fixed.get("client_ttft_s_p50")
    rate = (data.get("prefill") or {}).get("tokens_per_s")
    dec = data.get("decode") or {}
    parts = [
        f"fixed turn {ttft * 1000:.0f} ms" if ttft is not None else "fixed turn -",
        f"prefill {rate:,.0f} tokens/s" if rate is not None else "prefill -",
    ]
    for key, label in (("batch_1_step_s", "1"), ("batch_n_step_s", str(dec.get("batch_n")))):
        step = dec.get(key)
        if step is not None:
            parts.append(f"decode step {step * 1000:.1f} ms at batch {label}")
    return ", ".join(parts)
