"""Issue 13's server-side bounds as pure logic: tenant keys, quotas, leases, hashes,
priority bands and the control route's input handling (the real-server versions of
these findings are in tests/server/test_security.py)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from agentkv.protocol import _wire as wire
from agentkv.protocol._hints import decode_hint
from agentkv.residency import Forecast, PolicyCore, PolicySettings
from agentkv.vllm._control import ControlInputError, read_body, validate_events_body
from agentkv.vllm._tenancy import Scoper


def _core(**kw: object) -> PolicyCore[int]:
    return PolicyCore(PolicySettings(**kw), num_blocks=100)  # type: ignore[arg-type]


# -- finding 2: trajectory ids are scoped by tenant ---------------------------------------
def test_finding2_keys_differ_between_tenants_and_hide_the_salt() -> None:
    s = Scoper(b"k" * 32)
    assert s.key("salt-a", "1") == s.key("salt-a", "1")
    assert len({s.key("salt-a", "1"), s.key("salt-b", "1"), s.key(None, "1")}) == 3
    assert s.key(None, "1") == s.key("", "1")  # no salt: the unsalted scope
    assert s.tenant(None) == "" and s.tenant("salt-a") != s.tenant("salt-b")
    assert "salt-a" not in s.key("salt-a", "1") + s.tenant("salt-a")
    assert Scoper().key("salt-a", "1") != s.key("salt-a", "1")  # per-process secret


def test_finding2_same_id_in_two_tenants_keeps_two_states() -> None:
    b, s = _core(retention="hint"), Scoper()
    a_key, b_key = s.key("tenant-a", "1"), s.key("tenant-b", "1")
    sa, sb = (
        b.book.state(a_key, 0, s.tenant("tenant-a")),
        b.book.state(b_key, 0, s.tenant("tenant-b")),
    )
    sa.attained_tokens = 500
    b.book.set_lease(sa, [1, 2], 60_000, 0)
    assert sb is not sa and sb.lease is None and sb.attained_tokens == 0
    assert b.book.get(s.key("tenant-b", "1")) is sb and b.book.get(s.key("tenant-c", "1")) is None


# -- finding 4: quotas, lifetime ------------------------------------------------------------
def test_finding4_a_tenant_flood_evicts_only_its_own_trajectories() -> None:
    b = _core(max_trajectories=100, max_trajectories_per_tenant=4)
    victim = b.book.state("v", 0, tenant="victim")
    for i in range(50):
        b.book.state(f"flood-{i}", i, tenant="attacker")
    assert b.book.get("v") is victim and b.book.tenant_size("attacker") == 4
    assert b.counters.trajectories_evicted == 46


def test_finding4_a_tenant_over_its_share_gives_room_back() -> None:
    b = _core(retention="hint", max_retained_fraction=0.5, tenant_retained_share=0.5)
    for i in range(5):  # five leases fill the whole retained cap (50 blocks)
        st = b.book.state(f"a{i}", 0, tenant="attacker")
        n = b.plan_lease(st, 10, 0)
        b.book.set_lease(st, list(range(i * 10, i * 10 + n)), 60_000, 0)
    assert b.book.retained_blocks == 50 and b.book.allowance() == 0
    victim = b.book.state("v", 0, tenant="victim")
    assert b.plan_lease(victim, 20, 0) == 20  # the attacker's excess went
    assert b.book.tenant_retained("attacker") == 30 and b.counters.leases_reclaimed >= 1
    b.book.drain_frees()
    b.book.set_lease(victim, list(range(100, 120)), 60_000, 0)
    assert b.book.retained_blocks <= b.book.retained_cap


def test_finding4_under_predicted_retention_a_short_pool_is_taken_from_tenants_over_share() -> None:
    """The default lease policy declines a lease that returns last when the pool is
    short, and pressure gives up the lease expected back last: without shares, a tenant
    whose leases came first would always keep them and the victim's would always go."""
    b = _core(retention="predicted", max_retained_fraction=0.9, tenant_retained_share=0.5)
    hogs = []
    for i in range(5):  # 60 blocks: over the attacker's share (45 of the 90-block cap)
        st = b.book.state(f"a{i}", 0, tenant="attacker")
        b.on_finished(st, 0.0, Forecast(30.0, 60.0, 120.0), 12)
        n = b.plan_lease(st, 12, 0.0, free_blocks=100)
        b.book.set_lease(st, list(range(i * 12, i * 12 + n)), 600_000, 0.0)
        hogs.append(st)
    assert b.book.tenant_retained("attacker") == 60
    victim = b.book.state("v", 1.0, tenant="victim")
    b.on_finished(victim, 1.0, Forecast(60.0, 120.0, 240.0), 20)  # back last of all
    assert b.plan_lease(victim, 20, 1.0, free_blocks=5, demand_blocks=10) == 20
    b.book.set_lease(victim, list(range(100, 120)), 600_000, 1.0)
    assert b.pressure_release(None, 2.0, need_blocks=5) == 5
    assert victim.lease is not None and len(victim.lease.blocks) == 20
    assert b.book.tenant_retained("attacker") == 55
    lone = _core(retention="predicted", max_retained_fraction=0.9)  # one tenant: as before
    st = lone.book.state("x", 0.0)
    lone.on_finished(st, 0.0, Forecast(30.0, 60.0, 120.0), 12)
    lone.book.set_lease(st, list(range(12)), 600_000, 0.0)
    late = lone.book.state("y", 1.0)
    lone.on_finished(late, 1.0, Forecast(60.0, 120.0, 240.0), 20)
    assert lone.plan_lease(late, 20, 1.0, free_blocks=5, demand_blocks=10) < 20


