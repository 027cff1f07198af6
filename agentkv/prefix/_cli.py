"""``agentkv lint FILE``: lint a JSONL of chat requests for prefix-cache problems.

Each line is an OpenAI chat request body (``{"messages": [...], "tools": [...]}``; an
OpenAI batch line ``{"body": {...}}`` works too). Consecutive lines are compared as
consecutive turns of one conversation, or, with ``--session-key``, consecutive lines that
share that field's value. Exit status: 0 clean, 1 when a prefix-breaking problem was
found, 2 when the file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from agentkv.prefix._lint import LintFinding, lint_prompt

__all__ = ["add_arguments", "lint_file", "run"]


class _InputError(Exception):
    """The input file cannot be read as a JSONL of chat requests."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``lint`` sub-command's arguments."""
    parser.add_argument(
        "file", help="JSONL file, one OpenAI chat request body per line ('-' = stdin)"
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="local model directory whose tokenizer and chat template give token offsets",
    )
    parser.add_argument(
        "--session-key",
        metavar="FIELD",
        help="compare only lines with the same value of this dotted field (e.g. metadata.session)",
    )
    parser.add_argument("--json", action="store_true", help="print findings as JSON lines")


def _field(body: Mapping[str, Any], dotted: str) -> Any:
    value: Any = body
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _read_requests(stream: TextIO, name: str) -> list[tuple[int, dict[str, Any]]]:
    requests: list[tuple[int, dict[str, Any]]] = []
    for line_no, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _InputError(f"{name}:{line_no}: not valid JSON ({exc.msg})") from None
        if isinstance(body, dict) and isinstance(body.get("body"), dict):
            body = body["body"]
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise _InputError(
                f"{name}:{line_no}: expected a chat request object with a 'messages' list"
            )
        if body.get("tools") is not None and not isinstance(body["tools"], list):
            raise _InputError(f"{name}:{line_no}: 'tools' must be a list")
        requests.append((line_no, body))
    return requests


def lint_file(
    requests: list[tuple[int, dict[str, Any]]],
    *,
    tokenizer: Any = None,
    session_key: str | None = None,
) -> list[tuple[int, LintFinding]]:
    """Lint numbered request bodies; return ``(line number, finding)`` pairs."""
    last_by_session: dict[str, dict[str, Any]] = {}
    results: list[tuple[int, LintFinding]] = []
    for line_no, body in requests:
        session = json.dumps(_field(body, session_key)) if session_key else ""
        previous = last_by_session.get(session)
        for finding in lint_prompt(body, previous=previous, tokenizer=tokenizer):
            results.append((line_no, finding))
        last_by_session[session] = body
    return results


def _print_table(results: list[tuple[int, LintFinding]], out: TextIO) -> None:
    header = ("line", "severity", "kind", "location", "offset", "message")
    rows = [
        (
            str(line_no),
            f.severity + ("*" if f.prefix_breaking else ""),
            f.kind,
            f.location,
            ""
            if f.char_offset is None
            else str(f.char_offset) + ("" if f.token_offset is None else f"/t{f.token_offset}"),
            f.message,
        )
        for line_no, f in results
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header[:-1])]
    for row in (header, *rows):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")


def run(args: argparse.Namespace) -> int:
    """Run ``agentkv lint``; return the exit status (0 clean, 1 prefix-breaking, 2 bad input)."""
    name = args.file
    try:
        if name == "-":
            requests = _read_requests(sys.stdin, "<stdin>")
        else:
            with Path(name).open(encoding="utf-8") as stream:
                requests = _read_requests(stream, name)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"agentkv lint: cannot read {name}: {exc}", file=sys.stderr)
        return 2
    except _InputError as exc:
        print(f"agentkv lint: {exc}", file=sys.stderr)
        return 2
    tokenizer = None
    if args.tokenizer:
        from agentkv._errors import ConfigError
        from agentkv.prefix._render import load_tokenizer

        try:
            tokenizer = load_tokenizer(args.tokenizer)
        except ConfigError as exc:
            print(f"agentkv lint: {exc}", file=sys.stderr)
            return 2
    results = lint_file(requests, tokenizer=tokenizer, session_key=args.session_key)
    breaking = sum(1 for _, f in results if f.prefix_breaking)
    if args.json:
        for line_no, f in results:
            print(json.dumps({"line": line_no, **f.__dict__}, ensure_ascii=False))
    elif results:
        _print_table(results, sys.stdout)
        print(
            f"\n{len(requests)} requests, {len(results)} findings, {breaking} prefix-breaking"
            " (marked *)"
        )
    else:
        print(f"{len(requests)} requests, no findings")
    return 1 if breaking else 0
