"""The embedded default store: one SQLite file shared by the worker processes of a host.

Atomicity across processes comes from SQLite's own locking: every claim and state
change is either one statement (atomic on its own: a claim of keys never seen is one
``INSERT ... ON CONFLICT DO NOTHING``) or ``BEGIN IMMEDIATE`` (take the
write lock first), read, decide, write, ``COMMIT``. WAL mode lets ledger queries
read while workers write; a busy timeout makes writers queue instead of failing.
``synchronous=FULL``: a recorded outcome survives a power cut, so a finished job is
not run again after one.

The beat's records (the last fire of each schedule, the leader of each group) live in
two small tables beside the ledger, each written with one statement: a fire is an
UPSERT that only moves forward, so it stays monotonic whatever the callers' order.

Many processes may open one new file at once: switching it to WAL and creating the
tables are retried while another opener holds the lock (SQLite answers some of those
races SQLITE_BUSY at once, without its busy timeout), for up to the busy timeout.

The file must live on a local file system (WAL needs shared memory between the
processes; network file systems break SQLite's locking).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue as _queue
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from os import PathLike
from pathlib import Path
from typing import Any

from broker_jobs.envelope import Job
from broker_jobs.store.base import (
    TERMINAL,
    Claim,
    ClaimOutcome,
    ExclusiveStore,
    Execution,
    ExecutionOutcome,
    JobRecord,
    KeptPayload,
    LeaderRecord,
    LeaseLostError,
    PayloadText,
    Records,
    Status,
    StoreError,
    TaskSummary,
    check_lease,
    check_limit,
    claimed_record,
    clip_error,
    decide,
    payload_text,
    read_payload,
    utc,
)
from broker_jobs.store.ledger import (
    BUCKETS_SQL,
    COUNTS_SQL,
    FINISHED_COUNTS_SQL,
    FINISHED_SQL,
    Buckets,
    Dialect,
    Filters,
    Tally,
    summaries,
    tally_records,
    window_params,
)

log = logging.getLogger(__name__)

#: The layout this code writes. A file with a higher version was created by a newer
#: broker-jobs and is refused rather than misread.
SCHEMA_VERSION = 4

#: How many executions per task :meth:`SQLiteStore.task_summaries` reads for p50 and
#: p99 (the newest of the last hour): their percentiles are computed in Python, so the
#: work of a busy task stays bounded.
MAX_SUMMARY_DURATIONS = 5000

#: Seconds a writer waits for another process's transaction before giving up.
DEFAULT_BUSY_TIMEOUT = 10.0

#: Pauses between tries when opening the file meets another opener's lock: doubled
#: from the first to the last, each shortened or lengthened by up to half at random
#: (openers released together do not retry in step).
_OPEN_FIRST_PAUSE = 0.001
_OPEN_LAST_PAUSE = 0.05

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
)

#: Version 2: the executions of every job (one per claim that ran it), kept by
#: triggers on the records: every statement that changes a record (the fast path's
#: one INSERT for a batch of new keys, a batch of successes' one UPDATE) records its
#: executions in the same statement, with no statement more from Python. The rule is
#: :func:`broker_jobs.store.base.track_execution`'s: an open execution that is not
#: the record's holding (RUNNING, held by ``worker`` at ``attempts``) is closed with
#: the new status (``released``: no holder; ``lost``: another holder or attempt), and
#: a holding without one opens one. A renewal or a reclaim by the holder changes
#: nothing. Keyed by (key, number): one B-tree, appended at the key's end.
_EXECUTION_COLUMNS = (
    "idempotency_key, job_id, attempt, worker, started_at, finished_at, outcome, error"
)
_TRACK = """
        UPDATE broker_jobs_executions SET
            finished_at = CASE WHEN NEW.status = 'running' AND NEW.worker IS NULL
                THEN coalesce(NEW.lease_until, NEW.updated_at) ELSE NEW.updated_at END,
            outcome = CASE WHEN NEW.status IN ('succeeded', 'retrying', 'failed', 'dead')
                THEN NEW.status WHEN NEW.status = 'running' AND NEW.worker IS NOT NULL
                THEN 'lost' ELSE 'released' END,
            error = CASE WHEN NEW.status IN ('retrying', 'failed', 'dead')
                THEN NEW.last_error END
        WHERE idempotency_key = NEW.idempotency_key AND finished_at IS NULL
            AND NOT (NEW.status = 'running' AND worker IS NEW.worker
                     AND attempt = NEW.attempts);
        INSERT INTO broker_jobs_executions
            (idempotency_key, number, job_id, attempt, worker, started_at)
        SELECT NEW.idempotency_key, coalesce(max(number), 0) + 1, NEW.job_id,
            NEW.attempts, NEW.worker, NEW.updated_at
        FROM broker_jobs_executions WHERE idempotency_key = NEW.idempotency_key
        HAVING NEW.status = 'running' AND NEW.worker IS NOT NULL
            AND coalesce(sum(finished_at IS NULL), 0) = 0;
