"""The local gap store: learned gap sketches in one SQLite file, shared by processes.

One row per ``(namespace, kind, tool_class)`` holds a serialized sketch, the sample
count, the EWMA, the last update time and the decay landmark. The file lives under
:func:`agentkv._paths.agentkv_home` (``AGENTKV_HOME`` overrides) as ``gaps.sqlite3``.

Invariants:

- **Nothing is lost when processes learn at once.** A writer sends only its new samples
  (a delta); :meth:`GapStore.update` reads the stored row, merges the delta into it and
  writes it back inside one ``BEGIN IMMEDIATE`` transaction, so concurrent writers
  serialize on the database lock and every delta lands exactly once.
- **Crash-safe.** The database runs in WAL mode; a process killed mid-write leaves the
  last committed state, which the next opener reads.
- **Never fatal.** A file that is not a database is reported on logger ``agentkv``,
  moved aside (``gaps.sqlite3.corrupt-<time>``) and replaced by a fresh store. A valid
  SQLite database that is not ours, or a store written by a newer agentkv (higher
  schema version), is left alone: :class:`StoreUnavailable` tells the caller to learn
  in memory only.
- **Private.** Directories it creates are 0700, the database file 0600 (SQLite gives
  its ``-wal`` and ``-shm`` files the database's mode).
- **Versioned.** ``PRAGMA application_id`` marks the file as an agentkv gap store and
  ``PRAGMA user_version`` holds :data:`SCHEMA_VERSION`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agentkv._paths import agentkv_home
from agentkv.gaps._sketch import ForwardDecay, TDigestSketch

__all__ = [
    "APPLICATION_ID",
    "SCHEMA_VERSION",
    "GapRecord",
    "GapStore",
    "StoreUnavailable",
    "default_store_path",
    "merge_samples",
    "open_store_quietly",
    "push_samples",
]

logger = logging.getLogger("agentkv")

SCHEMA_VERSION = 1
APPLICATION_ID = 0x616B7667  # "akvg"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS gaps (
    namespace TEXT NOT NULL,
    kind TEXT NOT NULL,
    tool_class TEXT NOT NULL,
    n INTEGER NOT NULL,
    ewma REAL NOT NULL,
    updated_at_s REAL NOT NULL,
    landmark_s REAL NOT NULL,
    sketch BLOB NOT NULL,
    PRIMARY KEY (namespace, kind, tool_class)
) WITHOUT ROWID
"""
_COLUMNS = "kind, tool_class, n, ewma, updated_at_s, landmark_s, sketch"

Key = tuple[str, str]  # (kind, tool_class)


def default_store_path() -> Path:
    """Return where the gap store lives by default: ``<agentkv home>/gaps.sqlite3``."""
    return agentkv_home() / "gaps.sqlite3"


class StoreUnavailable(Exception):
    """The store cannot be used by this version of agentkv (learn in memory instead)."""


@dataclass(frozen=True, slots=True)
class GapRecord:
    """One stored gap sketch: a tool class of one kind in one namespace.

    ``sketch`` is opaque here (the gap model serializes it); ``landmark_s`` is the time
    origin of its decayed weights; ``updated_at_s`` is the newest sample's time.
    """

    kind: str
    tool_class: str
    n: int
    ewma: float
    updated_at_s: float
    landmark_s: float
    sketch: bytes

    @property
    def key(self) -> Key:
        """``(kind, tool_class)``."""
        return (self.kind, self.tool_class)