def test_finding4_extending_a_lease_cannot_outlive_its_lifetime() -> None:
    b = _core(retention="hint", max_ttl_ms=100_000, max_lease_lifetime_ms=100_000)
    st = b.book.state("t", 0)
    b.on_finished(st, 0.0, None)
    b.book.set_lease(st, [1], 60_000, 0.0)
    for now in (50.0, 90.0, 99.0):
        b.book.extend_lease(st, 100_000, now)
    assert st.lease is not None and st.lease.deadline_s == 100.0
    assert b.book.expire(100.0) == 1
    assert b.book.lease_deadline_s(st, 100_000, 120.0) <= 120.0  # taking it again: nothing left


# -- finding 3: release demotes only what the trajectory computed -------------------------
def test_finding3_release_candidates_exclude_blocks_hit_in_the_cache() -> None:
    b = _core()
    st = b.book.state("t", 0)
    b.book.set_hashes(st, [b"sys0", b"sys1", b"own0"], computed_from=2)  # sys* were cache hits
    assert b.book.own_unshared(st) == [b"own0"]
    b.book.set_hashes(st, [b"sys0", b"sys1", b"own0", b"own1"], computed_from=3)  # next turn
    assert b.book.own_unshared(st) == [b"own1", b"own0"]  # its own turn-1 block is still its own
    other = b.book.state("o", 0)
    b.book.set_hashes(other, [b"sys0", b"sys1", b"own0"], computed_from=3)
    assert b.book.own_unshared(st) == [b"own1"]  # shared with a tracked trajectory: kept


# -- finding 9: interned hashes under a budget --------------------------------------------
def test_finding9_equal_hashes_are_stored_once_and_the_total_is_bounded() -> None:
    b = _core(max_hash_refs=10_000, max_hashes_per_trajectory=4096)
    prompt = [i.to_bytes(32, "little") for i in range(4096)]
    states = []
    for t in range(64):  # each request brings its own copies of the same hash values
        st = b.book.state(f"t{t}", t)
        b.book.set_hashes(st, [bytes(bytearray(h)) for h in prompt])
        states.append(st)
    assert b.book.hash_refs <= 10_000 and b.book.hashes_interned == 4096
    kept = [st for st in states if st.hashes]
    assert len(kept) >= 2 and all(
        x is y for x, y in zip(kept[0].hashes, kept[-1].hashes, strict=True)
    )
    assert states[-1].hashes  # the newest keeps its hashes; idle old ones gave theirs up
    assert b.counters.hashes_dropped > 0
    for st in states:
        b.book.set_hashes(st, [])
    assert b.book.hash_refs == 0 and b.book.hashes_interned == 0