"""
_CREATE_EXECUTIONS = (
    """CREATE TABLE broker_jobs_executions (
        idempotency_key TEXT NOT NULL,
        number INTEGER NOT NULL,
        job_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        worker TEXT NOT NULL,
        started_at TEXT NOT NULL,
        finished_at TEXT,
        outcome TEXT,
        error TEXT,
        PRIMARY KEY (idempotency_key, number)
    ) WITHOUT ROWID""",
    # INSERT OR REPLACE (the generic sections' save) fires the insert trigger only.
    f"""CREATE TRIGGER broker_jobs_executions_on_insert AFTER INSERT ON broker_jobs_records
    BEGIN {_TRACK} END""",
    f"""CREATE TRIGGER broker_jobs_executions_on_update
    AFTER UPDATE OF status, worker, attempts ON broker_jobs_records
    BEGIN {_TRACK} END""",
)
_CREATE_TRIGGERS = _CREATE_EXECUTIONS[1:]
#: Version 1 -> 2: the table and its triggers, and an open execution for each record
#: held when the file is migrated (started at its claim), so its outcome closes one.
_MIGRATE_1_TO_2 = (
    *_CREATE_EXECUTIONS,
    "INSERT INTO broker_jobs_executions"
    " (idempotency_key, number, job_id, attempt, worker, started_at)"
    " SELECT idempotency_key, 1, job_id, attempts, worker, updated_at FROM broker_jobs_records"
    " WHERE status = 'running' AND worker IS NOT NULL",
    "UPDATE broker_jobs_schema SET version = 2",
)
#: Version 2 -> 3: the statuses queued, scheduled and cancelled (no column changes:
#: the version keeps older code, which cannot read them, away from the file), and the
#: triggers again, whose version 2 would close an execution with such a status as its
#: outcome (none of the rules leads there, but no outcome outside the executions' own
#: may be written).
_MIGRATE_2_TO_3 = (
    "DROP TRIGGER IF EXISTS broker_jobs_executions_on_insert",
    "DROP TRIGGER IF EXISTS broker_jobs_executions_on_update",
    *_CREATE_TRIGGERS,
    "UPDATE broker_jobs_schema SET version = 3",
)
#: Version 4: the payloads the ledger keeps (docs/store.md, "Payloads"): a table of
#: their own, so the records a claim writes stay narrow; a row is written only off the
#: hot path (a publish with the ledger, a failure), at most one per key (the first).
#: ``payload`` is the JSON text, NULL when it was larger than MAX_PAYLOAD_BYTES
#: (``bytes`` says how large). Deleted with its record by prune.
_CREATE_PAYLOADS = """CREATE TABLE broker_jobs_payloads (
        idempotency_key TEXT PRIMARY KEY,
        payload TEXT,
        bytes INTEGER NOT NULL,
        kept_at TEXT NOT NULL
    ) WITHOUT ROWID"""
#: Version 3 -> 4: the payloads table (the records are untouched; a job known before
#: has no payload kept).
_MIGRATE_3_TO_4 = (
    _CREATE_PAYLOADS,
    "UPDATE broker_jobs_schema SET version = 4",
)

#: The job-id index holds only the records whose key is not their job id (a chosen
#: key, a beat fire's): most keys are the id, and those records are found by the
#: primary key. Each index entry a claim writes is paid on a job's way to its start
#: (a claim of 5 new jobs alone, median: ~255-315 us with an entry each, ~245 us).
#: Version 1 files had an entry for every record: swapped when the store opens
#: them (older code still reads the file, scanning for job ids).
_CREATE_JOB_ID_INDEX = (
    "CREATE INDEX IF NOT EXISTS broker_jobs_records_other_job_id"
    " ON broker_jobs_records (job_id) WHERE job_id <> idempotency_key",
    "DROP INDEX IF EXISTS broker_jobs_records_job_id",
)

#: The indexes of the dashboard's listings (docs/dashboard.md, Performance), added
#: after version 3 without changing the layout (older code keeps them up to date, as
#: SQLite does for every index): created if missing whenever a store opens the file
#: (on a big ledger the first open after an upgrade builds them: ~2.5 s for 1,000,000
#: records). The records by ``updated_at`` (with the key: the order of ``find``):
#: the newest-first listing without a status or task filter, and its pages, read 50
#: records instead of sorting them all (1,000,000 records: ~1 s -> ~0.3 ms). The
#: executions that have finished, by ``finished_at``: the last hour's executions of
#: ``task_summaries`` are found by a range instead of a walk of every record (~1.1 s
#: less at 1,000,000); open executions (a claim's) have no entry. Their cost on the
#: worker's path (``python -m bench.dashboard``: 50,000 records, 5 new jobs at a time,
#: medians of 500): claim_many ~248 -> ~266 us, succeed_many ~525 -> ~582 us.
_CREATE_LEDGER_INDEXES = (
    "CREATE INDEX IF NOT EXISTS broker_jobs_records_updated ON broker_jobs_records (updated_at)",
    "CREATE INDEX IF NOT EXISTS broker_jobs_executions_finished"
    " ON broker_jobs_executions (finished_at) WHERE finished_at IS NOT NULL",
)

#: The beat's tables, added after version 1 without changing the layout of the others
#: (older code ignores them): created if missing whenever a store opens the file.
_CREATE_BEAT = (
    """CREATE TABLE IF NOT EXISTS broker_jobs_beat_fires (
        schedule TEXT PRIMARY KEY,
        fire_at TEXT NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS broker_jobs_beat_leaders (
        group_name TEXT PRIMARY KEY,
        identity TEXT NOT NULL,
        since TEXT NOT NULL,
        seen_at TEXT NOT NULL
    ) WITHOUT ROWID""",
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
        #: Held by the store's thread while it serves, and tried by
        #: :meth:`try_claim_many`: that claim never waits for this process's writes.
        self._serving = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._closed = False
        self._queue: _queue.SimpleQueue[Any] = _queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    def is_outage(self, error: BaseException) -> bool:
        return _is_outage(error)

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    # --- connections and transactions ---------------------------------------------

    def _connection(self, synchronous: str = "FULL", *, wait: bool = True) -> sqlite3.Connection:
        """This thread's connection. ``wait=False``: one that never waits: SQLITE_BUSY
        at once when another connection writes, and no checkpoint after its commits
        (a checkpoint flushes the file: milliseconds); the others checkpoint."""
        attr = ("conn" if synchronous == "FULL" else "conn_" + synchronous) + (
            "" if wait else "_at_once"
        )
        conn: sqlite3.Connection | None = getattr(self._local, attr, None)
        if conn is not None and not self._closed:
            return conn
        with self._lock:
            if self._closed:
                raise StoreError(f"{self!r} is closed; open a new store")
            if conn is not None:
                return conn
            with self._translate("open"):
                conn = sqlite3.connect(
                    self.path,
                    timeout=self._busy_timeout if wait else 0,
                    isolation_level=None,  # autocommit; transactions are explicit
                    check_same_thread=False,  # only its thread uses it; close() may be elsewhere
                )
                try:
                    conn.execute(f"PRAGMA synchronous = {synchronous}")
                    if not wait:
                        conn.execute("PRAGMA wal_autocheckpoint = 0")
                except BaseException:
                    conn.close()
                    raise
            self._connections.append(conn)
        setattr(self._local, attr, conn)
        return conn

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """sqlite3 errors -> StoreError saying what happened and what to do."""
        started = time.monotonic()
        try:
            yield
        except sqlite3.Error as error:
            raise self._store_error(action, error, time.monotonic() - started) from error

    def _store_error(
        self, action: str, error: sqlite3.Error, waited: float | None = None, tries: int = 1
    ) -> StoreError:
        """``waited``: the seconds spent on the step that failed (all its ``tries``)."""
        text = str(error)
        where = f"SQLite store {str(self.path)!r}"
        if _is_busy(error) or "locked" in text or "busy" in text:
            # SQLite answers some lock conflicts at once, without the busy timeout (when
            # waiting could deadlock): say how long it really was.
            spent = "" if waited is None else f" after {_duration(waited)}"
            if tries > 1:
                spent += f" and {tries} tries"
            return StoreError(
                f"{where}: cannot {action}: the file was locked by another process;"
                f" gave up{spent} (busy timeout {self._busy_timeout:g} s). Look for a"
                " process holding a long transaction on it (a shell, a backup), or raise"
                " busy_timeout"
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
    def _transaction(self, action: str, synchronous: str = "FULL") -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE``: the write lock is taken before reading, so the read,
        the decision and the write are atomic for every process sharing the file."""
        conn = self._connection(synchronous)
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
        """Switch the file to WAL and create (or migrate) the tables, safely when many
        processes open a new file at once.

        Switching to WAL reads the file, then takes the write lock: when another opener
        holds it meanwhile, SQLite answers SQLITE_BUSY at once, without the busy
        timeout (waiting while holding the read lock could deadlock). So each step is
        tried again after a short pause while the lock is busy, until the busy timeout
        has passed since the first try; another opener has usually switched the file
        by then, and the next try finds it in WAL mode.
        """
        conn = self._connection()
        started = time.monotonic()
        pause = _OPEN_FIRST_PAUSE
        tries = 0
        while True:
            tries += 1
            step = "switch the file to WAL mode"
            try:
                self._use_wal(conn)
                step = "create the tables"
                self._create_tables(conn)
            except sqlite3.Error as error:
                waited = time.monotonic() - started
                if conn.in_transaction:
                    with suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                if not _is_busy(error) or waited >= self._busy_timeout:
                    raise self._store_error(step, error, waited, tries) from error
                time.sleep(min(pause * random.uniform(0.5, 1.5), self._busy_timeout - waited))
                pause = min(pause * 2, _OPEN_LAST_PAUSE)
            else:
                if tries > 1:
                    log.debug(
                        "%r opened after %d tries (another process held the lock)", self, tries
                    )
                return

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        # Persistent in the file; changing it takes a lock, so only when needed (and
        # read again on each try: another opener may have switched it meanwhile).
        (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
        if mode != "wal":
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode != "wal":
                raise StoreError(
                    f"SQLite store {str(self.path)!r}: cannot switch to WAL mode (got"
                    f" {mode!r}); put the file on a local file system"
                )

    def _create_tables(self, conn: sqlite3.Connection) -> None:
        # One BEGIN IMMEDIATE transaction: the write lock is taken before the version is
        # read, so of the openers of a new file one creates the tables and the others
        # find them, version included (or none of it, if this one fails).
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TABLE IF NOT EXISTS broker_jobs_schema (version INTEGER NOT NULL)")
        (version,) = conn.execute("SELECT max(version) FROM broker_jobs_schema").fetchone()
        if version is None:
            for statement in (*_CREATE, *_CREATE_EXECUTIONS, _CREATE_PAYLOADS):
                conn.execute(statement)
            conn.execute("INSERT INTO broker_jobs_schema (version) VALUES (?)", (SCHEMA_VERSION,))
        elif version < SCHEMA_VERSION:
            self._upgrade(conn, version)
        elif version > SCHEMA_VERSION:
            conn.execute("ROLLBACK")
            raise StoreError(
                f"SQLite store {str(self.path)!r} was created by a newer broker-jobs"
                f" (schema version {version}; this one knows up to {SCHEMA_VERSION})."
                " Upgrade broker-jobs on this host, or use another file"
            )
        for statement in (*_CREATE_BEAT, *_CREATE_JOB_ID_INDEX, *_CREATE_LEDGER_INDEXES):
            conn.execute(statement)
        conn.execute("COMMIT")

    def _upgrade(self, conn: sqlite3.Connection, version: int) -> None:
        """Migrate a file of ``version`` to :data:`SCHEMA_VERSION`, step by step, in the
        caller's transaction."""
        steps = {
            1: (_MIGRATE_1_TO_2, "executions"),
            2: (_MIGRATE_2_TO_3, "ledger statuses"),
            3: (_MIGRATE_3_TO_4, "payloads"),
        }
        for start in range(version, SCHEMA_VERSION):
            statements, what = steps[start]
            for statement in statements:
                conn.execute(statement)
            log.info("%r migrated from schema version %d to %d (%s)", self, start, start + 1, what)

    # --- the hot path: claim and finish without the generic sections -------------------

    def claim(self, job: Job, worker: str, lease: float, *, now: datetime | None = None) -> Claim:
        (claim,) = self._claim_all([(job, worker)], check_lease(lease), utc(now))
        return claim

    def claim_many(self, claims: Sequence[tuple[Job, str]], lease: float) -> list[Claim]:
        # Few statements per batch: each hands the GIL back and forth (under load that
        # cost the start of a job up to milliseconds per statement).
        return self._claim_all(claims, check_lease(lease), utc(None))

    def try_claim_many(self, claims: Sequence[tuple[Job, str]], lease: float) -> list[Claim] | None:
        # The common case only (a few jobs, every key new), with one INSERT that waits
        # for nothing: not for this process's store thread (it holds _serving while it
        # serves), not for another process (busy timeout 0), not for a checkpoint.
        lease = check_lease(lease)
        if len(claims) > _AT_ONCE_ROWS:
            return None
        if len({job.idempotency_key for job, _ in claims}) != len(claims):
            return None  # two copies of a job: the long way decides the second one
        if not self._serving.acquire(blocking=False):
            return None
        try:
            conn = self._connection("NORMAL", wait=False)
            fresh = _insert_fresh(conn, claims, lease, utc(None))
        except (sqlite3.Error, StoreError):  # busy, or worse: claim_many meets it again
            return None
        finally:
            self._serving.release()
        if len(fresh) != len(claims):  # a key seen before; the new ones are inserted
            return None  # all the same, under their holders: claim_many finds them ours
        return [Claim(ClaimOutcome.CLAIMED, fresh[job.idempotency_key]) for job, _ in claims]

    def _claim_all(
        self, claims: Sequence[tuple[Job, str]], lease: float, moment: datetime
    ) -> list[Claim]:
        # synchronous=NORMAL: a claim lost to a power cut only lets the (unacked,
        # redelivered) job be claimed again; the next FULL commit of an outcome makes
        # the WAL, claims included, durable.
        results: list[Claim | None] = [None] * len(claims)
        with self._translate("change a record"):  # the common case: keys never seen
            fresh = _insert_fresh(self._connection("NORMAL"), claims, lease, moment)
        for index, (job, _) in enumerate(claims):
            record = fresh.pop(job.idempotency_key, None)  # a second copy: below
            if record is not None:
                results[index] = Claim(ClaimOutcome.CLAIMED, record)
        rest = [index for index, found in enumerate(results) if found is None]
        if rest:  # redeliveries, retries, copies: read, decide, write, atomically
            with self._transaction("change a record", "NORMAL") as conn:
                decided = _claim_rows(conn, [claims[index] for index in rest], lease, moment)
            for index, claim in zip(rest, decided, strict=True):
                results[index] = claim
        return [claim for claim in results if claim is not None]

    def succeed_many(self, finished: Sequence[tuple[str, str]]) -> list[str]:
        # One UPDATE for the batch (one statement: one commit, one GIL hand-back);
        # which leases were lost is looked up only if some were.
        moment = _text(utc(None))
        assert moment is not None
        conn = getattr(self._local, "batch", None)
        if conn is None and len(finished) <= _PAIRS_PER_UPDATE:
            conn = self._connection()  # autocommit: the one UPDATE is atomic on its own
        if conn is not None:
            with self._translate("record successes"):
                return _succeed_rows(conn, finished, moment)
        with self._transaction("record successes") as conn:
            return _succeed_rows(conn, finished, moment)

    def _finish(
        self,
        key: str,
        worker: str,
        action: str,
        *,
        now: datetime | None,
        status: Status,
        error: str | None = None,
        due_at: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        # One UPDATE guarded by the lease: atomic on its own (autocommit). A payload
        # to keep is a second statement: in the store thread's batch, or in a
        # transaction of its own (the outcome and its payload commit together).
        moment = utc(now)
        stored = payload_text(payload)
        batch = getattr(self._local, "batch", None)
        if batch is None and stored is not None:
            with self._transaction("change a record") as conn:
                updated = _finish_row(conn, key, worker, status, moment, error, due_at, stored)
        else:
            conn = batch or self._connection()
            started = time.monotonic()
            try:
                updated = _finish_row(conn, key, worker, status, moment, error, due_at, stored)
            except sqlite3.Error as exc:
                waited = time.monotonic() - started
                raise self._store_error("change a record", exc, waited) from exc
        if not updated:
            raise LeaseLostError(key, worker, self.get(key), action)

    # --- group commit -----------------------------------------------------------------

    #: Methods that may share one transaction with others (they write nothing before
    #: they can fail with LeaseLostError or ValueError, so one failing leaves the
    #: others intact).
    _BATCHABLE = frozenset(
        {"succeed", "succeed_many", "retry", "fail", "record_fire", "record_leader"}
    )
    #: Those whose commit may be synchronous=NORMAL (a loss to a power cut is harmless,
    #: see claim); a batch holding any other commits with FULL.
    _LAZY = frozenset({"record_leader"})
    #: Served first, all queued ``claim_many`` calls as one (one statement for the
    #: keys never seen): a job's start waits neither for the outcomes queued with it
    #: nor for their fsync.
    _CLAIMS = frozenset({"claim", "claim_many"})

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``getattr(self, name)(*args, **kwargs)`` on the store's thread (see
        :meth:`submit`)."""
        return await self.submit(name, *args, **kwargs)

    def submit(
        self,
        name: str,
        *args: Any,
        after: Callable[[Any], None] | None = None,
        **kwargs: Any,
    ) -> asyncio.Future[Any]:
        """Queue ``getattr(self, name)(*args, **kwargs)`` for the store's thread at
        once; the future (of the running loop) gets its result. What waits together
        is served together: the claims first, then the outcomes in one transaction
        (docs/store.md); each future is settled only after its commit.
        ``after(result)``, if given, runs on the store's thread once the result is
        committed, before the loop hears of it (the worker starts claimed jobs from
        there: a hop through the loop costs milliseconds)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._serve, name="broker-jobs-store", daemon=True
                    )
                    self._thread.start()
        self._queue.put(_Call(loop, future, name, args, kwargs, after))
        return future

    def _serve(self) -> None:
        while (calls := self._take_calls()) is not None:
            self._serve_calls(calls)

    def _serve_calls(self, calls: list[_Call]) -> None:
        """Claims first (those that can, as one), then the outcomes in one transaction."""
        claims = [c for c in calls if c.name in self._CLAIMS]
        lazy = [c for c in calls if c.name in self._LAZY]
        durable = [c for c in calls if c.name in self._BATCHABLE and c.name not in self._LAZY]
        others = [c for c in calls if c.name not in self._BATCHABLE and c.name not in self._CLAIMS]
        many = [c for c in claims if c.name == "claim_many" and not c.kwargs]
        together = [c for c in many if c.args[1] == many[0].args[1]]  # same lease
        if together:
            self._answer(self._holding(self._claim_together, together))
        for call in claims:
            if call not in together:
                self._answer(self._holding(self._run_alone, call))
        for batch in (lazy, durable):
            if len(batch) == 1:  # its own statement(s), without BEGIN and COMMIT
                self._answer(self._holding(self._run_alone, batch[0]))
            elif batch:
                self._answer(self._holding(self._run_batch, batch))
        for call in others:
            self._answer(self._holding(self._run_alone, call))

    def _holding(
        self, run: Callable[[Any], list[tuple[_Call, bool, Any]]], calls: Any
    ) -> list[tuple[_Call, bool, Any]]:
        """``run(calls)`` while holding :attr:`_serving`; answered after: a claim the
        worker's loop tries meanwhile need not go the long way."""
        with self._serving:
            return run(calls)

    def _claim_together(self, calls: list[_Call]) -> list[tuple[_Call, bool, Any]]:
        """The queued ``claim_many`` calls as one (one INSERT for their fresh keys)."""
        try:
            pairs = [pair for call in calls for pair in call.args[0]]
            claims = self.claim_many(pairs, calls[0].args[1])
        except BaseException as error:
            return [(call, False, error) for call in calls]
        results: list[tuple[_Call, bool, Any]] = []
        start = 0
        for call in calls:
            end = start + len(call.args[0])
            results.append((call, True, claims[start:end]))
            start = end
        return results

    def _run_alone(self, call: _Call) -> list[tuple[_Call, bool, Any]]:
        try:
            return [(call, True, call.run(self))]
        except BaseException as error:
            return [(call, False, error)]

    @staticmethod
    def _answer(results: list[tuple[_Call, bool, Any]]) -> None:
        """Run the follow-ups on this thread, then settle the callers' futures (one
        wake-up per event loop)."""
        for call, ok, value in results:
            if ok and call.after is not None:
                try:
                    call.after(value)
                except Exception:
                    log.exception("a store call's follow-up %r failed", call.after)
        by_loop: dict[Any, list[tuple[Any, bool, Any]]] = {}
        for call, ok, value in results:
            by_loop.setdefault(call.loop, []).append((call.future, ok, value))
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(_settle, settled)

    def _take_calls(self) -> list[_Call] | None:
        """The next call and all queued behind it; None once the store is closed."""
        call = self._queue.get()
        if call is None:
            return None
        calls = [call]
        while True:
            try:
                more = self._queue.get_nowait()
            except _queue.Empty:
                return calls
            if more is None:
                self._queue.put(None)  # seen again by the next take
                return calls
            calls.append(more)

    def _run_batch(self, batch: list[_Call]) -> list[tuple[_Call, bool, Any]]:
        durable = any(c.name not in self._LAZY for c in batch)
        try:
            conn = self._connection("FULL" if durable else "NORMAL")
        except BaseException as error:
            return [(c, False, error) for c in batch]
        results: list[tuple[_Call, bool, Any]] = []
        started = time.monotonic()
        try:
            conn.execute("BEGIN IMMEDIATE")
            self._local.batch = conn
            try:
                for call in batch:
                    try:
                        results.append((call, True, call.run(self)))
                    except (LeaseLostError, ValueError) as error:
                        results.append((call, False, error))
            finally:
                self._local.batch = None
            conn.execute("COMMIT")
        except BaseException as error:
            if conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if isinstance(error, sqlite3.Error):
                error = self._store_error("change a record", error, time.monotonic() - started)
            return [(c, False, error) for c in batch]
        return results

    # --- queries ------------------------------------------------------------------

    def _select(self, where: str, params: Any, tail: str = "") -> list[JobRecord]:
        conn = self._connection()
        with self._translate("read records"):
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM broker_jobs_records {where} {tail}", params
            ).fetchall()
        return [_record(row) for row in rows]

    def get(self, key: str) -> JobRecord | None:
        found = self._select("WHERE idempotency_key = ?", (key,))
        return found[0] if found else None

    def kept_payload(self, key: str) -> KeptPayload | None:
        conn = self._connection()
        with self._translate("read a payload"):
            row = conn.execute(_KEPT_PAYLOAD, (key,)).fetchone()
        if row is None:
            return None
        text, size, kept_at = row
        return read_payload(text, size, _aware_time(kept_at))

    def get_by_job_id(self, job_id: str) -> list[JobRecord]:
        # Two lookups, each by an index: the record keyed by the job id itself, and
        # the others (the job-id index holds only those).
        conn = self._connection()
        with self._translate("read records"):
            rows = conn.execute(_BY_JOB_ID, (job_id, job_id, job_id)).fetchall()
        return [_record(row) for row in rows]

    def find(
        self,
        *,
        status: Status | None = None,
        task: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        key: str | None = None,
        after: tuple[datetime, str] | None = None,
        limit: int = 100,
    ) -> list[JobRecord]:
        check_limit(limit)
        where, params = Filters.of(
            status=status, task=task, since=since, until=until, key=key, after=after
        ).sql(_DIALECT)
        return self._select(where, {**params, "limit": limit}, f"{_NEWEST_FIRST} LIMIT :limit")

    def counts(self) -> dict[Status, int]:
        conn = self._connection()
        with self._translate("count records"):
            rows = conn.execute(
                "SELECT status, count(*) FROM broker_jobs_records GROUP BY status"
            ).fetchall()
        counts = dict.fromkeys(Status, 0)
        counts.update({Status(status): n for status, n in rows})
        return counts

    def executions(self, key: str) -> list[Execution]:
        conn = self._connection()
        with self._translate("read executions"):
            rows = conn.execute(
                f"SELECT {_EXECUTION_COLUMNS} FROM broker_jobs_executions"
                " WHERE idempotency_key = ? ORDER BY number",
                (key,),
            ).fetchall()
        return [_execution(row) for row in rows]

    def task_summaries(self, *, now: datetime | None = None) -> dict[str, TaskSummary]:
        """See :meth:`Store.task_summaries`. p50 and p99 are computed here from the
        durations of the task's newest :data:`MAX_SUMMARY_DURATIONS` executions of
        the last hour (the counts are of them all)."""
        params = {**window_params(utc(now), _text), "cap": MAX_SUMMARY_DURATIONS}
        conn = self._connection()
        with self._translate("summarise the tasks"):
            tallies = tally_records(conn.execute(_COUNTS, params), _time)
            for task, *counts in conn.execute(_FINISHED_COUNTS, params):
                tallies.setdefault(task, Tally()).add_counts(*counts)  # added in between
            for task, started, finished in conn.execute(_DURATIONS, params):
                duration = _aware_time(finished) - _aware_time(started)
                tallies.setdefault(task, Tally()).durations.append(duration)
        return summaries(tallies)

    def outcome_buckets(
        self, *, since: datetime, bucket: timedelta, now: datetime | None = None
    ) -> dict[str, list[tuple[int, int]]]:
        buckets = Buckets.of(since, bucket, utc(now))
        conn = self._connection()
        with self._translate("count the outcomes by time"):
            rows = conn.execute(_BUCKETS, buckets.params(_text)).fetchall()
        return buckets.gather(rows)

    def prune(self, older_than: datetime) -> int:
        params = (*sorted(s.value for s in TERMINAL), _text(utc(older_than)))
        marks = ", ".join("?" * len(TERMINAL))
        doomed = f"status IN ({marks}) AND updated_at < ?"
        with self._transaction("prune records") as conn:
            for table in ("broker_jobs_executions", "broker_jobs_payloads"):
                conn.execute(
                    f"DELETE FROM {table} WHERE idempotency_key IN"
                    f" (SELECT idempotency_key FROM broker_jobs_records WHERE {doomed})",
                    params,
                )
            return conn.execute(f"DELETE FROM broker_jobs_records WHERE {doomed}", params).rowcount

    # --- beat records -------------------------------------------------------------

    def _write(
        self, statement: str, params: tuple[Any, ...], synchronous: str, action: str
    ) -> None:
        """One statement, atomic on its own: in the store thread's batch when there is
        one (it commits with the batch), else autocommitted."""
        with self._translate(action):
            conn = getattr(self._local, "batch", None) or self._connection(synchronous)
            conn.execute(statement, params)

    def record_fire(self, schedule: str, fire_at: datetime) -> None:
        # synchronous=FULL, as for outcomes: a fire lost to a power cut would be emitted
        # again by the beat's catch-up.
        self._write(_RECORD_FIRE, (schedule, _text(utc(fire_at))), "FULL", "record a fire")

    def last_fire(self, schedule: str) -> datetime | None:
        conn = self._connection()
        with self._translate("read the beat's fires"):
            row = conn.execute(
                "SELECT fire_at FROM broker_jobs_beat_fires WHERE schedule = ?", (schedule,)
            ).fetchone()
        return _time(row[0]) if row else None

    def last_fires(self, prefix: str = "") -> dict[str, datetime]:
        conn = self._connection()
        with self._translate("read the beat's fires"):
            rows = conn.execute(
                "SELECT schedule, fire_at FROM broker_jobs_beat_fires"
                " WHERE substr(schedule, 1, length(?1)) = ?1 ORDER BY schedule",
                (prefix,),
            ).fetchall()
        return {schedule: _aware_time(fire_at) for schedule, fire_at in rows}

    def record_leader(
        self, group: str, identity: str, since: datetime, *, now: datetime | None = None
    ) -> None:
        # synchronous=NORMAL: the record is re-announced periodically; losing the last
        # one to a power cut only shows an older announcement.
        params = (group, identity, _text(utc(since)), _text(utc(now)))
        self._write(_RECORD_LEADER, params, "NORMAL", "record the beat leader")

    def leader(self, group: str) -> LeaderRecord | None:
        conn = self._connection()
        with self._translate("read the beat leader"):
            row = conn.execute(
                "SELECT group_name, identity, since, seen_at FROM broker_jobs_beat_leaders"
                " WHERE group_name = ?",
                (group,),
            ).fetchone()
        if row is None:
            return None
        name, identity, since, seen_at = row
        return LeaderRecord(name, identity, _aware_time(since), _aware_time(seen_at))

    def close(self) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self._queue.put(None)
            thread.join()
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()


