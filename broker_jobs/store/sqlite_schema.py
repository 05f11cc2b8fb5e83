"""The SQLite store's file layout: its tables, triggers and indexes, and how a file
of an older layout is migrated when a store opens it (a file of a newer one is
refused rather than misread). One transaction creates or migrates, so of the
processes that open one file at once exactly one does it and the others find it
done (``SQLiteStore`` retries the whole step while another opener holds the lock).

A layout change bumps :data:`SCHEMA_VERSION` and adds a step; additions that older
code can live with (the beat's tables, the dashboard's indexes, the outputs, the
index of dead letters) are made whenever a store opens the file, without a version,
so older workers keep sharing it.
"""

from __future__ import annotations

import logging
import sqlite3

from broker_jobs.store.errors import StoreError

#: The store's log (the migrations are the store's news).
log = logging.getLogger("broker_jobs.store.sqlite")

#: The layout this code writes. A file with a higher version was created by a newer
#: broker-jobs and is refused rather than misread.
SCHEMA_VERSION = 4

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
#: :func:`broker_jobs.store.rules.track_execution`'s: an open execution that is not
#: the record's holding (RUNNING, held by ``worker`` at ``attempts``) is closed with
#: the new status (``released``: no holder; ``lost``: another holder or attempt), and
#: a holding without one opens one. A renewal or a reclaim by the holder changes
#: nothing. Keyed by (key, number): one B-tree, appended at the key's end.
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

#: What a success keeps beside its record (docs/store.md, "Results and follow-ups"):
#: the handler's result (JSON text, NULL when too large: ``result_bytes`` says how
#: large; both NULL for none) and the follow-up jobs recorded with it (a JSON array),
#: ``sent_at`` once the broker confirmed them all. A table of its own, written only
#: for a success that keeps something (``succeed_many``, the fast path's successes
#: without one, never touches it); added whenever a store opens the file, without a
#: version: older code ignores it (it keeps no outputs, and its prune leaves theirs:
#: a later success of the key replaces the row). Deleted with its record by prune.
_CREATE_OUTPUTS = """CREATE TABLE IF NOT EXISTS broker_jobs_outputs (
        idempotency_key TEXT PRIMARY KEY,
        result TEXT,
        result_bytes INTEGER,
        follow_ups TEXT,
        sent_at TEXT,
        kept_at TEXT NOT NULL
    ) WITHOUT ROWID"""

#: The ledger's index of dead letters (:mod:`broker_jobs.store.dead_letter_index`):
#: one row per dead letter of a task's queue, keyed by (task, letter_id); ``seq`` (the
#: rowid, AUTOINCREMENT: never reused) is its place, the order listings read it in,
#: and a pass's mark. Times are the store's fixed-width UTC text (``dead_at`` compares
#: as time). Added whenever a store opens the file, without a version: older code
#: ignores it (its workers index nothing, which the next pass over the queue mends).
#: By (task, seq): a task's page and its count read the index, not the rows; by job id
#: and by key: a dead job's page finds its letter.
_CREATE_DEAD_LETTERS = (
    """CREATE TABLE IF NOT EXISTS broker_jobs_dead_letters (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        task TEXT NOT NULL,
        letter_id TEXT NOT NULL,
        job_id TEXT,
        idempotency_key TEXT,
        reason TEXT,
        error TEXT,
        dead_at TEXT,
        document TEXT NOT NULL,
        body TEXT,
        body_size INTEGER NOT NULL,
        pass_id TEXT,
        indexed_at TEXT NOT NULL,
        UNIQUE (task, letter_id)
    )""",
    "CREATE INDEX IF NOT EXISTS broker_jobs_dead_letters_task"
    " ON broker_jobs_dead_letters (task, seq)",
    "CREATE INDEX IF NOT EXISTS broker_jobs_dead_letters_job_id"
    " ON broker_jobs_dead_letters (job_id)",
    "CREATE INDEX IF NOT EXISTS broker_jobs_dead_letters_key"
    " ON broker_jobs_dead_letters (idempotency_key)",
)

