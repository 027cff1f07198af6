"""The Anthropic Messages API: ``cache_control`` breakpoints with a TTL from the gap.

Anthropic caches a prompt prefix up to each ``cache_control`` breakpoint (at most four;
tools, then system, then messages) for 5 minutes by default, or 1 hour at a higher write
price. :class:`AnthropicAdapter` places breakpoints where a caller has set no caching up
(no breakpoint of their own, no top-level automatic ``cache_control``): the last tool,
the end of the system prompt and the last block of the conversation (so the next turn
reads everything before it), and the fourth on a wide turn, where the conversation grew
by more than the API's 20-block lookback since the previous call
(:func:`message_breakpoints`); never on a thinking block or an empty text block, which
the API refuses. All carry one TTL chosen by :func:`choose_ttl`:

- a 5-minute write costs 1.25x the input price, a 1-hour write 2x, a read 0.1x;
- with probability ``p`` the next call comes more than 5 minutes later: 5m costs
  ``1.25 + p * 1.25 + (1 - p) * 0.1`` (a miss writes again), 1h costs ``2 + 0.1``;
- so 1 hour pays when ``p > 0.75 / 1.15 ≈ 0.65``, and only when the next call is
  expected within the hour. ``p`` comes from the learned gap distribution (median and
  90th percentile, log-normal in between).

Nothing else is added: the API rejects unknown fields. Usage: ``cache_read_input_tokens``
is the turn's cached tokens (see :func:`agentkv.client.backends._request.parse_usage`),
``cache_creation_input_tokens`` its cache writes (``TurnRecord.cache_write_tokens``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from agentkv.client.backends._adapters import BackendName, RequestHints

__all__ = [
    "LOOKBACK_BLOCKS",
    "AnthropicAdapter",
    "choose_ttl",
    "message_breakpoints",
    "p_gap_over",
]

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


#: Block types the API refuses a ``cache_control`` on.
_UNCACHEABLE = frozenset({"thinking", "redacted_thinking"})
#: How many blocks before a breakpoint the API looks for an earlier cache entry.
LOOKBACK_BLOCKS = 20


def _cacheable(block: Any) -> bool:
    """A block that may carry a breakpoint: not thinking, not an empty text block."""
    if isinstance(block, str):
        return bool(block)
    if not isinstance(block, Mapping):
        return False
    kind = block.get("type")
    if kind in _UNCACHEABLE:
        return False
    return not (kind == "text" and not block.get("text"))


def _blocks(content: Any) -> list[Any]:
    """A message's or the system prompt's content as a list of blocks."""
    if isinstance(content, str):
        return [content] if content else []
    return list(content) if isinstance(content, list) else []


def _marked(block: Any, control: dict[str, str]) -> dict[str, Any]:
    if isinstance(block, str):
        return {"type": "text", "text": block, "cache_control": control}
    return {**block, "cache_control": control}


def _marked_system(system: Any, control: dict[str, str]) -> list[Any] | None:
    """The system prompt with its last cacheable block marked (None: nothing to mark)."""
    blocks = _blocks(system)
    for i in range(len(blocks) - 1, -1, -1):
        if _cacheable(blocks[i]):
            marked = [_marked(b, control) if j == i else b for j, b in enumerate(blocks)]
            return [{"type": "text", "text": b} if isinstance(b, str) else b for b in marked]
    return None


def message_breakpoints(messages: list[Any]) -> list[tuple[int, int]]:
    """Where the conversation's breakpoints go: (message index, block index) pairs.

    The last cacheable block of the conversation, so the next turn reads all of it. When
    that block lies more than :data:`LOOKBACK_BLOCKS` blocks past the end of the previous
    request (the blocks before the last assistant message: what the previous call
    cached), its lookback cannot reach that entry and the turn would write the whole
    conversation again; a second breakpoint then goes on the last cacheable block within
    the lookback of the previous end, which reads it. (Past twice the lookback, the last
    breakpoint still misses the second one: what the API allows with four breakpoints.)
    Thinking blocks and empty text blocks never carry one (the API refuses them).
    """
    positions: list[tuple[int, int]] = []  # every block, in order
    cacheable: list[bool] = []
    previous_end: int | None = None  # index into positions of the previous request's end
    last_assistant = None
    for m, message in enumerate(messages[:-1]):
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            last_assistant = m
    for m, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        if m == last_assistant:
            ends = [i for i, ok in enumerate(cacheable) if ok]
            previous_end = ends[-1] if ends else None
        for b, block in enumerate(_blocks(message.get("content"))):
            positions.append((m, b))
            cacheable.append(_cacheable(block))
    ends = [i for i, ok in enumerate(cacheable) if ok]
    if not ends:
        return []
    last = ends[-1]
    out = [positions[last]]
    if previous_end is not None and last - previous_end > LOOKBACK_BLOCKS:
        bridge = [i for i in ends if previous_end < i <= previous_end + LOOKBACK_BLOCKS]
        if bridge:
            out.insert(0, positions[bridge[-1]])
    return out


def _marked_messages(messages: list[Any], control: dict[str, str]) -> list[Any] | None:
    """``messages`` with breakpoints on :func:`message_breakpoints` (None: none fits)."""
    points = message_breakpoints(messages)
    if not points:
        return None
    out = list(messages)
    for m in sorted({m for m, _ in points}):
        blocks = _blocks(messages[m].get("content"))
        marked = [
            _marked(block, control) if (m, b) in points else block for b, block in enumerate(blocks)
        ]
        content = [{"type": "text", "text": b} if isinstance(b, str) else b for b in marked]
        out[m] = {**messages[m], "content": content}
    return out


def _caller_caches(request: Mapping[str, Any]) -> bool:
    """The caller set caching up themselves: a breakpoint of their own anywhere, or the
    top-level (automatic) ``cache_control``, in the request or its ``extra_body``."""
    return isinstance(request.get("cache_control"), Mapping) or _has_breakpoint(request)


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

        Empty when the caller set caching up themselves (a breakpoint of their own, or
        the top-level automatic ``cache_control``, also through ``extra_body``: theirs
        stand) or in observe / shadow mode.
        """
        if not hints.scheduling or _caller_caches(request):
            return {}
        control = {"type": "ephemeral", "ttl": choose_ttl(hints.gap_p50_s, hints.gap_p90_s)}
        out: dict[str, Any] = {}
        tools = request.get("tools")
        if isinstance(tools, list) and tools and isinstance(tools[-1], Mapping):
            out["tools"] = [*tools[:-1], {**tools[-1], "cache_control": control}]
        system = _marked_system(request.get("system"), control)
        if system is not None:
            out["system"] = system
        messages = request.get("messages")
        if isinstance(messages, list) and messages:
            marked = _marked_messages(messages, control)
            if marked is not None:
                out["messages"] = marked
        return out
