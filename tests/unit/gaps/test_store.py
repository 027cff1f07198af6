"""The gap store: persistence, merging across processes, crashes, corrupt and foreign files."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from agentkv import GapModel
from agentkv.gaps._model import ALL_TOOLS
from agentkv.gaps._store import APPLICATION_ID, SCHEMA_VERSION, GapStore, default_store_path

NOW = 1_800_000_000.0


def _counts(path: Path, namespace: str = "default") -> dict[tuple[str, str], int]:
    with GapStore(path) as store:
        return {r.key: r.n for r in store.read(namespace)}


def _eventually_count(path: Path, key: tuple[str, str], n: int, timeout_s: float = 20.0) -> None:
    """Flushes that learning triggers run in the background: wait for this one to land."""
    deadline = time.monotonic() + timeout_s
    while _counts(path).get(key) != n:
        assert time.monotonic() < deadline, (_counts(path), key, n)
        time.sleep(0.02)


def test_default_store_lives_under_agentkv_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTKV_HOME", str(tmp_path / "home"))
    assert default_store_path() == tmp_path / "home" / "gaps.sqlite3"
    with GapModel(store=True) as m:
        m.observe("shell", 1.0)
    assert _counts(tmp_path / "home" / "gaps.sqlite3")[("idle", "shell")] == 1


def test_learned_gaps_survive_a_restart(tmp_path):
    path = tmp_path / "g.sqlite3"
    with GapModel(store=path, namespace="app", min_samples=1) as m:
        for i in range(100):
            m.observe("shell:pytest", i / 10, at=NOW)
            m.observe("shell:pytest", 2.0, at=NOW, kind="tool")
        before = m.estimate("shell:pytest")
    again = GapModel(store=path, namespace="app", min_samples=1)
    after = again.estimate("shell:pytest")
    assert (after.n, after.source) == (100, "shell:pytest")
    assert after.p50 == pytest.approx(before.p50)
    assert after.p99 == pytest.approx(before.p99)
    assert after.ewma == pytest.approx(before.ewma)
    assert again.estimate("shell:pytest", kind="tool").n == 100
    # namespaces are separate
    assert GapModel(store=path, namespace="other").estimate("shell:pytest").source == "prior"
    again.close()


def test_flushes_are_batched(tmp_path):
    path = tmp_path / "g.sqlite3"
    m = GapModel(store=path, flush_every=10, flush_interval_s=3600.0)
    for _ in range(9):
        m.observe("t", 1.0)
    assert _counts(path) == {}
    m.observe("t", 1.0)
    _eventually_count(path, ("idle", "t"), 10)
    m.observe("t", 1.0)
    m.close()
    assert _counts(path)[("idle", "t")] == 11


def test_two_writers_merge_and_each_sees_the_other(tmp_path):
    path = tmp_path / "g.sqlite3"
    a = GapModel(store=path, min_samples=1, ewma_alpha=0.5)
    b = GapModel(store=path, min_samples=1, ewma_alpha=0.5)
    for _ in range(30):
        a.observe("shell", 1.0, at=NOW)
    a.flush()
    for _ in range(10):
        b.observe("shell", 9.0, at=NOW)
    b.flush()
    est = b.estimate("shell")
    assert est.n == 40
    assert est.p50 == pytest.approx(1.0) and est.p90 == pytest.approx(9.0)
    # the EWMA continued through b's samples from the stored value
    assert est.ewma == pytest.approx(9.0 - 8.0 * 0.5**10)
    a.observe("shell", 1.0, at=NOW)  # a sees b's samples after its next flush
    a.flush()
    assert a.estimate("shell").n == 41
    a.close()
    b.close()


def test_samples_observed_while_the_store_is_locked_are_kept(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("AGENTKV_STRICT", "0")
    path = tmp_path / "g.sqlite3"
    m = GapModel(store=GapStore(path, busy_timeout_s=0.05), flush_every=1000)
    for _ in range(5):
        m.observe("t", 1.0)
    blocker = sqlite3.connect(path, timeout=0.1, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    assert m.flush() is False
    blocker.execute("ROLLBACK")
    blocker.close()
    m.observe("t", 1.0)
    assert m.flush() is True
    assert _counts(path)[("idle", "t")] == 6
    assert m.estimate("t", fallback=False).n == 6
    m.close()


def test_corrupt_file_is_moved_aside_with_a_warning(tmp_path, caplog):
    path = tmp_path / "g.sqlite3"
    path.write_bytes(b"this is not a database at all" * 100)
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        m = GapModel(store=path, min_samples=1)
    assert "moved it to" in caplog.text
    aside = list(tmp_path.glob("g.sqlite3.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")
    m.observe("t", 1.0)
    m.close()
    assert _counts(path)[("idle", "t")] == 1


def test_finding13_foreign_sqlite_database_is_left_alone(tmp_path, caplog):
    """Issue 13, finding 13: a valid SQLite file that is not ours is not renamed away;
    the model learns in memory and says so."""
    path = tmp_path / "g.sqlite3"
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE users (name TEXT)")
    other.execute("INSERT INTO users VALUES ('x')")
    other.commit()
    other.close()
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        m = GapModel(store=path, min_samples=1)
    assert m.store is None and "not an agentkv gap store" in caplog.text
    assert "learning in memory only" in caplog.text
    m.observe("t", 1.0)
    assert m.estimate("t").n == 1
    m.close()
    assert not list(tmp_path.glob("*.corrupt-*"))
    check = sqlite3.connect(path)
    assert check.execute("SELECT name FROM users").fetchall() == [("x",)]
    check.close()


def test_finding13_store_home_and_files_are_private(tmp_path, monkeypatch):
    """Issue 13, finding 13: directories agentkv creates are 0700, its store file 0600."""
    monkeypatch.setenv("AGENTKV_HOME", str(tmp_path / "home"))
    with GapModel(store=True) as m:
        m.observe("shell", 1.0)
    home = tmp_path / "home"
    assert home.stat().st_mode & 0o777 == 0o700
    for name in ("gaps.sqlite3", "gaps.sqlite3-wal", "gaps.sqlite3-shm"):
        if (home / name).exists():
            assert (home / name).stat().st_mode & 0o777 == 0o600, name
    monkeypatch.delenv("AGENTKV_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "cache" / "agentkv").mkdir(parents=True, mode=0o755)
    (tmp_path / "cache" / "agentkv").chmod(0o755)  # left readable by an older version
    from agentkv._paths import agentkv_home

    assert agentkv_home().stat().st_mode & 0o777 == 0o700


def test_finding8_a_locked_store_never_blocks_the_learning_call(tmp_path, monkeypatch):
    """Issue 13, finding 8: the flush that learning triggers runs off the caller's path
    with a short busy timeout; what a locked store refused goes with the next flush."""
    monkeypatch.setenv("AGENTKV_STRICT", "0")
    path = tmp_path / "g.sqlite3"
    m = GapModel(store=path, flush_every=5, flush_interval_s=3600.0)
    blocker = sqlite3.connect(path, timeout=0.1, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    caller = threading.Thread(target=lambda: [m.observe("t", 1.0) for _ in range(5)])
    caller.start()
    caller.join(timeout=10.0)  # the old flush waited 30 s here, on the caller's thread
    still_locked = blocker.in_transaction
    assert not caller.is_alive() and still_locked
    m._sync.wait_idle(10.0)  # the background try gave up after the short busy timeout
    blocker.execute("ROLLBACK")
    blocker.close()
    m.observe("t", 1.0)  # due again: the next flush carries the 5 refused samples too
    _eventually_count(path, ("idle", "t"), 6)
    m.close()


def test_store_from_a_newer_agentkv_is_left_alone(tmp_path, caplog, monkeypatch):
    path = tmp_path / "g.sqlite3"
    newer = sqlite3.connect(path)
    newer.execute(f"PRAGMA application_id={APPLICATION_ID}")
    newer.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    newer.execute("CREATE TABLE gaps (future TEXT)")
    newer.commit()
    newer.close()
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        m = GapModel(store=path, min_samples=1)
    assert m.store is None and "schema version" in caplog.text
    m.observe("t", 1.0)  # learning goes on in memory
    assert m.estimate("t").n == 1
    assert not list(tmp_path.glob("*.corrupt-*"))
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    check.close()


def test_unreadable_row_is_skipped(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("AGENTKV_STRICT", "0")
    path = tmp_path / "g.sqlite3"
    with GapModel(store=path) as m:
        m.observe("good", 1.0)
        m.observe("bad", 1.0)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE gaps SET sketch=X'00' WHERE tool_class='bad'")
    conn.commit()
    conn.close()
    m = GapModel(store=path, min_samples=1)
    assert m.estimate("good", fallback=False).n == 1
    assert m.estimate("bad", fallback=False).source == "prior"
    m.observe("bad", 2.0)  # a new sample replaces the unreadable row
    m.close()
    assert _counts(path)[("idle", "bad")] == 1


WRITER = textwrap.dedent(
    """
    import sys
    from agentkv import GapModel
    path, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    m = GapModel(store=path, flush_every=37, flush_interval_s=3600.0)
    for i in range(count):
        m.observe(f"shell:w{worker}", (i % 50) / 10.0, at=1_800_000_000.0 + i)
        m.observe("shell", 1.0, kind="tool")
    m.close()
    """
)


def test_several_processes_learn_into_one_store_without_loss(tmp_path):
    path = tmp_path / "g.sqlite3"
    workers, count = 4, 400
    env = {**os.environ, "AGENTKV_STRICT": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(w), str(count)], env=env)
        for w in range(workers)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * workers
    counts = _counts(path)
    for w in range(workers):
        assert counts[("idle", f"shell:w{w}")] == count
    assert counts[("idle", "shell")] == workers * count
    assert counts[("idle", ALL_TOOLS)] == workers * count
    assert counts[("tool", "shell")] == workers * count
    reader = GapModel(store=path, min_samples=1)
    assert reader.estimate(ALL_TOOLS).n == workers * count
    assert reader.estimate("shell:w0").p99 == pytest.approx(4.9, abs=0.05)
    reader.close()


KILLED = textwrap.dedent(
    """
    import sys, time
    import agentkv.gaps._store as gs
    from agentkv import GapModel

    merges = {"n": 0}
    real_merge = gs.merge_samples

    def merge_then_stall(*args, **kwargs):
        # Called inside the write transaction, once per row. On the 21st flush, stall
        # after writing some rows so the parent kills us in the middle of it.
        merges["n"] += 1
        if merges["n"] == 20 * ROWS + 3:
            print("mid-flush", flush=True)
            time.sleep(60)
        return real_merge(*args, **kwargs)

    gs.merge_samples = merge_then_stall
    m = GapModel(store=sys.argv[1], flush_every=10**9, flush_interval_s=3600.0)
    ROWS = 7 + 1  # seven classes and the all-tools pool
    i = 0
    while True:
        m.observe(f"tool{i % 7}", (i % 13) / 3.0)
        i += 1
        if i % 50 == 0:
            m.flush()  # explicit flushes run on this thread: batches of exactly 50
    """
)


def test_kill_9_mid_flush_leaves_a_readable_store(tmp_path, caplog):
    """SIGKILL inside an open write transaction: the store keeps the last commit."""
    path = tmp_path / "g.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "mid-flush"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        with GapStore(path) as store:
            records = store.read("default")
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
    assert "moved it" not in caplog.text
    counts = {r.tool_class: r.n for r in records}
    assert counts[ALL_TOOLS] == 20 * 50  # twenty whole flushes; the killed one left nothing
    assert sum(n for cls, n in counts.items() if cls != ALL_TOOLS) == 20 * 50
    m = GapModel(store=path)
    m.observe("tool0", 1.0)
    assert m.flush()
    m.close()
    assert _counts(path)[("idle", ALL_TOOLS)] == 20 * 50 + 1


def test_time_based_flush_follows_the_models_clock(tmp_path):
    """flush_interval_s is measured on the clock the model was given (FakeClock here)."""
    from agentkv.testing import FakeClock

    clock = FakeClock()
    path = tmp_path / "g.sqlite3"
    m = GapModel(store=path, flush_every=1000, flush_interval_s=10.0, clock=clock)
    m.observe("t", 1.0)
    assert ("idle", "t") not in _counts(path)  # neither count nor interval reached
    clock.advance(10.0)
    m.observe("t", 2.0)  # the interval has passed on the model's clock: this one flushes
    _eventually_count(path, ("idle", "t"), 2)
    m.close()


def test_a_store_opened_in_the_background_never_holds_up_the_caller(tmp_path, monkeypatch):
    """The process's learner opens its store on a thread: while the store is still
    opening (held here), the model answers and learns; what it learned meanwhile and
    what the store already held are both there once it is attached, and reach disk."""
    import agentkv.gaps._store as store_mod

    path = tmp_path / "gaps.sqlite"
    with GapModel(store=path, min_samples=1) as first:
        for _ in range(5):
            first.observe("db", 2.0)
    release = threading.Event()
    real_open = store_mod.open_store_quietly

    def slow_open(*args, **kwargs):
        release.wait(10)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(store_mod, "open_store_quietly", slow_open)
    model = GapModel(store=path, min_samples=1, open_in_background=True)
    assert model.store is None and not model.wait_open(0.05)  # still opening
    model.observe("db", 4.0)  # learned while the store opens
    assert model.estimate("db").n == 1
    release.set()
    assert model.wait_open(10) and model.store is not None
    assert model.estimate("db").n == 6  # the store's 5 and the early one
    model.close()
    assert _counts(path)[("idle", "db")] == 6


def test_a_background_open_that_fails_leaves_a_memory_model(tmp_path, monkeypatch, caplog):
    import agentkv.gaps._store as store_mod

    def broken(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(store_mod, "open_store_quietly", broken)
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        model = GapModel(store=tmp_path / "g.sqlite", min_samples=1, open_in_background=True)
        assert model.wait_open(10)
    model.observe("db", 1.0)
    assert model.store is None and model.estimate("db").n == 1
    assert any("could not be opened" in r.getMessage() for r in caplog.records)
    model.close()