#: The daemons' heartbeat records (:mod:`broker_jobs.store.processes`): one JSON
#: document per process id, rewritten every few seconds. Added whenever a store
#: opens the file, without a version: older code ignores it (its daemons are not
#: listed). ``seen_at`` is the store's fixed-width UTC text (``forget_processes``).
_CREATE_PROCESSES = """CREATE TABLE IF NOT EXISTS broker_jobs_processes (
        id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        seen_at TEXT NOT NULL,
        document TEXT NOT NULL
    ) WITHOUT ROWID"""

#: Paused tasks (:mod:`broker_jobs.store.controls`): a row per paused task, added
#: whenever a store opens the file, without a version (older workers ignore pauses).
_CREATE_PAUSES = """CREATE TABLE IF NOT EXISTS broker_jobs_pauses (
        namespace TEXT NOT NULL,
        task TEXT NOT NULL,
        paused_at TEXT NOT NULL,
        paused_by TEXT NOT NULL,
        PRIMARY KEY (namespace, task)
    ) WITHOUT ROWID"""

#: Workers asked to stop (:class:`broker_jobs.store.controls.StopRequest`), likewise.
_CREATE_STOPS = """CREATE TABLE IF NOT EXISTS broker_jobs_stops (
        worker_id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        asked_at TEXT NOT NULL,
        asked_by TEXT NOT NULL
    ) WITHOUT ROWID"""

#: Queue depths over time (:mod:`broker_jobs.store.depths`), likewise; keyed so
#: that a chart's rows (a namespace's step, from a time) and the pruning of old ones
#: are ranges of the key.
_CREATE_DEPTHS = """CREATE TABLE IF NOT EXISTS broker_jobs_depths (
        namespace TEXT NOT NULL,
        task TEXT NOT NULL,
        step INTEGER NOT NULL,
        at TEXT NOT NULL,
        ready INTEGER NOT NULL,
        PRIMARY KEY (namespace, step, at, task)
    ) WITHOUT ROWID"""

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
        seen_at TEXT NOT NULL,
        schedules TEXT
    ) WITHOUT ROWID""",
)
#: The leader's schedule digests (``values.leader_schedules_text``), added to the
#: leaders of an older file without a version: older code names its columns, so its
#: INSERT OR REPLACE leaves the column NULL (a leader that does not say).
_ADD_LEADER_SCHEDULES = "ALTER TABLE broker_jobs_beat_leaders ADD COLUMN schedules TEXT"


def use_wal(conn: sqlite3.Connection, where: str) -> None:
    """Switch the file to WAL mode (``where``: the store, for the error)."""
    # Persistent in the file; changing it takes a lock, so only when needed (and
    # read again on each try: another opener may have switched it meanwhile).
    (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
    if mode != "wal":
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode != "wal":
            raise StoreError(
                f"{where}: cannot switch to WAL mode (got {mode!r}); put the file on a"
                " local file system"
            )


def create_tables(conn: sqlite3.Connection, store: object, where: str) -> None:
    """Create the tables of a new file, or migrate those of an older one, and add
    what is made whenever a store opens the file. ``store``: for the log;
    ``where``: the store, for the error."""
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
        _upgrade(conn, store, version)
    elif version > SCHEMA_VERSION:
        conn.execute("ROLLBACK")
        raise StoreError(
            f"{where} was created by a newer broker-jobs (schema version {version}; this"
            f" one knows up to {SCHEMA_VERSION}). Upgrade broker-jobs on this host, or use"
            " another file"
        )
    for statement in (
        *_CREATE_BEAT,
        _CREATE_OUTPUTS,
        _CREATE_PROCESSES,
        _CREATE_PAUSES,
        _CREATE_STOPS,
        _CREATE_DEPTHS,
        *_CREATE_DEAD_LETTERS,
        *_CREATE_JOB_ID_INDEX,
        *_CREATE_LEDGER_INDEXES,
    ):
        conn.execute(statement)
    leader_columns = {row[1] for row in conn.execute("PRAGMA table_info(broker_jobs_beat_leaders)")}
    if "schedules" not in leader_columns:
        conn.execute(_ADD_LEADER_SCHEDULES)
    conn.execute("COMMIT")


def _upgrade(conn: sqlite3.Connection, store: object, version: int) -> None:
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
        log.info("%r migrated from schema version %d to %d (%s)", store, start, start + 1, what)
