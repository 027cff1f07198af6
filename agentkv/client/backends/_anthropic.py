"""The Anthropic Messages API: ``cache_control`` breakpoints with a TTL from the gap.

Anthropic caches a prompt prefix up to each ``cache_control`` breakpoint (at most four;
tools, then system, then messages) for 5 minutes by default, or 1 hour at a higher write
price. :class:`AnthropicAdapter` places three breakpoints where a caller has placed none:
the last tool, the end of the system prompt and the last block of the conversation (so
the next turn reads everything before it), all with one TTL chosen by
:func:`choose_ttl`:

- a 5-minute write costs 1.25x the input price, a 1-hour write 2x, a read 0.1x;
- with probability ``p`` the next call comes more than 5 minutes later: 5m costs
  ``1.25 + p * 1.25 + (1 - p) * 0.1`` (a miss writes again), 1h costs ``2 + 0.1``;
- so 1 hour pays when ``p > 0.75 / 1.15 ≈ 0.65``, and only when the next call is
  expected within the hour. ``p`` comes from the learned gap distribution (median and
  90th percentile, log-normal in between).

Nothing else is added: the API rejects unknown fields. Usage: ``cache_read_input_tokens``
is the turn's cached tokens (see :func:`agentkv.client.backends._request.parse_usage`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from agentkv.client.backends._adapters import BackendName, RequestHints

__all__ = ["AnthropicAdapter", "choose_ttl", "p_gap_over"]

_FIVE_MIN_S = 300.0
_HOUR_S = 3600.0
_BREAK_EVEN = 0.75 / 1.15


def p_gap_over(limit_s: float, p50_s: float | None, p90_s: float | None) -> float | None:
    """P(gap > ``limit_s``) from a gap's median and 90th percentile (log-normal fit)."""
    if p50_s is None or p50_s <= 0:
        return None
    if p90_s is None or p90_s <= p50_s:
        return 1.0 if p50_s > limit_s else 0.0
    sigma = math.log(p90_s / p50_s) / 1.2815515655446004
    z = math.log(limit_s / p50_s) / sigma
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def choose_ttl(p50_s: float | None, p90_s: float | None) -> Literal["5m", "1h"]:
    """``1h`` when the next call is likely (> 0.65) past 5 minutes but within the hour."""
    p = p_gap_over(_FIVE_MIN_S, p50_s, p90_s)
    if p is None or p <= _BREAK_EVEN:
        return "5m"
    within_hour = p_gap_over(_HOUR_S, p50_s, p90_s)
    return "1h" if within_hour is not None and within_hour < 0.5 else "5m"


def _has_breakpoint(value: Any) -> bool:
    """True when the caller placed a ``cache_control`` (one the SDK omits does not count)."""
    if isinstance(value, Mapping):
        if isinstance(value.get("cache_control"), Mapping):
            return True
        return any(_has_breakpoint(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_breakpoint(v) for v in value)
    return False


def _marked_blocks(content: Any, control: dict[str, str]) -> list[Any] | None:
    """``content`` (a string or a list of blocks) with its last block marked."""
    if isinstance(content, str):
        return [{"type": "text", "text": content, "cache_control": control}] if content else None
    if isinstance(content, list) and content and isinstance(content[-1], Mapping):
        return [*content[:-1], {**content[-1], "cache_control": control}]
    return None


@dataclass
class AnthropicAdapter:
    """Anthropic Messages API: ``cache_control`` breakpoints (see the module doc)."""

    name: ClassVar[BackendName] = "anthropic"
    carries_salt: ClassVar[bool] = False
    control_url: str | None = None

    def apply(self, hints: RequestHints, body: dict[str, Any], headers: dict[str, str]) -> None:
        """No extra fields or headers: the breakpoints go in :meth:`rewrite`."""

    def rewrite(self, hints: RequestHints, request: Mapping[str, Any]) -> dict[str, Any]:
        """The request's ``tools`` / ``system`` / ``messages`` with breakpoints added.

        Empty when the caller placed breakpoints of their own (theirs stand) or in
        observe / shadow mode.
        """
        if not hints.scheduling or _has_breakpoint(request):
            return {}
        control = {"type": "ephemeral", "ttl": choose_ttl(hints.gap_p50_s, hints.gap_p90_s)}
        out: dict[str, Any] = {}
        tools = request.get("tools")
        if isinstance(tools, list) and tools and isinstance(tools[-1], Mapping):
            out["tools"] = [*tools[:-1], {**tools[-1], "cache_control": control}]
        system = _marked_blocks(request.get("system"), control)
        if system is not None:
            out["system"] = system
        messages = request.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[-1], Mapping):
            blocks = _marked_blocks(messages[-1].get("content"), control)
            if blocks is not None:
                out["messages"] = [*messages[:-1], {**messages[-1], "content": blocks}]
        return out
