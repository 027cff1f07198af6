"""Token-id prompts that reproduce a trace's prefix structure exactly.

Every trajectory has its own deterministic token stream. Turn 0's prompt is an optional
common system prefix (the same tokens in every trajectory) followed by fresh tokens.
Turn ``k``'s prompt is the first ``shared_prefix_tokens`` tokens of turn ``k-1``'s
context (its prompt followed by its answer) followed by fresh tokens, and the first
fresh token differs from the context token at that position, so the common prefix of
the two is *exactly* the trace's figure, not longer by chance.

The answer's token ids come from the server (``return_token_ids``) when it reports them,
so the cached answer blocks can be reused as a real agent would reuse them; otherwise
a deterministic placeholder answer stands in. Fresh tokens are drawn from a generator
seeded by ``(seed, trajectory, turn)`` only, so prompts do not depend on the order in
which concurrent trajectories run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from agentkv._errors import ConfigError
from agentkv.workload._workload import PlannedTrajectory, PlannedTurn

__all__ = ["PromptSynthesizer", "common_prefix_tokens"]


def common_prefix_tokens(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token-id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True, slots=True)
class PromptSynthesizer:
    """Deterministic token-id prompts for planned turns.

    ``vocab_low``/``vocab_high`` bound the token ids used (keep special tokens out);
    ``system_prefix_tokens`` is the common prefix shared by every trajectory's first
    prompt.
    """

    seed: int = 0
    vocab_low: int = 16
    vocab_high: int = 2048
    system_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.vocab_high - self.vocab_low < 2:
            raise ConfigError(
                f"token id range [{self.vocab_low}, {self.vocab_high}) is too small; "
                "it needs at least two ids"
            )

    def _fresh(self, key: str, n: int, avoid_first: int | None = None) -> list[int]:
        if n <= 0:
            return []
        rng = random.Random(f"agentkv-bench:{self.seed}:{key}")
        ids = [rng.randrange(self.vocab_low, self.vocab_high) for _ in range(n)]
        if avoid_first is not None and ids[0] == avoid_first:
            span = self.vocab_high - self.vocab_low
            ids[0] = self.vocab_low + (ids[0] - self.vocab_low + 1) % span
        return ids

    def system_prefix(self) -> list[int]:
        """The common prefix every trajectory's first prompt starts with."""
        return self._fresh("system", self.system_prefix_tokens)

    def placeholder_output(self, traj_idx: int, turn: PlannedTurn) -> list[int]:
        """A deterministic stand-in answer when the server does not report token ids."""
        return self._fresh(f"{traj_idx}:{turn.index}:out", turn.output_tokens)

    def prompt(
        self, traj_idx: int, turn: PlannedTurn, previous_context: Sequence[int] | None
    ) -> list[int]:
        """Token ids of ``turn``'s prompt.

        ``previous_context`` is the previous turn's prompt followed by its answer (None
        for the first turn). The result shares exactly ``turn.shared_prefix_tokens``
        leading tokens with it.
        """
        key = f"{traj_idx}:{turn.index}"
        if previous_context is None or turn.index == 0:
            head = self.system_prefix()[: turn.prompt_tokens]
            return head + self._fresh(key, turn.prompt_tokens - len(head))
        shared = min(turn.shared_prefix_tokens, len(previous_context), turn.prompt_tokens)
        head = list(previous_context[:shared])
        nxt = previous_context[shared] if shared < len(previous_context) else None
        return head + self._fresh(key, turn.prompt_tokens - shared, avoid_first=nxt)

    def trajectory_prompts(self, traj: PlannedTrajectory) -> list[list[int]]:
        """All prompts of a trajectory, answers replaced by placeholders (for planning
        and tests; the live driver uses the server's answers)."""
        prompts: list[list[int]] = []
        context: list[int] | None = None
        for turn in traj.turns:
            p = self.prompt(traj.traj_idx, turn, context)
            prompts.append(p)
            context = p + self.placeholder_output(traj.traj_idx, turn)
        return prompts