# -- finding 5: priority is an offset inside a band --------------------------------------
@pytest.mark.parametrize(
    ("own", "advised"), [(8, -8), (8, None), (1000, None), (1000, 8), (0, -100)]
)
def test_finding5_priority_stays_in_a_band_around_the_requests_own(
    own: int, advised: int | None
) -> None:
    b = _core(priority_bound=8)
    st = b.book.state("t", 0)
    st.attained_tokens = 10**9
    assert own - 8 <= b.assign_priority(st, advised, own) <= own + 8
    assert own - 9 == b.aged_priority(own)  # aging: just ahead of its band, no further


def test_finding5_aging_never_crosses_tiers() -> None:
    b = _core(priority_bound=8)
    batch_aged = b.aged_priority(1000)
    interactive = b.assign_priority(None, 8, 0)  # the worst an interactive request gets
    assert batch_aged > interactive


# -- finding 14 (server side): observe and shadow change nothing --------------------------
def test_finding14_a_passive_mode_hint_is_marked_and_garbage_is_rejected() -> None:
    for mode in ("observe", "shadow"):
        hint = decode_hint({"agentkv_trajectoryId": "t", "agentkv_mode": mode})
        assert hint is not None and hint.passive
    active = decode_hint({"agentkv_trajectoryId": "t", "agentkv_mode": "active"})
    assert active is not None and not active.passive
    odd = decode_hint({"agentkv_trajectoryId": "t", "agentkv_mode": 3})
    assert odd is not None and odd.rejected and "mode" in odd.errors[0]  # nothing applied


# -- finding 10: control-route input -------------------------------------------------------
def test_finding10_deep_nesting_is_a_400_not_a_500() -> None:
    with pytest.raises(ControlInputError) as info:
        validate_events_body(b"[" * 100_000 + b"]" * 100_000)
    assert info.value.status == 400


class _Body:
    def __init__(self, chunks: list[bytes], headers: dict[str, str]) -> None:
        self.chunks, self.headers, self.read = chunks, headers, 0

    async def stream(self) -> Any:
        for chunk in self.chunks:
            self.read += len(chunk)
            yield chunk


def test_finding10_a_body_is_refused_before_or_while_it_is_read() -> None:
    big = _Body([b"x" * 1024] * 4096, {"content-length": str(4 << 20)})
    with pytest.raises(ControlInputError) as info:
        asyncio.run(read_body(big, max_bytes=1 << 20))
    assert info.value.status == 413 and big.read == 0  # refused on the header alone
    chunked = _Body([b"x" * 1024] * 4096, {})  # no Content-Length: counted while read
    with pytest.raises(ControlInputError):
        asyncio.run(read_body(chunked, max_bytes=1 << 20))
    assert chunked.read <= (1 << 20) + 1024
    with pytest.raises(ControlInputError) as info:
        asyncio.run(read_body(_Body([], {"content-length": "12x"})))
    assert info.value.status == 400
    assert asyncio.run(read_body(_Body([b"{}"], {"content-length": "2"}))) == b"{}"


def test_finding2_events_carry_their_scope_and_bad_salts_are_refused() -> None:
    body = {"events": [
        {"trajectoryId": "t", "event": "trajectory_finished", wire.EVENT_SALT_FIELD: "salt-a"},
        {"trajectoryId": "t", "event": "trajectory_finished"},
        {"trajectoryId": "t", "event": "trajectory_finished", wire.EVENT_SALT_FIELD: "a/b"},
        {"trajectoryId": "t", "event": "trajectory_finished", wire.EVENT_MODE_FIELD: "loud"},
        {"trajectoryId": "t", "event": "tool_started", wire.EVENT_MODE_FIELD: "observe"},
    ]}  # fmt: skip
    good, bad = validate_events_body(json.dumps(body).encode(), default_salt="salt-h")
    assert [g["cache_salt"] for g in good] == ["salt-a", "salt-h", "salt-h"]
    assert good[2]["mode"] == "observe" and [r["index"] for r in bad] == [2, 3]
    assert not wire.valid_salt("x" * 129) and wire.valid_salt("x" * 128)