_NEWEST_FIRST = "ORDER BY updated_at DESC, idempotency_key DESC"
_BY_JOB_ID = (
    f"SELECT {_COLUMNS} FROM broker_jobs_records WHERE idempotency_key = ? AND job_id = ?"
    f" UNION ALL SELECT {_COLUMNS} FROM broker_jobs_records"
    f" WHERE job_id = ? AND job_id <> idempotency_key {_NEWEST_FIRST}"
)


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
        self._conn.execute(_SAVE, _row(record))

    def keep_payload(self, key: str, payload: PayloadText, now: datetime) -> None:
        self._conn.execute(_KEEP_PAYLOAD, (key, payload.text, payload.size, _text(now)))


_SELECT_MANY = f"SELECT {_COLUMNS} FROM broker_jobs_records WHERE idempotency_key IN"
_INSERT_FRESH = f"INSERT INTO broker_jobs_records ({_COLUMNS}) VALUES"
_ROW_MARKS = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_ON_CONFLICT = "ON CONFLICT (idempotency_key) DO NOTHING"
_SUCCEED_MANY = (
    "UPDATE broker_jobs_records SET status = ?, updated_at = ?, lease_until = NULL, due_at = NULL"
    " WHERE status = 'running' AND (idempotency_key, worker) IN (VALUES"
)
_SUCCEEDED_BY = (
    "SELECT status, worker, updated_at FROM broker_jobs_records WHERE idempotency_key = ?"
)
#: Rows per statement (SQLite before 3.32 allows 999 parameters per statement).
_MAX_PARAMETERS = 500
_ROWS_PER_INSERT = 80
#: The most jobs :meth:`SQLiteStore.try_claim_many` claims at once (it runs on the
#: worker's event loop, which waits for it); larger batches go the store thread's way.
_AT_ONCE_ROWS = 80
_PAIRS_PER_UPDATE = 400
_SAVE = (
    f"INSERT OR REPLACE INTO broker_jobs_records ({_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_FINISH = (
    "UPDATE broker_jobs_records SET status = ?, updated_at = ?, lease_until = NULL, due_at = ?"
    " WHERE idempotency_key = ? AND status = 'running' AND worker = ?"
)
_FINISH_ERROR = (
    "UPDATE broker_jobs_records SET status = ?, updated_at = ?, lease_until = NULL,"
    " last_error = ?, due_at = ? WHERE idempotency_key = ? AND status = 'running' AND worker = ?"
)
#: The first payload kept for a key wins.
_KEEP_PAYLOAD = (
    "INSERT INTO broker_jobs_payloads (idempotency_key, payload, bytes, kept_at)"
    " VALUES (?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING"
)
_KEPT_PAYLOAD = "SELECT payload, bytes, kept_at FROM broker_jobs_payloads WHERE idempotency_key = ?"

