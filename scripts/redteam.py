"""Hostile clients against a real agentkv server: every server-side attack of issue 13.

Each attack plays an attacker against a victim and measures the victim's cached prompt
tokens before the attack (what its resumed turn would reuse: its full cached blocks)
and after it (what its next turn actually reused, after filler traffic that evicts
whatever the attack left unprotected), and whether the engine still serves. Prints a
Markdown table (and ``--json`` writes the rows).

    python scripts/redteam.py                       # starts a server on the tiny model
    python scripts/redteam.py --base-url http://127.0.0.1:8000 --api-key KEY [--model M]

Without ``--base-url`` the server is the test suite's hostile-client configuration: the
tiny local model, block size 32, 63 usable blocks, an API key, and a 4 s lease lifetime
(``AGENTKV_SCHED_MAX_LEASE_LIFETIME_MS``); it needs vLLM (``pip install agentkv-cache[cpu]``)
and takes a minute or two to start on a small CPU. Attacks against another server
assume the same pool size; their numbers then only indicate.
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
SERVER_OPTIONS: dict[str, Any] = {
    "block_size": 32,
    "num_gpu_blocks_override": 64,
    "max_model_len": 2000,
    "enforce_eager": True,
    "kv_cache_memory_gib": 1,
    "max_num_seqs": 16,
    # Every attack here shares the one API key, so the control route's per-caller limit
    # would answer the measurements themselves with 429: off, as on the test servers.
    "control_rate_per_s": 0,
    "api_key": API_KEY,
    "extra_env": {"AGENTKV_SCHED_MAX_LEASE_LIFETIME_MS": "4000"},
}
BLOCK = 32


def tokens(seed: int, n: int) -> list[int]:
    """``n`` pseudo-random token ids (no two seeds share a prefix)."""
    rng = random.Random(seed)
    return [rng.randrange(20, 1500) for _ in range(n)]


class Tenant:
    """One client of the server: its cache salt (None: unsalted) and its connection."""

    def __init__(self, base_url: str, model: str, salt: str | None, key: str | None) -> None:
        self.model, self.salt = model, salt
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=base_url, timeout=300, headers=headers)

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
    return {"agentkv_trajectoryId": tid, "agentkv_action": "retain", "agentkv_ttlMs": ttl_ms, **extra}


@dataclass
class Row:
    """One attack's outcome."""

    finding: str
    attack: str
    victim_before: int | None  # cached tokens the victim's resumed turn would reuse
    victim_after: int | None  # cached tokens it did reuse after the attack
    engine_alive: bool = True
    result: str = ""


class RedTeam:
    """The attacks, each a method returning a :class:`Row`."""

    def __init__(self, base_url: str, model: str, key: str | None) -> None:
        self.base_url, self.model, self.key = base_url, model, key
        self._made: list[Tenant] = []

    def tenant(self, salt: str | None) -> Tenant:
        self._made.append(Tenant(self.base_url, self.model, salt, self.key))
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
        while time.monotonic() - started < 7.0:
            t.events("forever", "tool_started", advice={"action": "retain", "ttlMs": 600_000})
            if ended_at is None and t.traj("forever").json()["leased_blocks"] == 0:
                ended_at = time.monotonic() - started
            time.sleep(0.5)
        t.events("forever", "trajectory_finished")
        when = f"lease ended at {ended_at:.1f} s" if ended_at else "lease still held at 7 s"
        return Row("4", "re-send retain every 0.5 s to hold a lease forever", None, None,
                   result=when)  # fmt: skip

    # -- finding 5 ------------------------------------------------------------------
    def priority_band(self) -> Row:
        t = self.tenant("rt-p5")
        t.complete(tokens(81, 40), {"agentkv_trajectoryId": "gw", "agentkv_priority": -8}, priority=8)
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

    def attacks(self) -> list[Callable[[], Row]]:
        return [self.read_other_tenant, self.release_other_tenant, self.same_id_two_tenants,
                self.flush_popular_prefix, self.event_flood, self.fill_retained_cap,
                self.retain_forever, self.priority_band, self.metrics_flood,
                self.late_turn_after_cancel, self.equal_prompts, self.control_input,
                self.observe_mode]  # fmt: skip

    def run(self) -> list[Row]:
        rows = []
        for attack in self.attacks():
            try:
                row = attack()
            except Exception as exc:  # an attack that breaks the script is a finding too
                row = Row("?", attack.__name__, None, None, result=f"error: {exc!r}")
            row.engine_alive = self.alive()
            rows.append(row)
            print(f"  {row.attack}: {row.result}", file=sys.stderr)
        return rows


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""

    def cell(v: int | None) -> str:
        return "—" if v is None else str(v)

    out = ["| finding | attack | victim cached before | victim cached after | engine alive "
           "| result |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        alive = "yes" if r.engine_alive else "NO"
        out.append(f"| {r.finding} | {r.attack} | {cell(r.victim_before)} | "
                   f"{cell(r.victim_after)} | {alive} | {r.result} |")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run every attack and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="an agentkv server to attack (default: start one)")
    ap.add_argument("--api-key", default=None, help="its API key")
    ap.add_argument("--model", default=None, help="its served model name")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    server = None
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
    team = RedTeam(base_url, model, key)
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
