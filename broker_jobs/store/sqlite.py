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

The ledger's index of dead letters is one more table: an entry is written in the
transaction of the record that makes its job dead, and read with one query per page.

Why some 850 lines: each method of :class:`~broker_jobs.store.base.Store` is a few
lines around one statement, kept together so that one reads how this store meets the
contract; the SQL (and the records of a section, on its connection) lives in
``sqlite_statements``, the schema in ``sqlite_schema``, the store thread's group
commit in ``sqlite_batching``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from os import PathLike
from pathlib import Path
from typing import Any

from broker_jobs.dead_letter import DeadLetter, DeadLetterFilter
from broker_jobs.envelope import Job
from broker_jobs.fork_watch import ForkWatch
from broker_jobs.store.controls import StopRequest, TaskPause
from broker_jobs.store.dead_letter_index import IndexedDeadLetter, read_entry, where_sql
from broker_jobs.store.depths import (
    DepthSeries,
    cutoffs,
    depth_rows,
    series_by_task,
    step_seconds,
)
from broker_jobs.store.errors import LeaseLostError, StoreError, StoreUnavailableError
from broker_jobs.store.exclusive import ExclusiveStore, Records
from broker_jobs.store.ledger import (
    Buckets,
    Filters,
    Tally,
    summaries,
    tally_records,
    window_params,
)
from broker_jobs.store.processes import ProcessRecord, process_document, process_of
from broker_jobs.store.records import (
    TERMINAL,
    Claim,
    ClaimOutcome,
    Execution,
    Finish,
    JobRecord,
    KeptOutput,
    KeptPayload,
    LeaderRecord,
    Output,
    Status,
    TaskSummary,
)
from broker_jobs.store.rows import (
    execution_of,
    kept_output_of,
    kept_payload_of,
    leader_of,
    status_counts,
)
from broker_jobs.store.sqlite_batching import Call, StoreThread
from broker_jobs.store.sqlite_fork_gate import SQLiteForkGate
from broker_jobs.store.sqlite_schema import SCHEMA_VERSION, create_tables, use_wal
from broker_jobs.store.sqlite_statements import (
    _AT_ONCE_ROWS,
    _BUCKETS,
    _BY_JOB_ID,
    _CLEAR_STOP,
    _COLUMNS,
    _COUNT_STATUSES,
    _COUNTS,
    _DEPTHS,
    _DIALECT,
    _DURATIONS,
    _EXECUTIONS_OF,
    _FINISHED_COUNTS,
    _FOLLOW_UPS_SENT,
    _FORGET_DEPTHS,
    _FORGET_PROCESSES,
    _KEPT_OUTPUT,
    _KEPT_PAYLOAD,
    _LAST_FIRE,
    _LAST_FIRES,
    _LEADER,
    _LETTER_COUNTS,
    _LETTER_DIALECT,
    _LETTER_MARK,
    _LETTERS,
    _PAIRS_PER_UPDATE,
    _PAUSE,
    _PAUSE_OF,
    _PROCESSES,
    _RECORD_DEPTH,
    _RECORD_FIRE,
    _RECORD_LEADER,
    _RECORD_PROCESS,
    _REQUEST_STOP,
    _RESUME,
    _STOPS_OF,
    _SWEEP_LETTERS,
    _UNINDEX_LETTER,
    _aware_time,
    _claim_rows,
    _finish_row,
    _insert_fresh,
    _keep_successes,
    _record,
    _SQLiteRecords,
    _succeed_rows,
    _text,
    _time,
)
from broker_jobs.store.values import check_lease, leader_schedules_text, utc

__all__ = ["SQLiteStore", "SCHEMA_VERSION", "DEFAULT_BUSY_TIMEOUT", "MAX_SUMMARY_DURATIONS"]

log = logging.getLogger(__name__)