_RECORD_FIRE = (
    "INSERT INTO broker_jobs_beat_fires (schedule, fire_at) VALUES (?, ?)"
    " ON CONFLICT (schedule) DO UPDATE SET fire_at = excluded.fire_at"
    " WHERE excluded.fire_at > broker_jobs_beat_fires.fire_at"  # fixed-width UTC text
)
_RECORD_LEADER = (
    "INSERT OR REPLACE INTO broker_jobs_beat_leaders (group_name, identity, since, seen_at)"
    " VALUES (?, ?, ?, ?)"
)


def _finish_row(  # noqa: PLR0917 - the columns of one outcome
    conn: sqlite3.Connection,
    key: str,
    worker: str,
    status: Status,
    moment: datetime,
    error: str | None,
    due_at: datetime | None,
    payload: PayloadText | None,
) -> bool:
    """Record the outcome of ``worker``'s hold of ``key`` (and keep ``payload`` if
    the key has none); False when ``worker`` does not hold it (nothing written)."""
    if error is None:
        cursor = conn.execute(_FINISH, (status.value, _text(moment), _text(due_at), key, worker))
    else:
        cursor = conn.execute(
            _FINISH_ERROR,
            (status.value, _text(moment), clip_error(error), _text(due_at), key, worker),
        )
    if cursor.rowcount != 1:
        return False
    if payload is not None:
        conn.execute(_KEEP_PAYLOAD, (key, payload.text, payload.size, _text(moment)))
    return True