def test_finding10_a_trajectory_id_in_the_path_is_unquoted_once() -> None:
    from agentkv.vllm._control import PREFIX, route_of

    def req(raw: bytes) -> SimpleNamespace:
        return SimpleNamespace(scope={"raw_path": raw, "path": "ignored", "root_path": ""})

    assert route_of(req(PREFIX.encode() + b"trajectories/a%2541")) == "trajectories/a%41"
    assert route_of(req(PREFIX.encode() + b"trajectories/a%2Fb")) == "trajectories/a/b"
    with pytest.raises(ControlInputError):
        route_of(req(PREFIX.encode() + b"trajectories/%FF"))


def _sybil_cap(grouped: bool) -> PolicyCore[int]:
    """Four salts of one attacking source fill the 80-block retained cap, 20 blocks each."""
    b = _core(retention="hint", max_retained_fraction=0.8, tenant_retained_share=0.5)
    for i in range(4):
        st = b.book.state(f"a{i}", 0, tenant=f"salt-{i}")
        if grouped:
            b.book.set_group(f"salt-{i}", "src:attacker")
        b.book.set_lease(st, list(range(i * 20, i * 20 + 20)), 60_000, 0)
    assert b.book.retained_blocks == 80
    return b


def test_many_salts_of_one_source_share_one_part_of_the_retained_cap() -> None:
    """Finding (issue 31): shares were counted per salt, so a source holding leases under
    k salts took k parts and left a victim 1/(k+1) of the cap. Grouped by source, the
    attacker's salts divide one part and the victim keeps the other: 40 blocks, not 16."""
    b = _sybil_cap(grouped=True)
    victim = b.book.state("v", 0, tenant="victim")
    b.book.set_group("victim", "src:victim")
    assert b.book.share_for("victim") == 40
    assert b.plan_lease(victim, 40, 0) == 40
    assert sum(b.book.tenant_retained(f"salt-{i}") for i in range(4)) == 40
    assert b.book.tenant_share == 40  # a one-tenant source's part
    ungrouped = _sybil_cap(grouped=False)  # no source known: each salt its own source
    lone = ungrouped.book.state("v", 0, tenant="victim")
    assert ungrouped.book.share_for("victim") == 16 and ungrouped.plan_lease(lone, 40, 0) == 16


def test_one_source_with_many_tenants_shares_as_before() -> None:
    """A gateway or a shared key is one source: its tenants divide the cap among
    themselves exactly as without sources."""
    b = _sybil_cap(grouped=True)
    victim = b.book.state("v", 0, tenant="victim")
    b.book.set_group("victim", "src:attacker")
    assert b.book.share_for("victim") == 16 and b.plan_lease(victim, 40, 0) == 16


def test_a_tenant_forgotten_forgets_its_source() -> None:
    b = _core(max_trajectories=2)
    b.book.state("x", 0, tenant="t")
    b.book.set_group("t", "src:s")
    b.book.set_group("unknown", "src:s")  # no tracked trajectory: not kept
    b.book.state("y", 1, tenant="u")
    b.book.state("z", 2, tenant="u")  # the bound forgets x, and t with it
    assert b.book._groups == {}


def test_pressure_takes_from_a_source_over_its_share_before_a_victim_due_first() -> None:
    """The pressure order reads shares per source too: four salts of one source, each
    under the one-tenant part (20 of 40 blocks) but together twice their source's part,
    give way before another source's lease, even one whose deadline comes first."""
    b = _sybil_cap(grouped=True)
    victim = b.book.state("v", 0, tenant="victim")
    b.book.set_group("victim", "src:victim")
    b.book.set_lease(victim, list(range(100, 110)), 1_000, 0)  # due first
    assert b.book.tenants_over_share() == {f"salt-{i}" for i in range(4)}
    first = b.next_victim(None, 0.5)
    assert first is not None and first.tenant.startswith("salt-")
    b.book.end_lease(b.book.state("a0", 0), "released")  # 60 of 80: 3 salts x 20
    b.book.end_lease(b.book.state("a1", 0), "released")  # 40: within the source's part
    assert b.book.tenants_over_share() == set()
    picked = b.next_victim(None, 0.5)
    assert picked is not None and picked.tenant == "victim"  # the deadline order again
