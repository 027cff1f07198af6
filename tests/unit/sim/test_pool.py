"""The simulator's block pool follows vLLM's prefix-caching semantics."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.sim import BlockPool, KeyChain, LowerTier, make_pool


def _run_request(pool: BlockPool, keys: list[int]) -> list[int]:
    h = pool.match(keys, len(keys))
    blocks = pool.touch(keys[:h])
    new = pool.allocate(len(keys) - h)
    assert new is not None
    pool.assign_keys(new, keys[h:])
    return blocks + new


def test_keychain_keeps_shared_blocks_and_chains_new_ones() -> None:
    chain = KeyChain()
    a = chain.extend([], 0, 64, 16)
    assert len(a) == 4 and len(set(a)) == 4
    b = chain.extend(a, 40, 96, 16)  # shares 2 whole blocks (32 tokens), 40 // 16 == 2
    assert b[:2] == a[:2]
    assert not set(b[2:]) & set(a)  # a different parent chain gives different keys


def test_lru_evicts_the_deepest_block_of_the_oldest_chain_first() -> None:
    pool = make_pool(6)
    chain = KeyChain()
    ka = chain.extend([], 0, 48, 16)
    kb = chain.extend([], 0, 48, 16)
    a = _run_request(pool, ka)
    pool.free_blocks(a[::-1])  # vLLM frees a request's blocks in reverse
    b = _run_request(pool, kb)
    pool.free_blocks(b[::-1])
    assert pool.allocate(1) is not None  # evicts a's deepest block
    assert pool.match(ka, 3) == 2
    assert pool.match(kb, 3) == 3
    pool.check()


def test_shared_blocks_are_ref_counted_and_never_evicted_while_held() -> None:
    pool = make_pool(4)
    keys = KeyChain().extend([], 0, 32, 16)
    first = _run_request(pool, keys)
    second = _run_request(pool, keys)  # full hit: same blocks, ref 2
    assert first == second
    assert [pool.ref[b] for b in first] == [2, 2]
    pool.free_blocks(first[::-1])
    assert pool.allocate(3) is None  # only 2 blocks free; the shared ones are still held
    pool.free_blocks(second[::-1])
    assert pool.num_free == 4
    assert pool.match(keys, 2) == 2  # freed blocks stay findable
    pool.check()


def test_hit_revives_a_freed_block_out_of_the_free_queue() -> None:
    pool = make_pool(3)
    keys = KeyChain().extend([], 0, 32, 16)
    pool.free_blocks(_run_request(pool, keys)[::-1])
    blocks = pool.touch(keys)
    assert pool.num_free == 1
    assert pool.allocate(1) is not None
    assert pool.match(keys, 2) == 2
    pool.free_blocks(blocks[::-1])
    pool.check()


def test_demote_puts_blocks_at_the_head_deepest_first() -> None:
    for priority in (False, True):
        pool = make_pool(6, priority_queue=priority)
        chain = KeyChain()
        ka, kb = chain.extend([], 0, 48, 16), chain.extend([], 0, 48, 16)
        a = _run_request(pool, ka)
        pool.free_blocks(a[::-1])
        b = _run_request(pool, kb)
        pool.free_blocks(b[::-1])
        pool.demote(b)  # b was freed last but is now evicted first
        assert pool.allocate(1) is not None
        assert pool.match(kb, 3) == 2 and pool.match(ka, 3) == 3
        pool.check()


def test_priority_queue_evicts_lowest_priority_first() -> None:
    pool = make_pool(4, priority_queue=True)
    chain = KeyChain()
    ka, kb = chain.extend([], 0, 32, 16), chain.extend([], 0, 32, 16)
    pool.free_blocks(_run_request(pool, ka)[::-1], priority=-5.0)  # used again later
    pool.free_blocks(_run_request(pool, kb)[::-1], priority=-1.0)  # used again soon
    assert pool.allocate(2) is not None
    assert pool.match(ka, 2) == 0 and pool.match(kb, 2) == 2


def test_evicted_blocks_go_to_the_lower_tier() -> None:
    tier = LowerTier(
        capacity_blocks=8, bandwidth_bytes_per_s=1e9, latency_s=0.001, block_bytes=1000
    )
    pool = make_pool(2, lower_tier=tier)
    chain = KeyChain()
    keys = chain.extend([], 0, 32, 16)
    pool.free_blocks(_run_request(pool, keys)[::-1])
    pool.allocate(2)
    assert pool.match(keys, 2) == 0
    assert pool.match_lower(keys, 0, 2) == 2
    assert tier.load_time_s(2) == 0.001 + 2 * 1000 / 1e9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6), st.booleans()), max_size=40))
def test_pool_invariants_hold_under_any_sequence(ops: list[tuple[int, int, bool]]) -> None:
    """Ref counts, the free count and the key map stay consistent whatever runs."""
    pool = make_pool(12)
    chain = KeyChain()
    contexts: list[list[int]] = [[] for _ in range(6)]
    held: list[list[int]] = []
    for traj, nblocks, release in ops:
        keys = chain.extend(contexts[traj], len(contexts[traj]) * 16 // 2, nblocks * 16, 16)
        h = pool.match(keys, len(keys))
        if (
            pool.num_free - sum(1 for k in keys[:h] if pool.ref[pool.cached[k]] == 0)
            < len(keys) - h
        ):
            if held:
                pool.free_blocks(held.pop(0)[::-1])
            continue
        contexts[traj] = keys
        blocks = pool.touch(keys[:h])
        new = pool.allocate(len(keys) - h)
        assert new is not None
        pool.assign_keys(new, keys[h:])
        if release:
            pool.free_blocks((blocks + new)[::-1])
            pool.demote(blocks + new)
        else:
            held.append(blocks + new)
        pool.check()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 7), st.integers(0, 2), st.integers(0, 2)),
        max_size=50,
    )
)
def test_run_pool_evicts_exactly_like_the_per_block_queue(
    ops: list[tuple[int, int, int, int]],
) -> None:
    """The LRU pool's runs give the same hits, evictions and free counts as a plain
    block-by-block FIFO queue (the priority pool with every priority equal)."""
    runs, plain = make_pool(14), make_pool(14, priority_queue=True)
    chain = KeyChain()
    contexts: list[list[int]] = [[] for _ in range(5)]
    held: list[tuple[list[int], list[int]]] = []
    for traj, nblocks, keep_div, mode in ops:
        keys = chain.extend(
            contexts[traj], len(contexts[traj]) * 16 // (keep_div + 1), nblocks * 16, 16
        )
        hit = runs.match(keys, len(keys))
        assert hit == plain.match(keys, len(keys))
        short = [
            p.num_free - sum(1 for k in keys[:hit] if p.refcount(p.cached[k]) == 0)
            < len(keys) - hit
            for p in (runs, plain)
        ]
        assert short[0] == short[1]
        if short[0]:
            if held:
                a, b = held.pop(0)
                runs.free_blocks(a[::-1])
                plain.free_blocks(b[::-1])
            continue
        contexts[traj] = keys
        got = []
        for p in (runs, plain):
            blocks = p.touch(keys[:hit])
            new = p.allocate(len(keys) - hit)
            assert new is not None
            p.assign_keys(new[:-1] if mode == 2 else new, keys[hit:])  # mode 2: last unkeyed
            got.append(blocks + new)
        if mode == 0:
            held.append((got[0], got[1]))
        else:
            for p, blocks in zip((runs, plain), got, strict=True):
                p.free_blocks(blocks[::-1])
                if mode == 1:
                    p.demote(blocks)
        assert runs.num_free == plain.num_free and runs.num_evictions == plain.num_evictions
        assert set(runs.cached) == set(plain.cached)
        runs.check()


def test_make_pool_picks_one_of_two_sibling_pools() -> None:
    """LRU and priority pools are siblings behind the BlockPool protocol, not subclasses."""
    from agentkv.sim import LRUBlockPool, PriorityBlockPool

    lru, prio = make_pool(4), make_pool(4, priority_queue=True)
    assert type(lru) is LRUBlockPool and type(prio) is PriorityBlockPool
    assert not issubclass(PriorityBlockPool, LRUBlockPool)
    assert not issubclass(LRUBlockPool, PriorityBlockPool)