def _row(record: JobRecord) -> tuple[Any, ...]:
    return (
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
    )


@dataclass(frozen=True, eq=False)  # compared by identity: args may hold large jobs
class _Call:
    """A call waiting for the store's thread (see :meth:`SQLiteStore.call`)."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    after: Callable[[Any], None] | None

    def run(self, store: SQLiteStore) -> Any:
        return getattr(store, self.name)(*self.args, **self.kwargs)


def _settle(settled: list[tuple[Any, bool, Any]]) -> None:
    for future, ok, value in settled:
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


#: SQLite's primary result codes that mean "the database cannot be used now", not "the
#: statement is wrong": busy or locked, disk full, I/O error, cannot open, read-only.
_OUTAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_READONLY,
    }
)


def _is_outage(error: BaseException) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(error, sqlite3.Error) and code is not None and code & 0xFF in _OUTAGE_CODES


def _is_busy(error: sqlite3.Error) -> bool:
    """SQLITE_BUSY (extended codes included): another connection holds the file's lock."""
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _text(moment: datetime | None) -> str | None:
    """Fixed-width UTC ISO text: SQL compares and orders it as time."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text is not None else None


def _aware_time(text: str) -> datetime:
    moment = _time(text)
    assert moment is not None  # NOT NULL columns
    return moment


# The ledger's queries (they need _text).
_DIALECT = Dialect(
    mark=lambda name: f":{name}",
    key="idempotency_key",  # BINARY: UTF-8 bytes, in code point order
    starts_with="substr(idempotency_key, 1, length({prefix})) = {prefix}",
    time=_text,
)
_TABLES = {"records": "broker_jobs_records", "executions": "broker_jobs_executions"}
_MARKS = {name: f":{name}" for name in ("now", "minute", "hour")}
_COUNTS = COUNTS_SQL.format(**_TABLES, **_MARKS)
_FINISHED_COUNTS = FINISHED_COUNTS_SQL.format(**_TABLES, **_MARKS, more="")
#: ``finished_at`` in microseconds since the epoch, exactly: whole seconds from
#: strftime, the six digits of the fixed-width text after them (SQLite's date
#: functions keep milliseconds only, which would move executions across a bucket's end).
_FINISHED_US = (
    "(CAST(strftime('%s', e.finished_at) AS INTEGER) * 1000000"
    " + CAST(substr(e.finished_at, 21, 6) AS INTEGER))"
)
_BUCKETS = BUCKETS_SQL.format(
    **_TABLES,
    now=":now",
    since=":since",
    since_us=":since_us",
    width_us=":width_us",
    finished_us=_FINISHED_US,
)
#: The durations behind p50/p99, the newest first, at most :cap per task.
_DURATIONS = (
    "SELECT task, started_at, finished_at FROM (SELECT r.task, e.started_at, e.finished_at,"
    " row_number() OVER (PARTITION BY r.task ORDER BY e.finished_at DESC) AS n "
    + FINISHED_SQL.format(**_TABLES, **_MARKS)
    + ") WHERE n <= :cap"
)


def _claim_rows(
    conn: sqlite3.Connection, claims: Sequence[tuple[Job, str]], lease: float, moment: datetime
) -> list[Claim]:
    """Claim in order inside the caller's transaction; a key twice in the batch is
    decided against the first copy's claim."""
    records: dict[str, JobRecord] = {}
    keys = list(dict.fromkeys(job.idempotency_key for job, _ in claims))
    for start in range(0, len(keys), _MAX_PARAMETERS):
        chunk = keys[start : start + _MAX_PARAMETERS]
        marks = ", ".join("?" * len(chunk))
        for row in conn.execute(f"{_SELECT_MANY} ({marks})", chunk):
            records[row[0]] = _record(row)
    results: list[Claim] = []
    saves: dict[str, tuple[Any, ...]] = {}
    for job, worker in claims:
        key = job.idempotency_key
        record = records.get(key)
        outcome = decide(record, job, worker, moment)
        if outcome is not ClaimOutcome.CLAIMED:
            assert record is not None
            results.append(Claim(outcome, record))
            continue
        new = claimed_record(record, job, worker, lease, moment)
        records[key] = new
        saves[key] = _row(new)
        results.append(Claim(outcome, new))
    if saves:
        conn.executemany(_SAVE, saves.values())
    return results


