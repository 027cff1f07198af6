"""The KV pool a workload is run on: a fraction of its working set, and the limit pool.

``agentkv bench`` gives every arm the pool of :func:`plan_pool` (one server's, or each
replica's share behind a router), and ``agentkv sim`` sizes its pool the same way
(:func:`agentkv.sim.bench_pool_blocks`), so a pool fraction means the same in both
tools. The pool is counted in 16-bit-KV blocks; an FP8 arm holds twice the blocks in
the same memory.

The limit arm L is the one exception: :func:`plan_limit` sizes its pool to every block
the workload ever writes (each turn's context beyond the prefix it shares with the
previous turn, summed over every trajectory) plus the running batch's margin (one
longest context per trajectory in flight), so no policy can do better than L on the
same server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentkv._errors import ConfigError

__all__ = ["ArmPlan", "plan_limit", "plan_pool"]


@dataclass(frozen=True, slots=True)
class ArmPlan:
    """The pool every arm shares, in 16-bit-KV blocks, and the model length."""

    block_size: int
    pool_blocks: int
    max_model_len: int
    offload_size_gib: float = 4.0

    def pool_tokens(self) -> int:
        """Tokens the 16-bit pool holds."""
        return self.pool_blocks * self.block_size


def _blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)


def plan_pool(
    working_set_tokens: int, pool_fraction: float, max_context_tokens: int, block_size: int
) -> tuple[ArmPlan, bool]:
    """The shared pool for a pool fraction of the working set.

    Returns the plan and whether the pool was raised to fit the longest context (vLLM
    refuses a pool smaller than ``max_model_len``).
    """
    if not pool_fraction > 0:
        raise ConfigError(f"pool fraction must be positive, got {pool_fraction}")
    max_model_len = _blocks_for(max_context_tokens + 1, block_size) * block_size
    want = _blocks_for(math.ceil(working_set_tokens * pool_fraction), block_size)
    floor = _blocks_for(max_model_len, block_size) + 1
    blocks = max(want, floor)
    return ArmPlan(block_size, blocks, max_model_len), blocks != want


def plan_limit(new_blocks_per_turn: list[int], concurrency: int, plan: ArmPlan) -> ArmPlan:
    """Arm L's pool: ``plan`` (the shared one) grown to hold the whole workload.

    ``new_blocks_per_turn`` holds, for every turn of every trajectory, the blocks that
    turn writes beyond the prefix it shares with the previous turn (see
    :meth:`~agentkv.workload.Workload.new_blocks_per_turn`). Their sum is every
    block the workload ever writes; one longest context per trajectory in flight is
    added as the running batch's margin. L never gets a smaller pool than ``plan``.
    """
    margin = max(1, concurrency) * _blocks_for(plan.max_model_len, plan.block_size)
    blocks = max(plan.pool_blocks, sum(new_blocks_per_turn) + margin)
    return ArmPlan(plan.block_size, blocks, plan.max_model_len, plan.offload_size_gib)
