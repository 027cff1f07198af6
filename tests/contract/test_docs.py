"""The docs hold together: Python code blocks compile, relative links and anchors resolve,
and the API page generator covers the whole public API."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text("utf-8"), flags=re.M | re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def _ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in pages]


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_python_code_blocks_compile(page: Path) -> None:
    """Every ```python block is valid Python (examples may use names defined elsewhere)."""
    for i, match in enumerate(FENCE.finditer(page.read_text("utf-8"))):
        source = match.group(1)
        try:
            compile(source, f"{page.name}[block {i}]", "exec")
        except SyntaxError as exc:
            pytest.fail(f"{page.name} block {i} does not compile: {exc}\n{source}")


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_relative_links_resolve(page: Path) -> None:
    """Every relative link points at an existing file (and heading, when it has an anchor)."""
    text = re.sub(r"^```.*?^```", "", page.read_text("utf-8"), flags=re.M | re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_api_page_generator_covers_the_public_api() -> None:
    """scripts/gen_api_docs.py documents every name in agentkv.__all__, the integrations and
    agentkv.workload."""
    import agentkv

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_api_docs
    finally:
        sys.path.pop(0)
    text = gen_api_docs.render()
    missing = [n for n in agentkv.__all__ if n != "__version__" and f"agentkv.{n}" not in text]
    assert not missing, f"not in the API page: {missing}"
    assert "agentkv.integrations.langgraph.AgentKVMiddleware" in text
    assert "agentkv.integrations.openai_agents.AgentKVTracingProcessor" in text
    assert "agentkv.workload.write_recorded_trace" in text  # the trace recorder's public path
    assert "(no docstring)" not in text


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_pages_never_send_users_into_the_bench_internals(page: Path) -> None:
    """What a user imports for traces and workloads is public (agentkv.workload); the
    bench's modules are private and may move."""
    text = page.read_text("utf-8")
    assert "agentkv.bench._" not in text and "agentkv.bench.run" not in text
    assert "agentkv.bench.testbed" not in text and "agentkv.bench.report" not in text


def test_the_readme_first_example_prints_and_shows_prefix_reuse() -> None:
    """Its shown output ends in the stats line with a reuse above 0 (a prompt shorter than
    one 128-token KV block reuses nothing, which is what a newcomer would have seen); the
    server test runs it (tests/server/test_readme_example.py)."""
    from tests.support.readme import STATS_LINE, first_example

    code, shown = first_example()
    assert "prefix_reuse_ratio=" in code and '"role": "system"' in code
    stats = STATS_LINE.search(shown.strip().splitlines()[-1])
    assert stats is not None and float(stats["ratio"]) > 0.0
