"""Hostile clients against a real agentkv server: the server-side attacks of issues 13 and 31.

Each attack plays an attacker against a victim and measures the victim's cached prompt
tokens before the attack (what its resumed turn would reuse: its full cached blocks)
and after it (what its next turn actually reused, after filler traffic that evicts
whatever the attack left unprotected), whether the engine still serves, and how many
answers were 5xx. Prints a Markdown table (and ``--json`` writes the rows). Findings of
issue 31 that live only in the client process (conversation tables, probes, sinks, the
router's command line) are listed with the tests that check them.

    python scripts/redteam.py                       # starts a server on the tiny model
    python scripts/redteam.py --base-url http://127.0.0.1:8000 --api-key KEY \\
        [--attacker-key KEY2] [--model M]

Without ``--base-url`` the server is the test suite's hostile-client configuration: the
tiny local model, block size 32, 63 usable blocks, two API keys (the victims' and the
attacker's: two sources), a 4 s lease lifetime (``AGENTKV_SCHED_MAX_LEASE_LIFETIME_MS``)
and a global bound of 128 tracked trajectories; it runs vLLM's default compiled CPU path
(no ``enforce_eager``: its CPU worker dies with SIGILL on AVX-512/AMX hosts), needs vLLM
(``pip install agentkv-cache[cpu]``) and takes a few minutes to start on a small CPU. Attacks
against another server assume the same pool size; their numbers then only indicate, and
with one key for everybody the attacker is the victims' source (the per-source rows then
show the shared-key limit). The policy-mode row switches the server to ``shadow`` and
back to ``act``.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from agentkv.protocol._wire import EVENT_SALT_FIELD, SALT_HEADER
from agentkv.vllm._control import STATS_MAX_AGE_S

API_KEY = "agentkv-redteam-key"
ATTACKER_KEY = "agentkv-redteam-attacker-key"
SERVER_OPTIONS: dict[str, Any] = {
    "block_size": 32,
    "num_gpu_blocks_override": 64,
    "max_model_len": 2000,
    # Not enforce_eager: its CPU worker dies with SIGILL on AVX-512/AMX hosts.
    "kv_cache_memory_gib": 1,
    "max_num_seqs": 16,
    # The victims' key and the attacker's: two sources (bearer tokens) for the salt gate.
    "api_key": API_KEY,
    "extra_args": ["--api-key", API_KEY, ATTACKER_KEY],
    # The control route's limit (the defaults: 100 at once, 50 a second) is per key; the
    # victims' measurements stay under it, the attacker's flood (its own key) does not.
    "control_burst": 100,
    "control_rate_per_s": 50.0,
    "extra_env": {
        "AGENTKV_SCHED_MAX_LEASE_LIFETIME_MS": "12000",
        "AGENTKV_SCHED_MAX_TRAJECTORIES": "128",
    },
}
BLOCK = 32


def tokens(seed: int, n: int) -> list[int]:
    """``n`` pseudo-random token ids (no two seeds share a prefix)."""
    rng = random.Random(seed)
    return [rng.randrange(20, 1500) for _ in range(n)]


class Errors:
    """Answers with a 5xx status, counted over every connection of the run."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def hook(self, response: httpx.Response) -> None:
        """httpx response hook."""
        if response.status_code >= 500:
            with self._lock:
                self.count += 1


class Tenant:
    """One client of the server: its cache salt (None: unsalted) and its connection."""

    def __init__(
        self,
        base_url: str,
        model: str,
        salt: str | None,
        key: str | None,
        errors: Errors | None = None,
    ) -> None:
        self.model, self.salt = model, salt
        self.errors = errors if errors is not None else Errors()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=base_url, timeout=300, headers=headers,
                                 event_hooks={"response": [self.errors.hook]})  # fmt: skip

    def complete(self, prompt: list[int], xargs: dict[str, Any] | None = None, **body: Any) -> int:
        """Send one completion; returns its cached prompt tokens."""
        payload: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            **body,
        }
        if self.salt is not None:
            payload["cache_salt"] = self.salt
        if xargs:
            payload["vllm_xargs"] = xargs
        r = self.http.post("/v1/completions", json=payload)
        r.raise_for_status()
        details = r.json()["usage"].get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)

    def traj(self, tid: str, salt: str | None = None) -> httpx.Response:
        """``GET /agentkv/v1/trajectories/{tid}`` in this tenant's scope (or ``salt``'s)."""
        salt = self.salt if salt is None else salt
        headers = {SALT_HEADER: salt} if salt else {}
        return self.http.get(f"/agentkv/v1/trajectories/{tid}", headers=headers)

    def cached_tokens(self, tid: str) -> int:
        """What the trajectory's next turn would reuse now (its full cached blocks)."""
        r = self.traj(tid)
        return int(r.json()["cached_blocks"]) * BLOCK if r.status_code == 200 else 0

    def events(self, tid: str, kind: str, **extra: Any) -> dict[str, Any]:
        """Post one lifecycle event in this tenant's scope."""
        ev: dict[str, Any] = {"trajectoryId": tid, "event": kind, **extra}
        if self.salt is not None:
            ev.setdefault(EVENT_SALT_FIELD, self.salt)
        r = self.http.post("/agentkv/v1/events", json={"events": [ev]})
        r.raise_for_status()
        return dict(r.json())

    def stats(self, fresh: bool = True) -> dict[str, Any]:
        """The plugin's counters. The route serves a snapshot up to a second old, so a
        ``fresh`` read first waits for it to expire."""
        if fresh:
            time.sleep(STATS_MAX_AGE_S + 0.1)
        return dict(self.http.get("/agentkv/v1/stats").json())

    def filler(self, seed: int, sizes: list[int]) -> None:
        """Unrelated traffic that evicts what nothing protects."""
        for i, n in enumerate(sizes):
            self.complete(tokens(seed * 100 + i, n))

    def close(self) -> None:
        """Close the connection."""
        self.http.close()


