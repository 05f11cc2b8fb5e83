"""The SQLite store's statements, and the few that its hot path runs on a
connection: a batch of claims is one ``INSERT`` for the keys never seen and one
read-decide-write for the rest, a batch of successes one ``UPDATE`` (each statement
hands the GIL back and forth: under load that cost a job's start up to milliseconds
per statement); and the records of a section (``_SQLiteRecords``), on its
connection. Times are stored as fixed-width UTC text, which SQL compares and orders
as time; rows read back through :mod:`broker_jobs.store.rows`. The names keep their
leading underscore: they are the SQLite store's own, not the package's
(``bench/dashboard/`` reads some of them here).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from broker_jobs.envelope import Job
from broker_jobs.store.dead_letter_index import Dialect as LetterDialect
from broker_jobs.store.dead_letter_index import IndexRow
from broker_jobs.store.ledger import (
    BUCKETS_SQL,
    COUNTS_SQL,
    FINISHED_COUNTS_SQL,
    FINISHED_SQL,
    Dialect,
)
from broker_jobs.store.records import (
    SUCCESS,
    Claim,
    ClaimOutcome,
    Finish,
    JobRecord,
    Output,
    PayloadText,
    Status,
    succeeded_with,
)
from broker_jobs.store.rows import record_of
from broker_jobs.store.rules import claimed_record, decide
from broker_jobs.store.values import follow_ups_text

_COLUMNS = (
    "idempotency_key, job_id, task, status, attempts, created_at, updated_at, worker,"
    " lease_until, last_error, due_at"
)

_EXECUTION_COLUMNS = (
    "idempotency_key, job_id, attempt, worker, started_at, finished_at, outcome, error"
)

_NEWEST_FIRST = "ORDER BY updated_at DESC, idempotency_key DESC"
_BY_JOB_ID = (
    f"SELECT {_COLUMNS} FROM broker_jobs_records WHERE idempotency_key = ? AND job_id = ?"
    f" UNION ALL SELECT {_COLUMNS} FROM broker_jobs_records"
    f" WHERE job_id = ? AND job_id <> idempotency_key {_NEWEST_FIRST}"
)

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
_COUNT_STATUSES = "SELECT status, count(*) FROM broker_jobs_records GROUP BY status"
_EXECUTIONS_OF = (
    f"SELECT {_EXECUTION_COLUMNS} FROM broker_jobs_executions"
    " WHERE idempotency_key = ? ORDER BY number"
)
#: The first payload kept for a key wins.
_KEEP_PAYLOAD = (
    "INSERT INTO broker_jobs_payloads (idempotency_key, payload, bytes, kept_at)"
    " VALUES (?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING"
)
_KEPT_PAYLOAD = "SELECT payload, bytes, kept_at FROM broker_jobs_payloads WHERE idempotency_key = ?"
#: A success's output replaces any kept for the key: a row an older broker-jobs left
#: behind (its prune ignores the table) for a key that runs again.
_KEEP_OUTPUT = (
    "INSERT OR REPLACE INTO broker_jobs_outputs"
    " (idempotency_key, result, result_bytes, follow_ups, sent_at, kept_at)"
    " VALUES (?, ?, ?, ?, NULL, ?)"
)
_KEPT_OUTPUT = (
    "SELECT result, result_bytes, follow_ups, sent_at, kept_at FROM broker_jobs_outputs"
    " WHERE idempotency_key = ?"
)
_FOLLOW_UPS_SENT = "UPDATE broker_jobs_outputs SET sent_at = ? WHERE idempotency_key = ?"

_RECORD_FIRE = (
    "INSERT INTO broker_jobs_beat_fires (schedule, fire_at) VALUES (?, ?)"
    " ON CONFLICT (schedule) DO UPDATE SET fire_at = excluded.fire_at"
    " WHERE excluded.fire_at > broker_jobs_beat_fires.fire_at"  # fixed-width UTC text
)
_LAST_FIRE = "SELECT fire_at FROM broker_jobs_beat_fires WHERE schedule = ?"
_LAST_FIRES = (
    "SELECT schedule, fire_at FROM broker_jobs_beat_fires"
    " WHERE substr(schedule, 1, length(?1)) = ?1 ORDER BY schedule"
)
_LEADER = (
    "SELECT group_name, identity, since, seen_at, schedules FROM broker_jobs_beat_leaders"
    " WHERE group_name = ?"
)
_PAUSE = (
    "INSERT INTO broker_jobs_pauses (namespace, task, paused_at, paused_by) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (namespace, task) DO NOTHING"
)
_PAUSE_OF = (
    "SELECT namespace, task, paused_at, paused_by FROM broker_jobs_pauses"
    " WHERE namespace = ? AND (?2 IS NULL OR task = ?2) ORDER BY task"
)
_RESUME = "DELETE FROM broker_jobs_pauses WHERE namespace = ? AND task = ?"
_REQUEST_STOP = (
    "INSERT INTO broker_jobs_stops (worker_id, namespace, asked_at, asked_by)"
    " VALUES (?, ?, ?, ?) ON CONFLICT (worker_id) DO NOTHING"
)
_STOPS_OF = (
    "SELECT namespace, worker_id, asked_at, asked_by FROM broker_jobs_stops"
    " WHERE namespace = ? ORDER BY worker_id"
)
_CLEAR_STOP = "DELETE FROM broker_jobs_stops WHERE worker_id = ?"
_RECORD_PROCESS = (
    "INSERT OR REPLACE INTO broker_jobs_processes (id, namespace, seen_at, document)"
    " VALUES (?, ?, ?, ?)"
)
_PROCESSES = (
    "SELECT document FROM broker_jobs_processes WHERE ?1 IS NULL OR namespace = ?1"
    " ORDER BY seen_at DESC"
)
_FORGET_PROCESSES = "DELETE FROM broker_jobs_processes WHERE seen_at < ?"
#: Queue depths over time (:mod:`broker_jobs.store.depths`): a minute's row takes
#: the newest sample, an hour's the largest (``?6``: whether the row keeps a peak).
_RECORD_DEPTH = (
    "INSERT INTO broker_jobs_depths (namespace, task, step, at, ready) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (namespace, step, at, task) DO UPDATE SET"
    "  ready = CASE WHEN ?6 THEN max(ready, excluded.ready) ELSE excluded.ready END"
)
_FORGET_DEPTHS = "DELETE FROM broker_jobs_depths WHERE namespace = ? AND step = ? AND at < ?"
_DEPTHS = (
    "SELECT task, at, ready FROM broker_jobs_depths"
    " WHERE namespace = ? AND step = ? AND at >= ? ORDER BY task, at"
)
_RECORD_LEADER = (
    "INSERT OR REPLACE INTO broker_jobs_beat_leaders"
    " (group_name, identity, since, seen_at, schedules) VALUES (?, ?, ?, ?, ?)"
)


#: The index of dead letters (:mod:`broker_jobs.store.dead_letter_index`). A second
#: copy of an entry rewrites it in its place (``seq`` stays), seen anew; an entry of
#: an earlier dead-lettering of the job (another dead at) is deleted first
#: (:data:`_RENEW_LETTER`), so the new one is placed last.
_LETTER_COLUMNS = (
    "task, letter_id, job_id, idempotency_key, reason, error, dead_at, document, body,"
    " body_size, pass_id, indexed_at"
)
_INDEX_LETTER = (
    f"INSERT INTO broker_jobs_dead_letters ({_LETTER_COLUMNS}) VALUES (:task, :letter_id,"
    " :job_id, :idempotency_key, :reason, :error, :dead_at, :document, :body, :body_size,"
    " :pass_id, :indexed_at) ON CONFLICT (task, letter_id) DO UPDATE SET"
    " job_id = excluded.job_id, idempotency_key = excluded.idempotency_key,"
    " reason = excluded.reason, error = excluded.error, dead_at = excluded.dead_at,"
    " document = excluded.document, body = excluded.body, body_size = excluded.body_size,"
    " pass_id = excluded.pass_id, indexed_at = excluded.indexed_at"
)
#: ``{where}``: :func:`~broker_jobs.store.dead_letter_index.where_sql`'s.
#: The page's places first, then its rows: the skipped rows' wide columns are never read.
_LETTERS = (
    "SELECT document, body, body_size, seq, indexed_at FROM broker_jobs_dead_letters"
    " WHERE seq IN (SELECT seq FROM broker_jobs_dead_letters WHERE {where}"
    " ORDER BY seq LIMIT :limit OFFSET :offset) ORDER BY seq"
)
_LETTER_COUNTS = "SELECT task, count(*) FROM broker_jobs_dead_letters WHERE {where} GROUP BY task"
_RENEW_LETTER = (
    "DELETE FROM broker_jobs_dead_letters"
    " WHERE task = :task AND letter_id = :letter_id AND dead_at IS NOT :dead_at"
)
#: Only while it is the dead-lettering the pass took (the same dead at).
_UNINDEX_LETTER = (
    "DELETE FROM broker_jobs_dead_letters WHERE task = ? AND letter_id = ? AND dead_at IS ?"
)
_LETTER_MARK = "SELECT coalesce(max(seq), 0) FROM broker_jobs_dead_letters WHERE task = ?"
_SWEEP_LETTERS = (
    "DELETE FROM broker_jobs_dead_letters WHERE task = ? AND seq <= ? AND pass_id IS NOT ?"
)


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
_LETTER_DIALECT = LetterDialect(
    placeholder=lambda name: f":{name}",
    substring="instr",
    moment=_text,
    table="broker_jobs_dead_letters",
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
    # Each new key's record and its row; the claim's times written once per batch
    # (_row's four conversions cost ~11 us per job, on the loop, before the jobs start),
    # only created_at (the job's own time) once per job.
    fresh: dict[str, tuple[JobRecord, tuple[Any, ...]]] = {}
    now, lease_until = _text(moment), _text(moment + timedelta(seconds=lease))
    for job, worker in claims:
        if job.idempotency_key not in fresh:
            record = claimed_record(None, job, worker, lease, moment)
            row = _fresh_row(job, worker, _text(record.created_at), now, lease_until)
            fresh[job.idempotency_key] = (record, row)
    entries = list(fresh.values())
    claimed: dict[str, JobRecord] = {}
    for start in range(0, len(entries), _ROWS_PER_INSERT):
        chunk = entries[start : start + _ROWS_PER_INSERT]
        values = ", ".join([_ROW_MARKS] * len(chunk))
        params = [value for _, row in chunk for value in row]
        if conn.execute(f"{_INSERT_FRESH} {values} {_ON_CONFLICT}", params).rowcount == len(chunk):
            claimed.update((record.idempotency_key, record) for record, _ in chunk)
    return claimed


def _fresh_row(
    job: Job, worker: str, created: str | None, now: str | None, lease_until: str | None
) -> tuple[Any, ...]:
    """``_row(claimed_record(None, job, worker, lease, moment))``, its times given as text."""
    return (
        job.idempotency_key,
        job.id,
        job.task,
        Status.RUNNING.value,
        job.attempt,
        created,  # created_at
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


def _keep_successes(
    conn: sqlite3.Connection, finished: Sequence[tuple[str, str, Output]], moment: datetime
) -> list[str]:
    """Record successes with their outputs inside the caller's transaction; the keys
    whose lease was lost."""
    lost = []
    for key, worker, output in finished:
        finish = SUCCESS if output.empty else succeeded_with(output)
        if not _finish_row(conn, key, worker, finish, moment):
            lost.append(key)
    return lost


def _finish_row(
    conn: sqlite3.Connection, key: str, worker: str, finish: Finish, moment: datetime
) -> bool:
    """Record ``finish`` of ``worker``'s hold of ``key`` (and keep its payload if the
    key has none); False when ``worker`` does not hold it (nothing written)."""
    status, due_at = finish.status.value, _text(finish.due_at)
    if finish.error is None:
        cursor = conn.execute(_FINISH, (status, _text(moment), due_at, key, worker))
    else:
        params = (status, _text(moment), finish.error, due_at, key, worker)
        cursor = conn.execute(_FINISH_ERROR, params)
    if cursor.rowcount != 1:
        return False
    if finish.payload is not None:
        stored = finish.payload
        conn.execute(_KEEP_PAYLOAD, (key, stored.text, stored.size, _text(moment)))
    if finish.output is not None:
        _keep_output(conn, key, finish.output, moment)
    return True


def _keep_output(conn: sqlite3.Connection, key: str, output: Output, moment: datetime) -> None:
    result = output.result
    text, size = (result.text, result.size) if result is not None else (None, None)
    params = (key, text, size, follow_ups_text(output.follow_ups), _text(moment))
    conn.execute(_KEEP_OUTPUT, params)


def _record(row: Sequence[Any]) -> JobRecord:
    return record_of(row, _time)


def _index_letters(
    conn: sqlite3.Connection, rows: Sequence[IndexRow], pass_id: str | None, moment: datetime
) -> None:
    """Index ``rows`` inside the caller's transaction, seen by ``pass_id`` at ``moment``."""
    indexed_at = _text(moment)
    for row in rows:  # row by row: a batch may hold one letter twice
        params = {
            **row.params(),
            "dead_at": _text(row.dead_at),
            "pass_id": pass_id,
            "indexed_at": indexed_at,
        }
        conn.execute(_RENEW_LETTER, params)
        conn.execute(_INDEX_LETTER, params)


class _SQLiteRecords:
    """The records of a section (:class:`~broker_jobs.store.exclusive.Records`) on
    ``conn``, inside its ``BEGIN IMMEDIATE``."""

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

    def keep_output(self, key: str, output: Output, now: datetime) -> None:
        _keep_output(self._conn, key, output, now)

    def index_letters(self, rows: Sequence[IndexRow], pass_id: str | None, now: datetime) -> None:
        _index_letters(self._conn, rows, pass_id, now)
