"""The workload flags ``agentkv bench`` and ``agentkv sim`` share, declared once.

:func:`add_workload_arguments` adds them to a command's parser, in a ``workload`` group
of its help: the trace, how it is cut and scaled, how trajectories arrive, the pool
fractions and the block size, the seed. Each command keeps its own defaults where they
differ (the pool fractions it sweeps, its block size); a command that can take them from
a recorded run (``agentkv sim --calibrate``) leaves the flags unset by default, and
:func:`scaling_from_args` fills an unset one from that run, else from :class:`Scaling`'s
own default.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from agentkv.workload._workload import Scaling

__all__ = [
    "add_grid_arguments",
    "add_workload_arguments",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "scaling_from_args",
]

_ARRIVALS = ("closed", "poisson")


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number above zero (checked before any work starts)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value


def _whole_number(text: str, minimum: int, bound: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text} must be {bound}")
    return value


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number of at least 1."""
    return _whole_number(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """An argparse ``type``: a whole number of at least 0."""
    return _whole_number(text, 0, "0 or more")


def add_workload_arguments(
    parser: argparse.ArgumentParser,
    *,
    pool_fractions: Sequence[float],
    block_size: int,
    recorded: str | None = None,
    notes: Mapping[str, str] | None = None,
    trace_required: bool = True,
) -> argparse._ArgumentGroup:
    """Add the workload flags to ``parser``; return their help group (a command adds its
    own workload flags there).

    ``pool_fractions`` and ``block_size`` are the command's defaults. ``recorded`` names
    the flag of a recorded run whose workload fills every unset scaling, arrival and block
    flag (those then default to None); ``notes`` adds command-specific text to an
    option's help, by option string.
    """
    notes = notes or {}
    group = parser.add_argument_group(
        "workload",
        "the trace, how it is cut, scaled and arrives, and the KV pool it runs on",
    )

    def add(
        flag: str, text: str, default_text: str | None, from_run: bool = True, **kwargs: Any
    ) -> None:
        """One flag; its help says its default, and, for a flag a recorded run fills,
        that it takes the run's value when not given."""
        note = f"; {notes[flag]}" if flag in notes else ""
        if default_text is None:
            help_text = text + note
        else:
            run = f", or the {recorded} run's" if recorded and from_run else ""
            help_text = f"{text}{note} (default {default_text}{run})"
        group.add_argument(flag, help=help_text, **kwargs)

    def unless_recorded(value: Any) -> Any:
        return None if recorded else value

    add(
        "--trace",
        "trace file in the agentkv trace format (JSON Lines)",
        None,
        required=trace_required,
        default=None,
    )
    add(
        "--max-trajectories",
        "replay only the first N trajectories with token counts",
        "all",
        type=positive_int,
        default=None,
    )
    add(
        "--max-turns",
        "cut each trajectory to its first N turns",
        "all",
        type=positive_int,
        default=None,
    )
    add(
        "--token-scale",
        "multiply every token count",
        "1",
        type=positive_float,
        default=unless_recorded(1.0),
    )
    add(
        "--time-scale",
        "multiply every tool gap",
        "1",
        type=positive_float,
        default=unless_recorded(1.0),
    )
    add(
        "--arrival",
        "closed loop of --concurrency trajectories in flight, or open loop with Poisson arrivals",
        "closed",
        choices=list(_ARRIVALS),
        default=unless_recorded("closed"),
    )
    add(
        "--concurrency",
        "closed loop: trajectories in flight",
        "4",
        type=positive_int,
        default=unless_recorded(4),
    )
    add(
        "--pool-fraction",
        "KV pool as a fraction of the working set; several values sweep",
        " ".join(f"{f:g}" for f in pool_fractions),
        type=positive_float,
        nargs="+",
        from_run=False,
        default=list(pool_fractions),
        metavar="F",
    )
    add(
        "--block-size",
        "KV block size in tokens",
        str(block_size),
        type=positive_int,
        default=unless_recorded(block_size),
    )
    add(
        "--seed",
        "seed of the arrivals and every other random draw",
        "0",
        from_run=False,
        type=int,
        default=0,
    )
    return group


def add_grid_arguments(
    parser: argparse.ArgumentParser, *, grid_help: str, open_help: str, pools: bool
) -> argparse._ArgumentGroup:
    """Add the operating grid's flags (``--grid``, ``--grid-concurrency``, ``--grid-open``
    and, with ``pools``, ``--grid-pools``) in a ``grid (--grid)`` group, and return the
    group (a command adds its own grid flags there); ``grid_help`` and ``open_help`` say
    what the command does with them."""
    from agentkv.workload._grid import CONCURRENCIES, OPEN_FRACTIONS, POOLS

    grid = parser.add_argument_group("grid (--grid)")
    grid.add_argument("--grid", action="store_true", help=grid_help)
    grid.add_argument(
        "--grid-concurrency",
        type=int,
        nargs="+",
        default=list(CONCURRENCIES),
        metavar="C",
        help="closed-loop concurrencies (default %(default)s)",
    )
    if pools:
        grid.add_argument(
            "--grid-pools",
            type=float,
            nargs="+",
            default=list(POOLS),
            metavar="F",
            help="pool fractions of the working set (default %(default)s)",
        )
    grid.add_argument(
        "--grid-open",
        type=float,
        nargs="*",
        default=list(OPEN_FRACTIONS),
        metavar="X",
        help=f"{open_help} (default %(default)s; none: no open-loop {'rows' if pools else 'runs'})",
    )
    return grid


def scaling_from_args(
    args: argparse.Namespace, recorded: Mapping[str, Any] | None = None
) -> Scaling:
    """The :class:`Scaling` the flags ask for: ``recorded`` (a run's scaling, as its
    manifest holds it) with every :class:`Scaling` field a flag set winning."""
    names = {f.name for f in fields(Scaling)}
    chosen = {k: v for k, v in (recorded or {}).items() if k in names}
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            chosen[name] = value
    return Scaling(**chosen)