def _insert_fresh(
    conn: sqlite3.Connection, claims: Sequence[tuple[Job, str]], lease: float, moment: datetime
) -> dict[str, JobRecord]:
    """Claim keys that have no record yet with one autocommitted INSERT per chunk
    (atomic on its own); the new records by key, for the chunks where every key was
    new. The others (a key with a record, a second copy in the batch, a chunk with
    one of those) are left to the caller's long way, which finds the keys inserted
    here already ours. No RETURNING: each row fetched would hand the GIL back once
    more."""
    # Each new key's record and its row; the times written once per batch (_row's four
    # conversions cost ~11 us per job, on the loop, before the jobs start).
    fresh: dict[str, tuple[JobRecord, tuple[Any, ...]]] = {}
    now, lease_until = _text(moment), _text(moment + timedelta(seconds=lease))
    for job, worker in claims:
        if job.idempotency_key not in fresh:
            record = claimed_record(None, job, worker, lease, moment)
            fresh[job.idempotency_key] = (record, _fresh_row(job, worker, now, lease_until))
    entries = list(fresh.values())
    claimed: dict[str, JobRecord] = {}
    for start in range(0, len(entries), _ROWS_PER_INSERT):
        chunk = entries[start : start + _ROWS_PER_INSERT]
        values = ", ".join([_ROW_MARKS] * len(chunk))
        params = [value for _, row in chunk for value in row]
        if conn.execute(f"{_INSERT_FRESH} {values} {_ON_CONFLICT}", params).rowcount == len(chunk):
            claimed.update((record.idempotency_key, record) for record, _ in chunk)
    return claimed


