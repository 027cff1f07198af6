"""Values that change from run to run: timestamps, dates, UUIDs, request ids, PIDs, ...

Inside the stable part of a prompt (the system prompt, the tool descriptions) any of
them breaks prefix reuse across runs. :func:`volatile_spans` finds them; the lint
(:func:`agentkv.lint_prompt`) reports them as ``volatile_content``.
"""

from __future__ import annotations

import re

__all__ = ["VOLATILE_PATTERNS", "volatile_spans"]

_MONTHS = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
# (kind label, pattern) in priority order: an earlier pattern claims its span first.
VOLATILE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "timestamp",
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
        ),
    ),
    (
        "UUID",
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
    ),
    (
        "request id",
        re.compile(
            r"\b(?:req|request|run|trace|span|session|sess|conv|chatcmpl|call|msg|resp|job|task)"
            r"[-_][A-Za-z0-9]*\d[A-Za-z0-9]{5,}\b"
            r"|(?i:\b(?:request|trace|correlation|session)[ _-]?id\b\s*[:=]\s*\S+)"
        ),
    ),
    ("PID", re.compile(r"(?i)\b(?:pid|process id)\b\s*[:=#]?\s*\d{2,}")),
    (
        "temp path",
        re.compile(
            r"(?:/tmp|/var/tmp|/private/var/folders|/var/folders|/dev/shm)/[^\s\"'`)\]]+"
            r"|[A-Za-z]:\\[^\s\"']*\\Temp\\[^\s\"']+"
            r"|\btmp[_-]?(?=[a-z0-9_]*\d)[a-z0-9_]{6,}\b"
        ),
    ),
    ("epoch time", re.compile(r"\b1[5-9]\d{8}(?:\d{3})?(?:\.\d+)?\b")),
    (
        "date",
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
            rf"|\b{_MONTHS}\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b"
            rf"|\b\d{{1,2}} {_MONTHS}\.?,? \d{{4}}\b"
        ),
    ),
    ("time of day", re.compile(r"\b\d{1,2}:\d{2}:\d{2}\b|\b\d{1,2}:\d{2}\s?(?:[AaPp][Mm])\b")),
    ("random hex", re.compile(r"\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{16,}\b")),
)


def volatile_spans(text: str) -> list[tuple[int, str, str]]:
    """Return ``(offset, label, matched text)`` for each volatile value, by offset."""
    claimed: list[tuple[int, int]] = []
    found: list[tuple[int, str, str]] = []
    for label, pattern in VOLATILE_PATTERNS:
        for match in pattern.finditer(text):
            start, end = match.span()
            if any(start < c_end and c_start < end for c_start, c_end in claimed):
                continue
            claimed.append((start, end))
            found.append((start, label, match.group(0)))
    return sorted(found)
