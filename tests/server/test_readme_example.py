"""The README's first example runs as printed, on the server it starts itself, and shows
prefix reuse (its long system prompt fills KV blocks the second turn reuses)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.readme import README, STATS_LINE, first_example
from tests.support.requires import require_smollm2_wheel, require_vllm

pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_the_first_example_shows_reuse_on_the_server_it_starts() -> None:
    require_vllm()
    require_smollm2_wheel()
    code, shown = first_example()
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=README.parent,
        env={**os.environ, "PYTHONPATH": str(README.parent)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout)
    lines = out.stdout.strip().splitlines()
    stats = STATS_LINE.search(lines[-1])
    assert stats is not None, out.stdout
    assert int(stats["turns"]) == 2
    assert float(stats["ratio"]) >= 0.5  # the first turn's prefix was found again
    assert int(stats["cached"]) >= 128  # at least one whole CPU block reused
    # what the README shows is this run's output, line for line
    assert [line.strip() for line in shown.strip().splitlines()] == [line.strip() for line in lines]
