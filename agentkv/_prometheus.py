"""Reading Prometheus text (``/metrics``) with ``prometheus_client``'s own parser.

A leaf: the client's load tracker and the benchmark's scraper both read samples through
:func:`iter_samples`. ``prometheus_client`` is imported on first use (vLLM depends on it;
for the client it comes with the ``bench`` extra); without it the caller gets an
``ImportError`` and treats the metrics as unavailable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

__all__ = ["iter_samples"]


def iter_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every finite sample in Prometheus text ``text``.

    A malformed exposition ends the iteration where the parser stops (what was read
    before it stands).
    """
    from prometheus_client.parser import text_string_to_metric_families

    families = iter(text_string_to_metric_families(text))
    while True:
        try:
            family = next(families)
        except StopIteration:
            return
        except ValueError:  # malformed text: keep what was parsed
            return
        for sample in family.samples:
            value = float(sample.value)
            if math.isfinite(value):
                yield sample.name, dict(sample.labels), value
