"""Per-tool-family gap priors: what the gap model answers for a class it has not learned.

Tool names differ between harnesses (``execute_bash``, ``bash``, ``run_shell``), but the
kind of work behind them does not, and neither does the shape of the idle gap that
follows: an edit comes back in a fraction of a second, a shell command in about a second
with a tail of tens of seconds. :func:`family_of` maps a tool class to a *family* by the
words in its name (a fixed, generic vocabulary: nothing here is fitted), and
:class:`ClassPriors` holds one :class:`GapPrior` per family.

The shipped priors (``data/gap_priors.json``, loaded by :func:`default_priors`) were
derived from one public trace and checked on another; the file records which, how, and
the check (``scripts/derive_gap_priors.py`` rebuilds it). A prior only answers until the
class (or a parent class) has ``min_samples`` samples of its own.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from agentkv.gaps._sketch import GapPrior

__all__ = ["FAMILIES", "ClassPriors", "default_priors", "family_of"]

#: Families in matching order (the first whose word starts a word of the name wins).
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("finish", ("finish", "submit", "final", "done", "complete", "exit", "stop")),
    ("think", ("think", "plan", "reason", "reflect", "task", "todo", "note", "memory")),
    ("web", ("browse", "browser", "web", "fetch", "http", "url", "navigate", "scrape")),
    ("search", ("search", "grep", "find", "glob", "lookup", "query", "retriev", "rg")),
    ("edit", ("edit", "replace", "write", "create", "patch", "insert", "apply")),
    ("read", ("read", "view", "cat", "open", "show", "list", "ls")),
    (
        "shell",
        (
            "bash",
            "shell",
            "exec",
            "run",
            "terminal",
            "command",
            "cmd",
            "python",
            "ipython",
            "jupyter",
            "pytest",
            "test",
        ),
    ),
)

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


@functools.lru_cache(maxsize=4096)
def family_of(tool_class: str) -> str | None:
    """The family of ``tool_class`` (``"execute_bash"`` -> ``"shell"``), or None.

    The name is split into words (``_``, ``-``, ``.``, ``:``, ``/``, camelCase); a
    family matches when one of its words starts a word of the name. The leaf of a
    nested class (``"shell:pytest"``) is tried first, then its parents.
    """
    for part in reversed(tool_class.split(":")):
        words = [w.lower() for w in _WORD.findall(part)]
        for family, keys in FAMILIES:
            if any(w.startswith(k) for w in words for k in keys):
                return family
    return None


@dataclass(frozen=True)
class ClassPriors:
    """One :class:`GapPrior` per tool family, with where the numbers came from."""

    by_family: Mapping[str, GapPrior] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def for_class(self, tool_class: str) -> tuple[str, GapPrior] | None:
        """``(family, prior)`` for ``tool_class``, or None when no family prior applies."""
        family = family_of(tool_class)
        if family is None:
            return None
        prior = self.by_family.get(family)
        return None if prior is None else (family, prior)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClassPriors:
        """Build from the JSON shape of ``data/gap_priors.json``."""
        fams = data.get("families", {})
        priors = {
            name: GapPrior(float(v["p50_s"]), float(v["p90_s"]), float(v["p99_s"]))
            for name, v in fams.items()
        }
        return cls(priors, {k: v for k, v in data.items() if k != "families"})


@functools.lru_cache(maxsize=1)
def default_priors() -> ClassPriors:
    """The priors shipped with agentkv (``agentkv/gaps/data/gap_priors.json``)."""
    text = resources.files("agentkv.gaps").joinpath("data/gap_priors.json").read_text("utf-8")
    return ClassPriors.from_json(json.loads(text))
