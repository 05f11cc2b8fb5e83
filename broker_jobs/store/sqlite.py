"""The embedded default store: one SQLite file shared by the worker processes of a host.

Atomicity across processes comes from SQLite's own locking: every claim and state
change is ``BEGIN IMMEDIATE`` (take the write lock first), read, decide, write,
``COMMIT``. WAL mode lets ledger queries read while workers write; a busy timeout
makes writers queue instead of failing. ``synchronous=FULL``: a recorded outcome
survives a power cut, so a finished job is not run again after one.

The file must live on a local file system (WAL needs shared memory between the
processes; network file systems break SQLite's locking).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from typing import Any

from broker_jobs.store.base import (
    TERMINAL,
    ExclusiveStore,
    JobRecord,
    Records,
    Status,
    StoreError,
    check_limit,
    utc,
)

#: The layout this code writes. A file with a higher version was created by a newer
#: broker-jobs and is refused rather than misread.
SCHEMA_VERSION = 1

#: Seconds a writer waits for another process's transaction before giving up.
DEFAULT_BUSY_TIMEOUT = 10.0

_COLUMNS = (
    "idempotency_key, job_id, task, status, attempts, created_at, updated_at, worker,"
    " lease_until, last_error, due_at"
)

_CREATE = (
    """CREATE TABLE broker_jobs_records (
        idempotency_key TEXT PRIMARY KEY,
        job_id TEXT NOT NULL,
        task TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        worker TEXT,
        lease_until TEXT,
        last_error TEXT,
        due_at TEXT
    ) WITHOUT ROWID""",
    "CREATE INDEX broker_jobs_records_status ON broker_jobs_records (status, updated_at)",
    "CREATE INDEX broker_jobs_records_task ON broker_jobs_records (task, updated_at)",
    "CREATE INDEX broker_jobs_records_job_id ON broker_jobs_records (job_id)",
)


class SQLiteStore(ExclusiveStore):
    """Records in the SQLite file at ``path`` (created with its tables if missing).

    Each thread gets its own connection (the worker calls the store from a thread
    pool); :meth:`close` closes them all, so call it once the threads are done with
    the store. Open the store in each process after forking, never before.
    """

    def __init__(
        self, path: str | PathLike[str], *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    ) -> None:
        if str(path) in ("", ":memory:") or str(path).startswith("file:"):
            raise StoreError(
                f"SQLiteStore needs a file path, not {str(path)!r}: each thread opens its"
                " own connection, so an in-memory database would not be shared; use"
                " MemoryStore (memory://) for an in-process store"
            )
        self.path = Path(path)
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._lock = threading.Lock()  # guards _connections and _closed
        self._connections: list[sqlite3.Connection] = []
        self._closed = False
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    # --- connections and transactions ---------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        with self._lock:
            if self._closed:
                raise StoreError(f"{self!r} is closed; open a new store")
            if conn is not None:
                return conn
            with self._translate("open"):
                conn = sqlite3.connect(
                    self.path,
                    timeout=self._busy_timeout,
                    isolation_level=None,  # autocommit; transactions are explicit
                    check_same_thread=False,  # only its thread uses it; close() may be elsewhere
                )
                try:
                    conn.execute("PRAGMA synchronous = FULL")
                except BaseException:
                    conn.close()
                    raise
            self._connections.append(conn)
        self._local.conn = conn
        return conn

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """sqlite3 errors -> StoreError saying what happened and what to do."""
        try:
            yield
        except sqlite3.Error as error:
            raise self._store_error(action, error) from error

    def _store_error(self, action: str, error: sqlite3.Error) -> StoreError:
        text = str(error)
        where = f"SQLite store {str(self.path)!r}"
        if "locked" in text or "busy" in text:
            return StoreError(
                f"{where}: cannot {action}: the file stayed locked by another process for"
                f" more than {self._busy_timeout:g} s. Look for a process holding a long"
                " transaction on it (a shell, a backup), or raise busy_timeout"
            )
        if "unable to open" in text:
            return StoreError(
                f"{where}: cannot {action}: {text}. Create the directory"
                f" {str(self.path.parent)!r} and make it writable by the worker (SQLite"
                " writes -wal and -shm files beside the database)"
            )
        if "not a database" in text or "malformed" in text:
            return StoreError(
                f"{where}: cannot {action}: {text}. The file is not a (healthy) SQLite"
                " database; point the store at another path"
            )
        if "closed" in text:
            return StoreError(f"{where} is closed; open a new store")
        return StoreError(f"{where}: cannot {action}: {type(error).__name__}: {text}")

    @contextmanager
    def _transaction(self, action: str) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE``: the write lock is taken before reading, so the read,
        the decision and the write are atomic for every process sharing the file."""
        conn = self._connection()
        with self._translate(action):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def _exclusive(self) -> Iterator[Records]:
        with self._transaction("change a record") as conn:
            yield _SQLiteRecords(conn)

    def _migrate(self) -> None:
        conn = self._connection()
        with self._translate("open"):
            # Persistent in the file; changing it takes a lock, so only when needed.
            (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
            if mode != "wal":
                (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
                if mode != "wal":
                    raise StoreError(
                        f"SQLite store {str(self.path)!r}: cannot switch to WAL mode (got"
                        f" {mode!r}); put the file on a local file system"
                    )
        with self._transaction("create the tables") as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS broker_jobs_schema (version INTEGER NOT NULL)")
            (version,) = conn.execute("SELECT max(version) FROM broker_jobs_schema").fetchone()
            if version is None:
                for statement in _CREATE:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO broker_jobs_schema (version) VALUES (?)", (SCHEMA_VERSION,)
                )
            elif version > SCHEMA_VERSION:
                raise StoreError(
                    f"SQLite store {str(self.path)!r} was created by a newer broker-jobs"
                    f" (schema version {version}; this one knows up to {SCHEMA_VERSION})."
                    " Upgrade broker-jobs on this host, or use another file"
                )

    # --- queries ------------------------------------------------------------------

    def _select(self, where: str, params: tuple[Any, ...], tail: str = "") -> list[JobRecord]:
        conn = self._connection()
        with self._translate("read records"):
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM broker_jobs_records {where} {tail}", params
            ).fetchall()
        return [_record(row) for row in rows]

    def get(self, key: str) -> JobRecord | None:
        found = self._select("WHERE idempotency_key = ?", (key,))
        return found[0] if found else None

    def get_by_job_id(self, job_id: str) -> list[JobRecord]:
        return self._select("WHERE job_id = ?", (job_id,), _NEWEST_FIRST)

    def find(
        self,
        *,
        status: Status | None = None,
        task: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[JobRecord]:
        conditions: list[str] = []
        params: list[Any] = []
        if status is not None:
            conditions.append("status = ?")
            params.append(Status(status).value)
        if task is not None:
            conditions.append("task = ?")
            params.append(task)
        if since is not None:
            conditions.append("updated_at >= ?")
            params.append(_text(utc(since)))
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        params.append(check_limit(limit))
        return self._select(where, tuple(params), f"{_NEWEST_FIRST} LIMIT ?")

    def counts(self) -> dict[Status, int]:
        conn = self._connection()
        with self._translate("count records"):
            rows = conn.execute(
                "SELECT status, count(*) FROM broker_jobs_records GROUP BY status"
            ).fetchall()
        counts = dict.fromkeys(Status, 0)
        counts.update({Status(status): n for status, n in rows})
        return counts

    def prune(self, older_than: datetime) -> int:
        terminal = sorted(s.value for s in TERMINAL)
        with self._transaction("prune records") as conn:
            cursor = conn.execute(
                "DELETE FROM broker_jobs_records WHERE status IN (?, ?, ?) AND updated_at < ?",
                (*terminal, _text(utc(older_than))),
            )
            return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()


_NEWEST_FIRST = "ORDER BY updated_at DESC, idempotency_key"


class _SQLiteRecords:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        #: Inside BEGIN IMMEDIATE: a handler's writes commit with the record.
        self.connection = conn

    def load(self, key: str) -> JobRecord | None:
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM broker_jobs_records WHERE idempotency_key = ?", (key,)
        ).fetchone()
        return _record(row) if row else None

    def save(self, record: JobRecord) -> None:
        self._conn.execute(
            f"INSERT OR REPLACE INTO broker_jobs_records ({_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.idempotency_key,
                record.job_id,
                record.task,
                record.status.value,
                record.attempts,
                _text(record.created_at),
                _text(record.updated_at),
                record.worker,
                _text(record.lease_until),
                record.last_error,
                _text(record.due_at),
            ),
        )


def _text(moment: datetime | None) -> str | None:
    """Fixed-width UTC ISO text: SQL compares and orders it as time."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text is not None else None


def _record(row: tuple[Any, ...]) -> JobRecord:
    key, job_id, task, status, attempts, created, updated, worker, lease, error, due = row
    created_at, updated_at = _time(created), _time(updated)
    assert created_at is not None  # NOT NULL columns
    assert updated_at is not None
    return JobRecord(
        idempotency_key=key,
        job_id=job_id,
        task=task,
        status=Status(status),
        attempts=attempts,
        created_at=created_at,
        updated_at=updated_at,
        worker=worker,
        lease_until=_time(lease),
        last_error=error,
        due_at=_time(due),
    )