def retain(tid: str, ttl_ms: int = 120_000, **extra: Any) -> dict[str, Any]:
    """``vllm_xargs`` advising ``retain`` for ``tid``."""
    return {
        "agentkv_trajectoryId": tid,
        "agentkv_action": "retain",
        "agentkv_ttlMs": ttl_ms,
        **extra,
    }


@dataclass
class Row:
    """One attack's outcome."""

    finding: str
    attack: str
    victim_before: int | None  # cached tokens the victim's resumed turn would reuse
    victim_after: int | None  # cached tokens it did reuse after the attack
    engine_alive: bool = True
    result: str = ""
    errors_5xx: int = 0  # answers with a 5xx status during the attack


class RedTeam:
    """The attacks, each a method returning a :class:`Row`."""

    def __init__(
        self, base_url: str, model: str, key: str | None, attacker_key: str | None = None
    ) -> None:
        self.base_url, self.model, self.key = base_url, model, key
        self.attacker_key = attacker_key or key
        self.errors = Errors()
        self._made: list[Tenant] = []

    def tenant(self, salt: str | None, *, attacker: bool = False) -> Tenant:
        key = self.attacker_key if attacker else self.key
        self._made.append(Tenant(self.base_url, self.model, salt, key, self.errors))
        return self._made[-1]

    def alive(self) -> bool:
        try:
            ok = httpx.get(self.base_url + "/health", timeout=30).status_code == 200
            return ok and self.tenant(None).complete(tokens(99, 8)) >= 0
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        for t in self._made:
            t.close()

    # -- finding 2 ------------------------------------------------------------------
    def read_other_tenant(self) -> Row:
        a, b = self.tenant("rt-a1"), self.tenant("rt-b1")
        prompt = tokens(11, 600)
        a.complete(prompt, retain("shared"))
        before = a.cached_tokens("shared")
        statuses = {b.traj("shared").status_code, self.tenant(None).traj("shared").status_code}
        a.filler(12, [700, 700])
        after = a.complete([*prompt, *tokens(13, 20)])
        a.events("shared", "trajectory_finished")
        return Row("2", "read another tenant's trajectory (GET, other salt / none)", before,
                   after, result=f"HTTP {sorted(statuses)}")  # fmt: skip

    def release_other_tenant(self) -> Row:
        a, b = self.tenant("rt-a2"), self.tenant("rt-b2")
        prompt = tokens(21, 600)
        a.complete(prompt, retain("shared"))
        before = a.cached_tokens("shared")
        accepted = b.events("shared", "trajectory_finished")["accepted"]
        accepted += self.tenant(None).events("shared", "trajectory_finished")["accepted"]
        a.filler(22, [700, 700])
        after = a.complete([*prompt, *tokens(23, 20)])
        a.events("shared", "trajectory_finished")
        return Row("2", "post trajectory_finished for another tenant's id", before, after,
                   result=f"{accepted} of 2 events accepted")  # fmt: skip

    def same_id_two_tenants(self) -> Row:
        a, b = self.tenant("rt-a3"), self.tenant("rt-b3")
        prompt = tokens(31, 600)
        a.complete(prompt, retain("1"))
        before = a.cached_tokens("1")
        b.complete(tokens(32, 300), retain("1"))  # LangGraph's thread "1" in tenant B
        a.filler(33, [700, 700])
        after = a.complete([*prompt, *tokens(34, 20)])
        for t in (a, b):
            t.events("1", "trajectory_finished")
        return Row("2", 'the same trajectory id ("1") in two tenants', before, after,
                   result="two states")  # fmt: skip

    # -- finding 3 ------------------------------------------------------------------
    def flush_popular_prefix(self) -> Row:
        victim, attacker = self.tenant(None), self.tenant(None)
        popular = tokens(41, 640)
        victim.complete(popular)
        demoted = victim.stats()["blocks_demoted"]
        attacker.complete([*popular, *tokens(42, 20)], {"agentkv_trajectoryId": "flush",
                                                        "agentkv_action": "release"})  # fmt: skip
        demoted = victim.stats()["blocks_demoted"] - demoted
        victim.filler(43, [1200])
        after = victim.complete([*popular, *tokens(44, 20)])
        return Row("3", "release a popular prompt it only hit in the cache", 640, after,
                   result=f"{demoted} blocks demoted")  # fmt: skip

    # -- finding 4 ------------------------------------------------------------------
    def event_flood(self) -> Row:
        victim, attacker = self.tenant("rt-v4"), self.tenant("rt-x4")
        prompt = tokens(51, 600)
        victim.complete(prompt, retain("victim"))
        before = victim.cached_tokens("victim")
        tracked = victim.stats()["trajectories_tracked"]
        rng, accepted = random.Random(5), 0
        for i in range(16):
            scope = {EVENT_SALT_FIELD: "rt-v4"} if i % 2 else {}
            batch = [{"trajectoryId": f"flood-{rng.getrandbits(64):x}", "event": "tool_started",
                      "advice": {"action": "retain", "ttlMs": 600_000}, **scope}
                     for _ in range(256)]  # fmt: skip
            r = attacker.http.post("/agentkv/v1/events", json={"events": batch})
            accepted += int(r.json().get("accepted", 0))
        grown = victim.stats()["trajectories_tracked"] - tracked
        attacker.filler(52, [700, 700])
        after = victim.complete([*prompt, *tokens(53, 20)])
        victim.events("victim", "trajectory_finished")
        return Row("4", "16 posts of 256 random ids (retain)", before, after,
                   result=f"{accepted} accepted, {grown} new states")  # fmt: skip

    def fill_retained_cap(self) -> Row:
        victim, attacker = self.tenant("rt-v5"), self.tenant("rt-x5")
        for i in range(5):
            attacker.complete(tokens(60 + i, 600), retain(f"hog-{i}"))
        prompt = tokens(66, 600)
        victim.complete(prompt, retain("victim"))
        before = victim.cached_tokens("victim")
        leased = victim.traj("victim").json()["leased_blocks"]
        attacker.filler(67, [400])  # pressure the attacker's excess over its share covers
        after = victim.complete([*prompt, *tokens(68, 20)])
        for i in range(5):
            attacker.events(f"hog-{i}", "trajectory_finished")
        victim.events("victim", "trajectory_finished")
        return Row("4", "five leases fill the retained cap, then a victim retains", before,
                   after, result=f"victim leased {leased} blocks")  # fmt: skip

    def retain_forever(self) -> Row:
        t = self.tenant("rt-l4")
        t.complete(tokens(71, 300), retain("forever", ttl_ms=600_000))
        started, ended_at = time.monotonic(), None
        while time.monotonic() - started < 15.0:
            t.events("forever", "tool_started", advice={"action": "retain", "ttlMs": 600_000})
            if ended_at is None and t.traj("forever").json()["leased_blocks"] == 0:
                ended_at = time.monotonic() - started
            time.sleep(0.5)
        t.events("forever", "trajectory_finished")
        when = f"lease ended at {ended_at:.1f} s" if ended_at else "lease still held at 15 s"
        return Row("4", "re-send retain every 0.5 s to hold a lease forever", None, None,
                   result=when)  # fmt: skip

    # -- finding 5 ------------------------------------------------------------------
    def priority_band(self) -> Row:
        t = self.tenant("rt-p5")
        t.complete(
            tokens(81, 40), {"agentkv_trajectoryId": "gw", "agentkv_priority": -8}, priority=8
        )
        t.complete(tokens(82, 40), {"agentkv_trajectoryId": "batch", "agentkv_priority": 8},
                   priority=1000)  # fmt: skip
        gw, batch = (t.traj(x).json().get("last_priority") for x in ("gw", "batch"))
        return Row("5", "gateway priority 8 with advice -8; batch 1000 with advice 8", None,
                   None, result=f"8 -> {gw}, 1000 -> {batch}")  # fmt: skip

    # -- finding 6 ------------------------------------------------------------------
    def metrics_flood(self) -> Row:
        status = httpx.get(self.base_url + "/metrics", timeout=30).status_code
        t = self.tenant(None)
        before, started = t.stats().get("control_calls"), time.monotonic()
        for _ in range(100):
            t.http.get("/metrics")
            t.http.get("/agentkv/v1/stats")
        after, took = t.stats().get("control_calls"), time.monotonic() - started
        calls = "200+ (not counted)" if before is None or after is None else after - before
        return Row("6", "200 polls of /metrics and /stats; /metrics without a key", None, None,
                   result=f"{calls} engine calls in {took:.1f} s; no key: HTTP {status}")  # fmt: skip

    # -- finding 7 ------------------------------------------------------------------
    def late_turn_after_cancel(self) -> Row:
        t = self.tenant("rt-c7")
        prompt, long_turn = tokens(91, 600), {"max_tokens": 400, "min_tokens": 400,
                                              "ignore_eos": True}  # fmt: skip
        worker = threading.Thread(
            target=t.complete, args=(prompt, retain("cancel", agentkv_turnId=0)), kwargs=long_turn
        )
        worker.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = t.traj("cancel")
            if r.status_code == 200 and r.json()["live_requests"]:
                break
            time.sleep(0.02)
        t.events("cancel", "trajectory_cancelled")
        worker.join(120)
        in_flight = t.traj("cancel").json()["leased_blocks"]
        t.complete([*prompt, *tokens(92, 20)], retain("cancel", agentkv_turnId=3))
        late = t.traj("cancel").json()["leased_blocks"]
        body = {"model": self.model, "prompt": tokens(93, 600), "stream": True,
                "cache_salt": t.salt, "vllm_xargs": retain("abort"), **long_turn}  # fmt: skip
        with t.http.stream("POST", "/v1/completions", json=body) as r:
            next(r.iter_lines())
        while t.traj("abort").json()["live_requests"] and time.monotonic() < deadline + 60:
            time.sleep(0.05)
        aborted = t.traj("abort").json()["leased_blocks"]
        t.events("abort", "trajectory_finished")
        return Row("7", "turn ends after cancel; late turn; aborted stream (leased blocks)",
                   None, None, result=f"{in_flight} / {late} / {aborted}")  # fmt: skip

    # -- finding 9 ------------------------------------------------------------------
    def equal_prompts(self) -> Row:
        t = self.tenant("rt-h9")
        before = t.stats()
        for i in range(8):
            t.complete(tokens(95, 600), {"agentkv_trajectoryId": f"hash-{i}"})
        after = t.stats()
        if "hash_refs" not in after:  # a server without interning keeps a copy each
            return Row("9", "8 trajectories on one 600-token prompt (hash memory)", None, None,
                       result="no interning counters (a hash list per trajectory)")  # fmt: skip
        refs = after["hash_refs"] - before["hash_refs"]
        kept = after["hashes_interned"] - before["hashes_interned"]
        return Row("9", "8 trajectories on one 600-token prompt (hash memory)", None, None,
                   result=f"{refs} references to {kept} interned hashes")  # fmt: skip

    # -- finding 10 -----------------------------------------------------------------
    def control_input(self) -> Row:
        t = self.tenant("rt-q10")
        host, port = self.base_url.removeprefix("http://").split(":")
        auth = f"Authorization: Bearer {self.key}\r\n" if self.key else ""
        head = (f"POST /agentkv/v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                f"\r\n{auth}Content-Length: {64 << 20}\r\n\r\n")  # fmt: skip
        started = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head.encode() + b'{"events": [')
            big = sock.recv(4096).decode("latin-1").split(" ", 2)[1]
        big_s = time.monotonic() - started
        json_type = {"Content-Type": "application/json"}
        deep = b'{"events": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
        nested = t.http.post("/agentkv/v1/events", content=deep, headers=json_type).status_code
        t.complete(tokens(96, 40), {"agentkv_trajectoryId": "x%41"})
        once = t.traj("x%2541").status_code
        plain = t.http.post("/agentkv/v1/events", content=b'{"events": []}',
                            headers={"Content-Type": "text/plain"}).status_code  # fmt: skip
        return Row("10", "64 MiB declared body; deep nesting; id x%2541; text/plain POST", None,
                   None, result=f"{big} in {big_s:.2f} s; {nested}; {once}; {plain}")  # fmt: skip

    # -- finding 14 (server side) ---------------------------------------------------
    def observe_mode(self) -> Row:
        t = self.tenant("rt-o14")
        before = t.stats()["leases_created"]
        t.complete(tokens(97, 600), retain("observer", agentkv_mode="observe",
                                           agentkv_priority=-8))  # fmt: skip
        created = t.stats()["leases_created"] - before
        status = t.traj("observer").status_code
        return Row("14", "an observe-mode client sends retain and priority -8", None, None,
                   result=f"{created} leases, trajectory HTTP {status}")  # fmt: skip

    # -- issue 31 -------------------------------------------------------------------
    def _finish(self, t: Tenant, *tids: str) -> None:
        for tid in tids:
            t.events(tid, "trajectory_finished")

    def salt_flood(self) -> Row:
        victim = self.tenant("rt31-v1")
        prompt = tokens(3101, 600)
        victim.complete(prompt, retain("victim"))
        before = victim.cached_tokens("victim")
        held = victim.traj("victim").json()["leased_blocks"]

        def flood(s: int) -> None:
            a = self.tenant(f"rt31-flood-{s}", attacker=True)
            for i in range(30):
                a.complete(tokens(3200 + s * 100 + i, 8), {"agentkv_trajectoryId": f"f{s}-{i}"})

        workers = [threading.Thread(target=flood, args=(s,)) for s in range(5)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(300)
        r = victim.traj("victim")
        leased = r.json()["leased_blocks"] if r.status_code == 200 else "forgotten"
        victim.filler(3102, [700, 700])
        after = victim.complete([*prompt, *tokens(3103, 20)])
        self._finish(victim, "victim")
        return Row("31 H3", "5 made-up salts x 30 hinted requests past the trajectory bound (128)",
                   before, after, result=f"victim lease {held} -> {leased} blocks "
                   "over the flood")  # fmt: skip

    def two_salts_at_share(self) -> Row:
        hogs = [self.tenant(f"rt31-s{i}", attacker=True) for i in range(2)]
        for i, h in enumerate(hogs):  # 22 blocks each: over a third of the 56-block cap
            h.complete(tokens(3121 + i, 704), retain(f"hog-{i}"))
        victim = self.tenant("rt31-v2")
        prompt = tokens(3125, 560)
        victim.complete(prompt, retain("victim"))
        before = victim.cached_tokens("victim")
        leased = victim.traj("victim").json()["leased_blocks"]
        hogs[0].filler(3126, [400])
        after = victim.complete([*prompt, *tokens(3127, 20)])
        for i, h in enumerate(hogs):
            self._finish(h, f"hog-{i}")
        self._finish(victim, "victim")
        return Row("31 M1", "two attacker salts fill the retained cap at their share", before,
                   after, result=f"victim leased {leased} blocks")  # fmt: skip

    def _sybil_lease(self, seed: int, victim_attacker_key: bool) -> int:
        # 4 x 11 blocks leased: the victim's 560-token prefill still fits beside them (no
        # pressure), its 17-block lease does not fit the cap's room (12): shares decide.
        hogs = [self.tenant(f"rt31-y{seed}-{i}", attacker=True) for i in range(4)]
        for i, h in enumerate(hogs):
            h.complete(tokens(seed + i, 360), retain(f"hog-{i}"))
        victim = self.tenant(f"rt31-v{seed}", attacker=victim_attacker_key)
        victim.complete(tokens(seed + 9, 560), retain("victim"))
        leased = int(victim.traj("victim").json()["leased_blocks"])
        for i, h in enumerate(hogs):
            self._finish(h, f"hog-{i}")
        self._finish(victim, "victim")
        return leased

    def sybil_source_share(self) -> Row:
        other = self._sybil_lease(3140, victim_attacker_key=False)
        same = self._sybil_lease(3160, victim_attacker_key=True)
        return Row("31 M1+", "4 salts of one source fill the retained cap, then a victim retains",
                   None, None, result=f"victim of another source leased {other} of 17 blocks; "
                   f"of the same source (a shared key) {same}")  # fmt: skip

    def aborted_skipping_turns(self) -> Row:
        victim = self.tenant("rt31-v4")
        prompt = tokens(3181, 600)
        victim.complete(prompt, retain("victim", agentkv_turnId=0))
        before = victim.cached_tokens("victim")

        def abort(k: int) -> None:
            a = self.tenant("rt31-ab", attacker=True)
            for i in range(16):
                body = {"model": self.model, "prompt": tokens(3300 + 16 * k + i, 40),
                        "stream": True, "max_tokens": 50, "cache_salt": a.salt,
                        "vllm_xargs": {"agentkv_trajectoryId": f"ab-{k}-{i}",
                                       "agentkv_turnId": 7}}  # fmt: skip
                with a.http.stream("POST", "/v1/completions", json=body) as r:
                    next(r.iter_lines())

        workers = [threading.Thread(target=abort, args=(k,)) for k in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(300)
        victim.filler(3182, [700, 700])
        after = victim.complete([*prompt, *tokens(3183, 20)], retain("victim", agentkv_turnId=1))
        self._finish(victim, "victim")
        return Row("31 M2", "64 aborted requests that skip turns (affinity rate)", before, after,
                   result="victim resumed after the aborts and filler")  # fmt: skip

    def tiny_forecast(self) -> Row:
        hogs = [self.tenant(f"rt31-f{i}", attacker=True) for i in range(2)]
        for i, h in enumerate(hogs):
            h.complete(tokens(3191 + i, 600), retain(f"hog-{i}", ttl_ms=600_000,
                                                     agentkv_predictedGapMs=1))  # fmt: skip
        victim = self.tenant("rt31-v5")
        prompt = tokens(3195, 600)
        victim.complete(prompt, retain("victim", agentkv_predictedGapMs=3000))
        before = victim.cached_tokens("victim")
        time.sleep(0.5)  # the hogs' 1 ms forecasts are long past
        hogs[0].filler(3196, [900])  # pressure: one lease must give way
        after = victim.complete([*prompt, *tokens(3197, 20)])
        for i, h in enumerate(hogs):
            self._finish(h, f"hog-{i}")
        self._finish(victim, "victim")
        return Row("31 M3", "two leases forecast back in 1 ms, then pressure", before, after,
                   result="victim resumed after the pressure")  # fmt: skip

    def crashed_client_ttl(self) -> Row:
        t = self.tenant("rt31-t6")
        t.complete(tokens(3201, 300), retain("crashed", ttl_ms=2000))
        left = t.traj("crashed").json()["lease_expires_in_ms"]
        self._finish(t, "crashed")
        return Row("31 M4", "a client advises ttlMs 2000 and never comes back", None, None,
                   result=f"lease expires in {left} ms")  # fmt: skip

    def client_priority(self) -> Row:
        t = self.tenant("rt31-p7")
        before = t.stats()["priorities_clamped"]
        t.complete(tokens(3211, 40), {"agentkv_trajectoryId": "prio"}, priority=-(2**62))
        runs_as = t.traj("prio").json().get("last_priority")
        clamped = t.stats()["priorities_clamped"] - before
        self._finish(t, "prio")
        return Row("31 M5", "a request's own priority -2**62", None, None,
                   result=f"runs as {runs_as}; {clamped} clamped")  # fmt: skip

    def guessed_salt(self) -> Row:
        import openai

        import agentkv
        from agentkv.client._lifecycle import get_channel
        from agentkv.prefix._namespace import CacheNamespace

        raw = openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.key or "-", max_retries=0)
        client = agentkv.wrap_openai(raw)
        prompt = tokens(3221, 400)
        with agentkv.trajectory("guess", tenant="acme"):
            client.completions.create(model=self.model, prompt=prompt, max_tokens=1, temperature=0)
        get_channel().flush(5)
        raw.close()
        public = CacheNamespace().cache_salt("acme")  # what anyone can compute from the name
        got = self.tenant(public, attacker=True).complete([*prompt, *tokens(3222, 20)])
        return Row("31 M6", "guess a tenant's salt from its name, send its prompt", None, None,
                   result=f"{got} of 384 guessed-prefix tokens came back cached")  # fmt: skip

    def two_tenants_one_id(self) -> Row:
        import openai

        import agentkv
        from agentkv.client._lifecycle import get_channel

        raw = openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.key or "-", max_retries=0)
        client = agentkv.wrap_openai(raw)
        pa, pb = tokens(3231, 600), tokens(3232, 600)
        b_ready, a_done, out = threading.Event(), threading.Event(), {}

        def cached(r: Any) -> int:
            details = getattr(r.usage, "prompt_tokens_details", None)
            return int(getattr(details, "cached_tokens", 0) or 0)

        def run_b() -> None:
            with agentkv.trajectory("job-1", tenant="rt31-b"):
                client.completions.create(model=self.model, prompt=pb, max_tokens=1, temperature=0)
                b_ready.set()
                a_done.wait(120)
                r = client.completions.create(model=self.model, prompt=[*pb, *tokens(3233, 20)],
                                              max_tokens=1, temperature=0)  # fmt: skip
                out["after"] = cached(r)

        worker = threading.Thread(target=run_b)
        worker.start()
        b_ready.wait(120)
        route = get_channel().route("job-1", "rt31-b")
        b = self.tenant(route.cache_salt if route is not None else None)
        before = b.cached_tokens("job-1")
        with agentkv.trajectory("job-1", tenant="rt31-a"):
            client.completions.create(model=self.model, prompt=pa, max_tokens=1, temperature=0)
        get_channel().flush(5)  # A's trajectory_finished is posted
        leased = b.traj("job-1").json().get("leased_blocks")
        a_done.set()
        worker.join(120)
        get_channel().flush(5)
        raw.close()
        return Row("31 H2", 'two tenants of one process run "job-1"; A ends first', before,
                   out.get("after"), result=f"B's lease after A's end: {leased} blocks")  # fmt: skip

    def control_flood(self) -> Row:
        victim = self.tenant(None)

        def turn_ms() -> float:
            started = time.monotonic()
            victim.complete(tokens(3241, 40), max_tokens=16, min_tokens=16, ignore_eos=True)
            return (time.monotonic() - started) * 1000

        quiet = sorted(turn_ms() for _ in range(3))[1]
        counts: dict[int, int] = {}
        lock = threading.Lock()

        def post(k: int) -> None:
            a = self.tenant(f"rt31-c{k}", attacker=True)
            rng = random.Random(k)
            for _ in range(100):
                batch = [{"trajectoryId": f"c-{rng.getrandbits(48):x}", "event": "tool_started"}
                         for _ in range(256)]  # fmt: skip
                code = a.http.post("/agentkv/v1/events", json={"events": batch}).status_code
                with lock:
                    counts[code] = counts.get(code, 0) + 1

        workers = [threading.Thread(target=post, args=(k,)) for k in range(8)]
        for w in workers:
            w.start()
        during = sorted(turn_ms() for _ in range(3))[1]
        for w in workers:
            w.join(300)
        time.sleep(3.0)  # the attacker's bucket refills before the next row
        return Row("31 M9", "8 posters of 256-event batches (800 posts) on the control route",
                   None, None, result=f"{counts.get(200, 0)} reached the engine, "
                   f"{counts.get(429, 0)} answered 429; victim 16-token turn {quiet:.0f} -> "
                   f"{during:.0f} ms")  # fmt: skip

    def huge_numbers(self) -> Row:
        t = self.tenant("rt31-n1")
        before = t.stats()["internal_errors"]
        codes, refused = [], 0
        for number in (b"1e400", b"-1e400"):
            body = b'{"events": [{"trajectoryId": "x", "event": "tool_started", "emittedAtMs": '
            r = t.http.post("/agentkv/v1/events", content=body + number + b"}]}",
                            headers={"Content-Type": "application/json"})  # fmt: skip
            codes.append(r.status_code)
            refused += len(r.json().get("rejected", [])) if r.status_code == 200 else 0
        internal = t.stats()["internal_errors"] - before
        return Row("31 L1", "emittedAtMs = +-10**400", None, None,
                   result=f"HTTP {codes}, {refused} of 2 events rejected; {internal} internal "
                   "errors")  # fmt: skip

    def deep_hint(self) -> Row:
        t = self.tenant("rt31-n2")
        before = t.stats()
        deep = '{"actions": [{"action_type": "retain", "payload": {"trajectoryId": "deep", "x": '
        t.complete(tokens(3251, 40), {"agentkv_hints": deep + "[" * 3000 + "]" * 3000 + "}}]}"})
        after = t.stats()
        errors = after["hint_errors"] - before["hint_errors"]
        internal = after["internal_errors"] - before["internal_errors"]
        return Row("31 L2", "agentkv_hints nested 3,000 deep", None, None,
                   result=f"{errors} hint rejected, {internal} internal errors")  # fmt: skip

    def retried_turn_zero(self) -> Row:
        t = self.tenant("rt31-z1")
        prompt = tokens(3261, 300)
        t.complete(prompt, retain("tomb", agentkv_turnId=0))
        t.events("tomb", "trajectory_finished")
        t.complete(prompt, retain("tomb", agentkv_turnId=0))  # a retry of the ended run
        leased = t.traj("tomb").json()["leased_blocks"]
        return Row("31 L6", "turn 0 retried after trajectory_finished", None, None,
                   result=f"{leased} blocks leased")  # fmt: skip

    def policy_mode(self) -> Row:
        t = self.tenant("rt31-m1")
        switch = {"Content-Type": "application/json"}
        shadow = t.http.post("/agentkv/v1/mode", json={"mode": "shadow"}, headers=switch)
        try:
            t.complete(tokens(3271, 600), retain("shadowed"))
            answer = t.traj("shadowed").json()
        finally:
            back = t.http.post("/agentkv/v1/mode", json={"mode": "act"}, headers=switch)
        stranger = httpx.post(self.base_url + "/agentkv/v1/mode", json={"mode": "off"},
                              timeout=30).status_code  # fmt: skip
        return Row("31 R1", "shadow the policy at run time, then back; a switch without the key",
                   None, None, result=f"shadow {shadow.status_code}: leased "
                   f"{answer.get('leased_blocks')}, shadow-leased {answer.get('shadow_leased_blocks')}; "
                   f"act {back.status_code}; no key: HTTP {stranger}")  # fmt: skip

    def hint_outcomes(self) -> Row:
        t = self.tenant("rt31-o1")
        prompt = tokens(3281, 600)
        t.complete(prompt, retain("o", agentkv_turnId=0))
        t.complete([*prompt, *tokens(3282, 20)], retain("o", agentkv_turnId=1))
        t.complete(tokens(3283, 40), {"agentkv_trajectoryId": "o-bad", "agentkv_ttlMs": -5})
        t.complete(
            tokens(3284, 40), {"agentkv_trajectoryId": "o-pre", "agentkv_action": "prefetch"}
        )
        scope = {SALT_HEADER: t.salt or ""}
        phases = []
        for tid in ("o", "o-bad", "o-pre"):
            r = t.http.get(f"/agentkv/v1/outcomes/{tid}", headers=scope)
            turns = r.json().get("turns", []) if r.status_code == 200 else []
            phases += [f"{x['verdict']}/{x['result'] or '-'}" for x in turns]
        other = t.http.get("/agentkv/v1/outcomes/o", headers={SALT_HEADER: "rt31-else"})
        self._finish(t, "o")
        return Row("31 R2", "ask what became of each hint (two phases); another scope asks",
                   None, None, result=f"{', '.join(phases)}; other scope HTTP "
                   f"{other.status_code}")  # fmt: skip

    def attacks(self) -> list[Callable[[], Row]]:
        return [self.read_other_tenant, self.release_other_tenant, self.same_id_two_tenants,
                self.flush_popular_prefix, self.event_flood, self.fill_retained_cap,
                self.retain_forever, self.priority_band, self.metrics_flood,
                self.late_turn_after_cancel, self.equal_prompts, self.control_input,
                self.observe_mode,
                self.salt_flood, self.two_salts_at_share, self.sybil_source_share,
                self.aborted_skipping_turns, self.tiny_forecast, self.crashed_client_ttl,
                self.client_priority, self.guessed_salt, self.two_tenants_one_id,
                self.huge_numbers, self.deep_hint, self.retried_turn_zero, self.hint_outcomes,
                self.policy_mode, self.control_flood]  # fmt: skip

    def run(self) -> list[Row]:
        rows = []
        for attack in self.attacks():
            errors = self.errors.count
            try:
                row = attack()
            except Exception as exc:  # an attack that breaks the script is a finding too
                row = Row("?", attack.__name__, None, None, result=f"error: {exc!r}")
            row.errors_5xx = self.errors.count - errors
            row.engine_alive = self.alive()
            rows.append(row)
            print(f"  {row.attack}: {row.result}", file=sys.stderr)
        return rows


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""

    def cell(v: int | None) -> str:
        return "—" if v is None else str(v)

    out = ["| finding | attack | victim cached before | victim cached after | engine alive "
           "| 5xx | result |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        alive = "yes" if r.engine_alive else "NO"
        out.append(f"| {r.finding} | {r.attack} | {cell(r.victim_before)} | "
                   f"{cell(r.victim_after)} | {alive} | {r.errors_5xx} | {r.result} |")  # fmt: skip
    out.append("")
    out.append("Client-side findings of issue 31 (no server figure; each has its test):")
    for finding, what, test in CLIENT_SIDE:
        out.append(f"- {finding} {what}: `{test}`")
    return "\n".join(out)


#: Findings of issue 31 that live in the client process, and the test that checks each.
CLIENT_SIDE = [
    ("31 H1", "one process, two tenants, one LangGraph thread id",
     "tests/unit/integrations/test_conversations.py::"
     "test_two_tenants_with_one_thread_id_are_two_conversations"),
    ("31 M7", "vllm-router's API key on its command line",
     "tests/server/test_vllm_replicas.py::test_the_routers_api_key_never_shows_on_its_command_line"),
    ("31 M8", "a slow capabilities answer costs every call two probes",
     "tests/unit/client/test_tenancy.py::"
     "test_a_slow_server_costs_one_call_the_patient_wait_not_every_call"),
    ("31 M10", "router session keys are raw trajectory ids",
     "tests/unit/client/test_session_scope.py::"
     "test_two_tenants_with_one_trajectory_id_have_two_session_keys"),
    ("31 L3", "the first model call opens the whole gap store",
     "tests/unit/gaps/test_store.py::"
     "test_a_store_opened_in_the_background_never_holds_up_the_caller"),
    ("31 L4", "JsonlSink(max_bytes) overshoots by a batch",
     "tests/unit/events/test_sinks.py::test_max_bytes_holds_for_a_batch_larger_than_the_bound"),
    ("31 L5", "--host 0.0.0.0 without --api-key gives no warning",
     "tests/unit/vllm/test_offload.py::test_a_public_bind_without_an_api_key_is_warned_about"),
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run every attack and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="an agentkv server to attack (default: start one)")
    ap.add_argument("--api-key", default=None, help="its API key")
    ap.add_argument("--attacker-key", default=None,
                    help="another API key of the server, for the attacker (default: --api-key)")  # fmt: skip
    ap.add_argument("--model", default=None, help="its served model name")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    server = None
    attacker_key = args.attacker_key
    if args.base_url:
        base_url, key = args.base_url.rstrip("/"), args.api_key
        model = (
            args.model
            or httpx.get(
                base_url + "/v1/models",
                headers={"Authorization": f"Bearer {key}"} if key else {},
                timeout=30,
            ).json()["data"][0]["id"]
        )
    else:
        import agentkv

        server = agentkv.serve(**SERVER_OPTIONS)
        base_url, key, model = server.base_url, API_KEY, server.model
        attacker_key = ATTACKER_KEY
    team = RedTeam(base_url, model, key, attacker_key)
    try:
        rows = team.run()
    finally:
        team.close()
        if server is not None:
            server.stop()
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([asdict(r) for r in rows], fh, indent=2)
    return 0 if all(r.engine_alive for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