def _fresh_row(job: Job, worker: str, now: str | None, lease_until: str | None) -> tuple[Any, ...]:
    """``_row(claimed_record(None, job, worker, lease, moment))``, its times given as text."""
    return (
        job.idempotency_key,
        job.id,
        job.task,
        Status.RUNNING.value,
        job.attempt,
        now,  # created_at
        now,  # updated_at
        worker,
        lease_until,
        None,  # last_error
        None,  # due_at
    )


def _succeed_rows(
    conn: sqlite3.Connection, finished: Sequence[tuple[str, str]], moment: str
) -> list[str]:
    """Record successes inside the caller's transaction; the keys whose lease was lost."""
    updated = 0
    for start in range(0, len(finished), _PAIRS_PER_UPDATE):
        chunk = finished[start : start + _PAIRS_PER_UPDATE]
        pairs = ", ".join(["(?, ?)"] * len(chunk))
        params = [Status.SUCCEEDED.value, moment, *(value for pair in chunk for value in pair)]
        updated += conn.execute(f"{_SUCCEED_MANY} {pairs})", params).rowcount
    if updated == len(finished):
        return []
    lost = []
    for key, worker in finished:
        found = conn.execute(_SUCCEEDED_BY, (key,)).fetchone()
        if found is None or tuple(found) != (Status.SUCCEEDED.value, worker, moment):
            lost.append(key)
    return lost


def _execution(row: tuple[Any, ...]) -> Execution:
    key, job_id, attempt, worker, started, finished, outcome, error = row
    return Execution(
        idempotency_key=key,
        job_id=job_id,
        attempt=attempt,
        worker=worker,
        started_at=_aware_time(started),
        finished_at=_time(finished),
        outcome=ExecutionOutcome(outcome) if outcome is not None else None,
        error=error,
    )


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