class GapStore:
    """Gap sketches persisted in a SQLite file (WAL), merged safely across processes.

    Open one per process (connections do not survive ``fork``). Methods are
    thread-safe. Raises :class:`StoreUnavailable` when the file was written by a newer
    schema; ``sqlite3.OperationalError`` ("database is locked") when another writer held
    the lock past the busy timeout (``busy_timeout_s``): retry later, the caller's delta
    is still its own.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, busy_timeout_s: float = 30.0
    ) -> None:
        self._path = Path(path) if path is not None else default_store_path()
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._conn = self._open()

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    # --- opening, checking, moving aside -------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # create it private (0600) if new
            os.close(os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        conn = sqlite3.connect(
            self._path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            conn = self._connect()
            try:
                self._check_or_init(conn)
            except BaseException:
                conn.close()
                raise
            return conn
        except sqlite3.OperationalError:
            raise  # locked, permissions, disk full: not the file's fault; do not move it
        except sqlite3.DatabaseError as exc:  # not a database: move it aside
            self._move_aside(str(exc))
        conn = self._connect()
        self._check_or_init(conn)
        return conn

    def _check_or_init(self, conn: sqlite3.Connection) -> None:
        app_id, version, tables = _inspect(conn)
        if app_id == APPLICATION_ID and version == SCHEMA_VERSION and "gaps" in tables:
            return
        if app_id == APPLICATION_ID and version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"gap store {self._path} has schema version {version}; this agentkv reads "
                f"version {SCHEMA_VERSION}. Upgrade agentkv, or point AGENTKV_HOME elsewhere."
            )
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables):
            raise StoreUnavailable(
                f"{self._path} is a SQLite database but not an agentkv gap store "
                f"(application_id={app_id}, tables={tables[:5]}); it is left alone. Move "
                "it, or point AGENTKV_HOME (or the store path) elsewhere."
            )
        # A fresh file (or ours at an older version, of which there are none yet): create.
        conn.execute("BEGIN IMMEDIATE")
        try:
            app_id, version, tables = _inspect(conn)  # another process may have won
            if not (app_id == APPLICATION_ID and version == SCHEMA_VERSION):
                if app_id == APPLICATION_ID and 0 < version < SCHEMA_VERSION:
                    conn.execute("DROP TABLE IF EXISTS gaps")
                conn.execute(_SCHEMA)
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _move_aside(self, why: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        target = self._path.with_name(f"{self._path.name}.corrupt-{stamp}-{os.getpid()}")
        with _file_lock(self._path.with_name(self._path.name + ".lock")):
            # Re-check under the lock: another process may already have replaced it.
            try:
                probe = self._connect()
                try:
                    self._check_or_init(probe)
                    return
                finally:
                    probe.close()
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError:
                pass
            for suffix in ("", "-wal", "-shm"):
                src = self._path.with_name(self._path.name + suffix)
                with contextlib.suppress(FileNotFoundError):
                    src.replace(target.with_name(target.name + suffix))
        logger.warning(
            "agentkv gap store %s could not be read (%s); moved it to %s and started a "
            "fresh store. Learned gaps start from scratch; nothing else is affected.",
            self._path,
            why,
            target,
        )

    # --- reading and merging --------------------------------------------------------
    def set_busy_timeout(self, seconds: float) -> None:
        """Wait at most ``seconds`` for another writer's lock from now on."""
        with self._lock:
            self.busy_timeout_s = seconds
            ms = max(0, int(seconds * 1000))
            self._require().execute(f"PRAGMA busy_timeout={ms}")

    def read(self, namespace: str) -> list[GapRecord]:
        """Return every record of ``namespace``."""
        with self._lock:
            return self._select(self._require(), namespace)

    def namespaces(self) -> list[str]:
        """Return the namespaces that hold at least one record, sorted."""
        with self._lock:
            rows = self._require().execute("SELECT DISTINCT namespace FROM gaps ORDER BY 1")
            return [str(r[0]) for r in rows]

    def update(
        self,
        namespace: str,
        keys: Iterable[Key],
        merge: Callable[[Key, GapRecord | None], GapRecord],
    ) -> list[GapRecord]:
        """Merge into each of ``keys`` atomically; return all records of ``namespace``.

        ``merge(key, stored_or_None)`` returns the new record for ``key``. It runs inside
        the write transaction, so it must be quick and free of I/O. On any error the
        transaction rolls back and nothing of this update is stored.
        """
        with self._lock:
            conn = self._require()
            conn.execute("BEGIN IMMEDIATE")
            try:
                for kind, tool_class in keys:
                    row = conn.execute(
                        f"SELECT {_COLUMNS} FROM gaps "
                        "WHERE namespace=? AND kind=? AND tool_class=?",
                        (namespace, kind, tool_class),
                    ).fetchone()
                    new = merge((kind, tool_class), _record(row) if row else None)
                    conn.execute(
                        "INSERT OR REPLACE INTO gaps (namespace, kind, tool_class, n, ewma, "
                        "updated_at_s, landmark_s, sketch) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            namespace,
                            new.kind,
                            new.tool_class,
                            new.n,
                            new.ewma,
                            new.updated_at_s,
                            new.landmark_s,
                            new.sketch,
                        ),
                    )
                records = self._select(conn, namespace)
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            return records

    def reset(self) -> None:
        """Recover from a store found corrupt while in use: move it aside, start fresh."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._move_aside("the database reported corruption while in use")
            self._conn = self._open()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise sqlite3.ProgrammingError("the gap store is closed")
        return self._conn

    @staticmethod
    def _select(conn: sqlite3.Connection, namespace: str) -> list[GapRecord]:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM gaps WHERE namespace=? ORDER BY kind, tool_class",
            (namespace,),
        )
        return [_record(r) for r in rows]

    def __enter__(self) -> GapStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GapStore({str(self._path)!r})"


def merge_samples(
    old: GapRecord | None,
    key: Key,
    samples: list[tuple[float, float]],
    *,
    decay: ForwardDecay,
    ewma_alpha: float,
    max_centroids: int,
) -> GapRecord:
    """Return ``old`` with ``samples`` (``(gap_s, at_s)``, in order) folded in.

    The sketch moves to a common landmark and takes the new samples with their decayed
    weights; the count adds up; the EWMA continues from the stored one through the new
    samples in order, as if one process had seen them all. A stored row that cannot be
    read is dropped with a warning (its samples are lost, the new ones are kept).
    """
    times = [t for _, t in samples]
    sketch = TDigestSketch(max_centroids)
    n, ewma, updated = 0, samples[0][0], max(times)
    if old is not None:
        try:
            sketch = TDigestSketch.from_bytes(old.sketch)
            n, ewma, updated = old.n, old.ewma, max(updated, old.updated_at_s)
        except ValueError as exc:
            logger.warning("agentkv gap store: dropped an unreadable row %s (%s)", key, exc)
            old = None
    marks = [old.landmark_s] if old is not None else [decay.fresh_landmark(min(times))]
    landmark = decay.choose_landmark(marks, max(times))
    if old is not None:
        sketch.scale(decay.factor(old.landmark_s, landmark))
    for gap_s, t in samples:
        sketch.add(gap_s, decay.weight(t, landmark))
        ewma += ewma_alpha * (gap_s - ewma)
    return GapRecord(key[0], key[1], n + len(samples), ewma, updated, landmark, sketch.to_bytes())


def push_samples(
    store: GapStore,
    namespace: str,
    batch: list[tuple[str, tuple[str, ...], float, float]],
    *,
    decay: ForwardDecay,
    ewma_alpha: float,
    max_centroids: int,
) -> list[GapRecord]:
    """Merge ``(kind, levels, gap_s, at_s)`` samples into every level, in one transaction.

    Returns all records of ``namespace`` after the merge.
    """
    groups: dict[Key, list[tuple[float, float]]] = {}
    for kind, levels, gap_s, t in batch:
        for level in levels:
            groups.setdefault((kind, level), []).append((gap_s, t))

    def merge(key: Key, old: GapRecord | None) -> GapRecord:
        return merge_samples(
            old, key, groups[key], decay=decay, ewma_alpha=ewma_alpha, max_centroids=max_centroids
        )

    return store.update(namespace, list(groups), merge)


def open_store_quietly(
    store: GapStore | str | os.PathLike[str] | bool,
    *,
    strict: bool = False,
    busy_timeout_s: float | None = None,
) -> GapStore | None:
    """Open a store (``True``: the default path), or log why not and return ``None``.

    ``busy_timeout_s``: the lock wait of a store opened here, once it is open (a
    :class:`GapStore` passed in keeps its own).
    """
    if isinstance(store, GapStore):
        return store
    try:
        opened = GapStore(None if store is True else Path(store))  # type: ignore[arg-type]
        if busy_timeout_s is not None:
            opened.set_busy_timeout(busy_timeout_s)
        return opened
    except Exception as exc:
        if strict and not isinstance(exc, StoreUnavailable):
            raise
        logger.warning("agentkv gap store unavailable (%s); learning in memory only", exc)
        return None


def _record(row: tuple[object, ...]) -> GapRecord:
    kind, tool_class, n, ewma, updated, landmark, sketch = row
    return GapRecord(
        kind=str(kind),
        tool_class=str(tool_class),
        n=int(n),  # type: ignore[call-overload]
        ewma=float(ewma),  # type: ignore[arg-type]
        updated_at_s=float(updated),  # type: ignore[arg-type]
        landmark_s=float(landmark),  # type: ignore[arg-type]
        sketch=bytes(sketch),  # type: ignore[call-overload]
    )


def _inspect(conn: sqlite3.Connection) -> tuple[int, int, list[str]]:
    app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    tables = [str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return app_id, version, tables


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (a no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