#: A key prefix with at most this many matches is listed through the primary key.
FEW_KEYS = 10_000


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
        self._calls = StoreThread(self)  # started by the first submit
        #: Entered around every span inside SQLite: a fork waits for them to end.
        self._gate = SQLiteForkGate.of_process()
        #: The parent's connections, in a forked child: kept, never used nor closed.
        self._inherited: list[object] = []
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise
        ForkWatch.add(self)

    def after_fork_in_child(self) -> None:
        """(:class:`~broker_jobs.fork_watch.ForkWatch`) In a forked child: connections
        of its own from now on. SQLite must not use, nor close, across a fork what it
        opened before (its locks are the parent's), so those are kept, untouched."""
        self._inherited.append((self._local, self._connections))
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections = []
        self._calls = StoreThread(self)  # the parent's thread did not come along

    def is_outage(self, error: BaseException) -> bool:
        return _is_outage(error)

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    # --- connections and transactions ---------------------------------------------

    def _connection(self, synchronous: str = "FULL", *, wait: bool = True) -> sqlite3.Connection:
        """This thread's connection. ``wait=False``: one that never waits: SQLITE_BUSY
        at once when another connection writes, and no checkpoint after its commits
        (a checkpoint flushes the file: milliseconds); the others checkpoint."""
        mine = self._thread_connections()
        if getattr(self._local, "reopen", False):
            self._drop_thread_connections(mine)
        conn = mine.get((synchronous, wait))
        if conn is not None and not self._closed:
            return conn
        with self._lock:
            if self._closed:
                raise StoreError(f"{self!r} is closed; open a new store")
            with self._translate("open"):
                _create_private(self.path)
                conn = _open(self.path, self._busy_timeout if wait else 0)
                try:
                    conn.execute(f"PRAGMA synchronous = {synchronous}")
                    if not wait:
                        conn.execute("PRAGMA wal_autocheckpoint = 0")
                except BaseException:
                    conn.close()
                    raise
            self._connections.append(conn)
        mine[(synchronous, wait)] = conn
        return conn

    def _thread_connections(self) -> dict[tuple[str, bool], sqlite3.Connection]:
        """This thread's connections, by (synchronous, wait)."""
        mine: dict[tuple[str, bool], sqlite3.Connection] | None
        mine = getattr(self._local, "connections", None)
        if mine is None:
            mine = self._local.connections = {}
        return mine

    def _reopen_if_read_only(self, error: BaseException | None) -> None:
        """After SQLITE_READONLY (``error`` or its cause), have this thread's
        connections opened again at their next use.

        SQLite opens a file it cannot write (a read-only mount, a file of another
        owner or mode) read-only, without a word, and such a connection stays
        read-only once the file is writable again: kept, it would fail every write
        for the life of the store, and the worker hold its jobs forever."""
        while error is not None:
            if _is_read_only(error):
                self._local.reopen = True
                return
            error = error.__cause__

    def _drop_thread_connections(self, mine: dict[tuple[str, bool], sqlite3.Connection]) -> None:
        """Close this thread's connections but the one of a transaction in progress
        (the store thread's batch, an open section: dropped at the next call)."""
        batch = getattr(self._local, "batch", None)
        idle = {kind: c for kind, c in mine.items() if c is not batch and not _in_transaction(c)}
        for kind in idle:
            del mine[kind]
        self._local.reopen = len(mine) > 0
        with self._lock:
            self._connections = [c for c in self._connections if c not in idle.values()]
        with self._gate:
            for conn in idle.values():
                conn.close()

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """A span inside SQLite (a fork waits for it to end: ``sqlite_fork_gate``);
        sqlite3 errors -> StoreError saying what happened and what to do."""
        started = time.monotonic()
        try:
            with self._gate:
                yield
        except sqlite3.Error as error:
            raise self._store_error(action, error, time.monotonic() - started) from error

    def _store_error(
        self, action: str, error: sqlite3.Error, waited: float | None = None, tries: int = 1
    ) -> StoreError:
        """``waited``: the seconds spent on the step that failed (all its ``tries``).
        A :class:`StoreUnavailableError` for an outage (locked, full, an I/O error),
        except a file that cannot be opened at all (a missing directory: to fix)."""
        self._reopen_if_read_only(error)
        described = self._described(action, error, waited, tries)
        if _is_outage(error) and not _is_cant_open(error):
            return StoreUnavailableError(str(described))
        return described

    def _described(
        self, action: str, error: sqlite3.Error, waited: float | None, tries: int
    ) -> StoreError:
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
        if _is_read_only(error):
            return StoreError(
                f"{where}: cannot {action}: {text}. The file or its directory (SQLite"
                " writes -wal and -shm files beside it) is read-only for this process: a"
                " read-only mount, or their mode or owner; make them writable by the"
                " worker, which opens the file again at its next try"
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
            except BaseException as error:  # a transactional handler's own, too
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                self._reopen_if_read_only(error)
                raise
            conn.execute("COMMIT")

    @contextmanager
    def _exclusive(self, action: str = "change a record") -> Iterator[Records]:
        with self._transaction(action) as conn:
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
        with self._gate:
            self._migrate_on(self._connection())

    def _migrate_on(self, conn: sqlite3.Connection) -> None:
        where = f"SQLite store {str(self.path)!r}"
        started = time.monotonic()
        pause = _OPEN_FIRST_PAUSE
        tries = 0
        while True:
            tries += 1
            step = "switch the file to WAL mode"
            try:
                use_wal(conn, where)
                step = "create the tables"
                create_tables(conn, self, where)
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
        if not self._calls.serving.acquire(blocking=False):
            return None
        try:
            with self._gate:
                conn = self._connection("NORMAL", wait=False)
                fresh = _insert_fresh(conn, claims, lease, utc(None))
        except (sqlite3.Error, StoreError) as error:  # busy, or worse: claim_many meets it
            self._reopen_if_read_only(error)  # again; a read-only connection is not kept
            return None
        finally:
            self._calls.serving.release()
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

    def succeed_many_keeping(self, finished: Sequence[tuple[str, str, Output]]) -> list[str]:
        # Every success and its output in ONE transaction (the store thread's batch,
        # or one of its own): all or none, one commit. One transaction per success
        # left some recorded when a later one failed (a full disk), and the held
        # retry of the whole call then found those "lost".
        moment = utc(None)
        batch = getattr(self._local, "batch", None)
        if batch is not None:
            with self._translate("record successes"):
                return _keep_successes(batch, finished, moment)
        with self._transaction("record successes") as conn:
            return _keep_successes(conn, finished, moment)

    def _finish(self, key: str, worker: str, finish: Finish, now: datetime | None) -> None:
        # One UPDATE guarded by the lease: atomic on its own (autocommit). A payload
        # to keep is a second statement: in the store thread's batch, or in a
        # transaction of its own (the outcome and its payload commit together).
        moment = utc(now)
        batch = getattr(self._local, "batch", None)
        if batch is None and (finish.payload is not None or finish.output is not None):
            with self._transaction("change a record") as conn:
                updated = _finish_row(conn, key, worker, finish, moment)
        else:
            with self._translate("change a record"):
                updated = _finish_row(batch or self._connection(), key, worker, finish, moment)
        if not updated:
            raise LeaseLostError(key, worker, self.get(key), finish.action)

    # --- group commit (broker_jobs.store.sqlite_batching) ------------------------------

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
        self._calls.submit(Call(loop, future, name, args, kwargs, after))
        return future

    @contextmanager
    def _batch(self, *, durable: bool) -> Iterator[None]:
        """One transaction for a batch of the store thread's calls, which join it (they
        find its connection in ``_local.batch``) and commit together; synchronous=FULL
        when ``durable``. On an exception nothing of the batch is written."""
        with self._gate:
            conn = self._connection("FULL" if durable else "NORMAL")
            started = time.monotonic()
            try:
                conn.execute("BEGIN IMMEDIATE")
                self._local.batch = conn
                try:
                    yield
                finally:
                    self._local.batch = None
                conn.execute("COMMIT")
            except BaseException as error:
                if conn.in_transaction:
                    with suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                if isinstance(error, sqlite3.Error):
                    waited = time.monotonic() - started
                    raise self._store_error("change a record", error, waited) from error
                raise

    # --- queries ------------------------------------------------------------------

    def _read(self, action: str, statement: str, params: Any = ()) -> list[Any]:
        """The rows of one query, on this thread's connection."""
        conn = self._connection()
        with self._translate(action):
            return conn.execute(statement, params).fetchall()

    def _read_one(self, action: str, statement: str, params: Any = ()) -> Any:
        """The row of a query of at most one (None without)."""
        found = self._read(action, statement, params)
        return found[0] if found else None

    def _select(self, where: str, params: Any, tail: str = "") -> list[JobRecord]:
        statement = f"SELECT {_COLUMNS} FROM broker_jobs_records {where} {tail}"
        return [_record(row) for row in self._read("read records", statement, params)]

    def get(self, key: str) -> JobRecord | None:
        found = self._select("WHERE idempotency_key = ?", (key,))
        return found[0] if found else None

    def kept_payload(self, key: str) -> KeptPayload | None:
        return kept_payload_of(self._read_one("read a payload", _KEPT_PAYLOAD, (key,)), _time)

    def output(self, key: str) -> KeptOutput | None:
        return kept_output_of(self._read_one("read an output", _KEPT_OUTPUT, (key,)), _time)

    def mark_follow_ups_sent(self, key: str, *, now: datetime | None = None) -> None:
        params = (_text(utc(now)), key)
        self._write(_FOLLOW_UPS_SENT, params, "FULL", "record follow-ups sent")

    def get_by_job_id(self, job_id: str) -> list[JobRecord]:
        # Two lookups, each by an index: the record keyed by the job id itself, and
        # the others (the job-id index holds only those).
        rows = self._read("read records", _BY_JOB_ID, (job_id, job_id, job_id))
        return [_record(row) for row in rows]

    def _find(self, filters: Filters, limit: int) -> list[JobRecord]:
        # A key prefix of few matches is read by the primary key (then sorted); one of
        # many by walking the updated_at index until the page is full, which a range
        # would turn into sorting them all (docs/dashboard.md, Performance).
        few = filters.key is not None and self._few_start_with(filters.key)
        where, params = filters.sql(_DIALECT, key_range=few)
        order = filters.order_sql(_DIALECT)
        return self._select(where, {**params, "limit": limit}, f"{order} LIMIT :limit")

    def _few_start_with(self, prefix: str) -> bool:
        """Whether at most :data:`FEW_KEYS` keys start with ``prefix`` (read from the
        primary key, at most that many entries)."""
        where, params = Filters(key=prefix).sql(_DIALECT, key_range=True)
        statement = f"SELECT count(*) FROM (SELECT 1 FROM broker_jobs_records {where} LIMIT :most)"
        found = self._read_one("count keys", statement, {**params, "most": FEW_KEYS + 1})
        return int(found[0]) <= FEW_KEYS

    def _count(self, filters: Filters) -> int:
        where, params = filters.sql(_DIALECT, key_range=True)
        statement = f"SELECT count(*) FROM broker_jobs_records {where}"
        return int(self._read_one("count records", statement, params)[0])

    def counts(self) -> dict[Status, int]:
        return status_counts(self._read("count records", _COUNT_STATUSES))

    def executions(self, key: str) -> list[Execution]:
        rows = self._read("read executions", _EXECUTIONS_OF, (key,))
        return [execution_of(row, _time) for row in rows]

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
        rows = self._read("count the outcomes by time", _BUCKETS, buckets.params(_text))
        return buckets.gather(rows)

    def prune(self, older_than: datetime) -> int:
        params = (*sorted(s.value for s in TERMINAL), _text(utc(older_than)))
        marks = ", ".join("?" * len(TERMINAL))
        doomed = f"status IN ({marks}) AND updated_at < ?"
        with self._transaction("prune records") as conn:
            for table in ("broker_jobs_executions", "broker_jobs_payloads", "broker_jobs_outputs"):
                conn.execute(
                    f"DELETE FROM {table} WHERE idempotency_key IN"
                    f" (SELECT idempotency_key FROM broker_jobs_records WHERE {doomed})",
                    params,
                )
            return conn.execute(f"DELETE FROM broker_jobs_records WHERE {doomed}", params).rowcount

    # --- the index of dead letters (written by _SQLiteRecords.index_letters) -----------

    def dead_letters(
        self,
        tasks: Sequence[str],
        where: DeadLetterFilter | None = None,
        *,
        limit: int = 100,
        offset: int = 0,
    ) -> list[IndexedDeadLetter]:
        condition, params = where_sql(_LETTER_DIALECT, tasks, where)
        statement, more = _LETTERS.format(where=condition), {"limit": limit, "offset": offset}
        rows = self._read("read dead letters", statement, {**params, **more})
        return [
            read_entry(doc, body, size, seq, _aware_time(at)) for doc, body, size, seq, at in rows
        ]

    def dead_letter_counts(
        self, tasks: Sequence[str], where: DeadLetterFilter | None = None
    ) -> dict[str, int]:
        condition, params = where_sql(_LETTER_DIALECT, tasks, where)
        rows = self._read("count dead letters", _LETTER_COUNTS.format(where=condition), params)
        return {**dict.fromkeys(tasks, 0), **dict(rows)}

    def unindex_dead_letters(self, task: str, letters: Sequence[DeadLetter]) -> int:
        with self._transaction("drop dead letters") as conn:
            taken = {(letter.letter_id, _text(letter.dead_at)) for letter in letters}
            params = [(task, letter_id, dead_at) for letter_id, dead_at in taken]
            return conn.executemany(_UNINDEX_LETTER, params).rowcount

    def dead_letter_mark(self, task: str) -> int:
        return int(self._read_one("read the dead letters' mark", _LETTER_MARK, (task,))[0])

    def sweep_dead_letters(self, task: str, *, up_to: int, pass_id: str) -> int:
        return self._write(_SWEEP_LETTERS, (task, up_to, pass_id), "FULL", "sweep dead letters")

    # --- beat records -------------------------------------------------------------

    def _write(self, statement: str, params: tuple[Any, ...], synchronous: str, action: str) -> int:
        """One statement, atomic on its own: in the store thread's batch when there is
        one (it commits with the batch), else autocommitted. How many rows it changed."""
        with self._translate(action):
            conn = getattr(self._local, "batch", None) or self._connection(synchronous)
            return conn.execute(statement, params).rowcount

    def record_fire(self, schedule: str, fire_at: datetime) -> None:
        # synchronous=FULL, as for outcomes: a fire lost to a power cut would be emitted
        # again by the beat's catch-up.
        self._write(_RECORD_FIRE, (schedule, _text(utc(fire_at))), "FULL", "record a fire")

    def last_fire(self, schedule: str) -> datetime | None:
        row = self._read_one("read the beat's fires", _LAST_FIRE, (schedule,))
        return _time(row[0]) if row else None

    def last_fires(self, prefix: str = "") -> dict[str, datetime]:
        rows = self._read("read the beat's fires", _LAST_FIRES, (prefix,))
        return {schedule: _aware_time(fire_at) for schedule, fire_at in rows}

    def record_leader(
        self,
        group: str,
        identity: str,
        since: datetime,
        *,
        now: datetime | None = None,
        schedules: Mapping[str, str] | None = None,
    ) -> None:
        # synchronous=NORMAL: the record is re-announced periodically; losing the last
        # one to a power cut only shows an older announcement.
        digests = leader_schedules_text(identity, schedules)
        params = (group, identity, _text(utc(since)), _text(utc(now)), digests)
        self._write(_RECORD_LEADER, params, "NORMAL", "record the beat leader")

    def leader(self, group: str) -> LeaderRecord | None:
        return leader_of(self._read_one("read the beat leader", _LEADER, (group,)), _time)

    def record_process(self, record: ProcessRecord) -> None:
        # synchronous=NORMAL: rewritten every few seconds; a power cut loses one beat.
        params = (record.id, record.namespace, _text(utc(record.seen_at)), process_document(record))
        self._write(_RECORD_PROCESS, params, "NORMAL", "record a heartbeat")

    def processes(self, namespace: str | None = None) -> list[ProcessRecord]:
        rows = self._read("read the heartbeats", _PROCESSES, (namespace,))
        return [process_of(text) for (text,) in rows]

    def forget_processes(self, seen_before: datetime) -> int:
        cutoff = (_text(utc(seen_before)),)
        return self._write(_FORGET_PROCESSES, cutoff, "NORMAL", "forget old heartbeats")

    def pause(
        self, namespace: str, task: str, by: str, *, now: datetime | None = None
    ) -> TaskPause:
        params = (namespace, task, _text(utc(now)), by)
        self._write(_PAUSE, params, "FULL", "pause a task")
        return self._pauses(namespace, task)[task]

    def resume(self, namespace: str, task: str) -> bool:
        return self._write(_RESUME, (namespace, task), "FULL", "resume a task") > 0

    def pauses(self, namespace: str) -> dict[str, TaskPause]:
        return self._pauses(namespace, None)

    def _pauses(self, namespace: str, task: str | None) -> dict[str, TaskPause]:
        rows = self._read("read the paused tasks", _PAUSE_OF, (namespace, task))
        return {t: TaskPause(ns, t, _aware_time(at), by) for ns, t, at, by in rows}

    def request_stop(
        self, namespace: str, worker_id: str, by: str, *, now: datetime | None = None
    ) -> StopRequest:
        params = (worker_id, namespace, _text(utc(now)), by)
        self._write(_REQUEST_STOP, params, "FULL", "ask a worker to stop")
        return self.stop_requests(namespace)[worker_id]

    def stop_requests(self, namespace: str) -> dict[str, StopRequest]:
        rows = self._read("read the stop requests", _STOPS_OF, (namespace,))
        return {w: StopRequest(ns, w, _aware_time(at), by) for ns, w, at, by in rows}

    def clear_stop(self, worker_id: str) -> bool:
        return self._write(_CLEAR_STOP, (worker_id,), "NORMAL", "clear a stop request") > 0

    def record_depths(
        self, namespace: str, depths: Mapping[str, int], *, now: datetime | None = None
    ) -> None:
        moment = utc(now)
        rows = [
            (namespace, r.task, r.step, _text(r.at), r.ready, r.peak)
            for r in depth_rows(depths, moment)
        ]
        old = [(namespace, step, _text(at)) for step, at in cutoffs(moment).items()]
        # synchronous=NORMAL: a sample lost to a power cut is a gap in a chart.
        with self._transaction("record queue depths", "NORMAL") as conn:
            conn.executemany(_RECORD_DEPTH, rows)
            conn.executemany(_FORGET_DEPTHS, old)

    def depth_history(
        self, namespace: str, *, step: timedelta, since: datetime
    ) -> dict[str, DepthSeries]:
        params = (namespace, step_seconds(step), _text(utc(since)))
        return series_by_task(self._read("read queue depths", _DEPTHS, params), _aware_time)

    def close(self) -> None:
        self._calls.stop()
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        with self._gate:
            for conn in connections:
                conn.close()


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


def _is_read_only(error: BaseException) -> bool:
    """SQLITE_READONLY (extended codes included): the connection cannot write (opened
    read-only, the file moved or its lock unobtainable)."""
    code = getattr(error, "sqlite_errorcode", None)
    return (
        isinstance(error, sqlite3.Error)
        and code is not None
        and code & 0xFF == sqlite3.SQLITE_READONLY
    )


def _in_transaction(conn: sqlite3.Connection) -> bool:
    try:
        return conn.in_transaction
    except sqlite3.ProgrammingError:  # closed by close() meanwhile
        return False


def _open(path: Path, timeout: float) -> sqlite3.Connection:
    """A new connection to the file (the tests replace it, to open the file read-only
    as SQLite does one it cannot write)."""
    return sqlite3.connect(
        path,
        timeout=timeout,
        isolation_level=None,  # autocommit; transactions are explicit
        check_same_thread=False,  # only its thread uses it; close() may be elsewhere
    )


def _is_cant_open(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_CANTOPEN


def _is_busy(error: sqlite3.Error) -> bool:
    """SQLITE_BUSY (extended codes included): another connection holds the file's lock."""
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"


#: The ledger's mode: it holds payloads, results and errors, often personal data; its
#: -wal and -shm files take the same mode from it (SQLite copies it).
PRIVATE_MODE = 0o600


def _create_private(path: Path) -> None:
    """Create the database file readable by its owner only, unless it exists (its mode
    is then the operator's) or is SQLite's in-memory name; a missing directory is
    left to SQLite's own error."""
    if str(path) == ":memory:":
        return
    with suppress(FileExistsError, FileNotFoundError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_MODE))
