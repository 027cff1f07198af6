"""The README's first example, as the tests read it (code and the output it shows)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## A first instrumented agent"
STATS_LINE = re.compile(
    r"turns=(?P<turns>\d+) prompt_tokens=(?P<prompt>\d+) cached_tokens=(?P<cached>\d+) "
    r"prefix_reuse_ratio=(?P<ratio>\d+\.\d+)"
)


def first_example() -> tuple[str, str]:
    """``(code, shown output)`` of the README's first instrumented agent."""
    text = README.read_text("utf-8")
    section = text[text.index(SECTION) :]
    code = re.search(r"^```python\n(.*?)^```", section, re.M | re.S)
    shown = re.search(r"^```text\n(.*?)^```", section, re.M | re.S)
    assert code is not None and shown is not None, "the README's first example has moved"
    return code.group(1), shown.group(1)
