"""The PostgreSQL store's tables, functions and triggers, how a database of an
older layout is brought to this code's when a store opens it (one of a newer layout
is refused rather than misread), and what a store's error advises when a table is
missing or a grant lacking.

Workers of several versions share one database during an upgrade, often under roles
that may not change the tables, so every step is guarded: it runs under an advisory
lock (workers starting together do not race), re-reads the version there (another
store may have migrated meanwhile), and a role without the privilege still opens the
store, which says in the log what goes missing until the tables' owner opens it
once. Additions that older code can live with (the beat's tables, the dashboard's
indexes, the outputs, the index of dead letters) have no version: they are made when
missing.

Why some 670 lines: each table, index, function and trigger is one composed statement
with its reason beside it, and the migrations that change them sit next to them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from broker_jobs.store.errors import StoreError
from broker_jobs.store.postgres_queries import Queries, one_row
from broker_jobs.store.records import ExecutionOutcome, Status
from broker_jobs.store.values import mask_dsn

with contextlib.suppress(ImportError):  # the store says what to install
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql

#: The store's log (the migrations are the store's news).
log = logging.getLogger("broker_jobs.store.postgres")

#: The layout this code writes; a database with a higher one is refused. Version 2
#: added the executions, version 3 the statuses queued, scheduled and cancelled (an
#: older database is migrated, step by step, when a store opens it); version 4 the
#: payloads table.
SCHEMA_VERSION = 4
#: Advisory lock serialising table creation between workers starting together.
_SCHEMA_LOCK = 0x62726F6B65726A73  # "brokerjs"
#: The executions' trigger functions run with their owner's rights, on fixed names.
_DEFINER = "LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
#: The records' status CHECK constraint, as CREATE TABLE names it.
STATUS_CHECK = "broker_jobs_records_status_check"
#: The CHECK constraints on the records' status column, whatever their names.
_STATUS_CHECKS = (
    "SELECT c.conname FROM pg_constraint AS c JOIN pg_attribute AS a"
    " ON a.attrelid = c.conrelid AND a.attname = 'status'"
    " WHERE c.conrelid = %(records)s::regclass AND c.contype = 'c'"
    " AND c.conkey = ARRAY[a.attnum]"
)
#: The dashboard's indexes (:meth:`Schema.create_ledger_indexes`).
_LEDGER_INDEXES = ("broker_jobs_records_updated", "broker_jobs_executions_finished")
#: Each migration step, by the version it starts from: what it adds, and what goes
#: missing while only roles that may not make it open the store.
_STEPS = {
    1: (
        "the executions table",
        "Job history is not kept until a role with CREATE on the schema opens the store once",
    ),
    2: (
        "the statuses queued, scheduled and cancelled",
        "Recording published jobs and cancelling fail until the tables' owner opens the store once",
    ),
    3: (
        "the payloads table",
        "Job payloads are not kept until a role with CREATE on the schema opens the store once",
    ),
}

if TYPE_CHECKING:
    Connection = psycopg.Connection[Any]


class Schema:
    """The tables of one store (named by its :class:`Queries`) and their migration.
    ``schema``: as the store was given it (None: the connection's current schema);
    ``store``: for the log; ``where``: the store, for errors."""

    def __init__(self, q: Queries, schema: str | None, store: object, where: str) -> None:
        self.q = q
        self.schema = schema
        #: Whether this store writes outputs (set by :meth:`open`).
        self.keeps_outputs = False
        #: Whether the beat leaders' table has the schedules column (set by :meth:`open`).
        self.keeps_leader_schedules = False
        #: Whether this store keeps the index of dead letters (set by :meth:`open`).
        self.keeps_dead_letters = False
        #: Whether this store keeps heartbeat records (set by :meth:`open`).
        self.keeps_processes = False
        #: Whether the queue depths' table exists (set by :meth:`open`).
        self.keeps_depths = False
        self._store = store
        self._where = where

    def open(self, conn: Connection) -> bool:
        """Create the tables on ``conn`` (autocommit), or migrate them, and add what is
        missing; whether this store may keep payloads (:meth:`_can_keep_payloads`)."""
        version = self._version(conn)
        if version is None:
            version = self._create(conn)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self._where} (table {self.q.records.as_string()}) was created by a newer"
                f" broker-jobs (schema version {version}; this one knows up to"
                f" {SCHEMA_VERSION}). Upgrade broker-jobs on this host, or use another"
                " schema or database"
            )
        if version < 2:
            self._step(conn, 1, self._add_executions)
        if version < 3 and self._step(conn, 2, self._add_statuses):
            # Validated after the step's commit: the check reads every row, and the
            # workers need not wait for it (every row passed the narrower one).
            conn.execute(
                sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(
                    self.q.records, sql.Identifier(STATUS_CHECK)
                )
            )
        if version < 4:
            self._step(conn, 3, lambda conn: conn.execute(self.create_payloads()))
        keeps_payloads = self._can_keep_payloads(conn)
        if not _exist(conn, self.q.outputs):
            self._add(conn, [self.create_outputs()])  # without a version: older code ignores it
        self.keeps_outputs = _exist(conn, self.q.outputs) and self._may_write(
            conn, self.q.outputs, "results and follow-ups are not kept"
        )
        letters = self.q.letters.table
        if not _exist(conn, letters):
            self._add(conn, self.create_dead_letters())  # without a version: older code ignores it
        self.keeps_dead_letters = _exist(conn, letters) and self._may_write(
            conn, letters, "dead letters are not indexed (they are read from their queues)"
        )
        controls = self.q.processes
        if not _exist(conn, controls.table, controls.pauses, controls.stops):
            self._add(conn, self.create_processes())  # without a version: older code ignores it
        self.keeps_processes = _exist(conn, self.q.processes.table) and self._may_write(
            conn, self.q.processes.table, "this ledger lists no heartbeats of workers"
        )
        # Without CREATE on the schema, no depths are sampled (record_depths says why).
        self.keeps_depths = _exist(conn, self.q.depths.table) or self._add(
            conn, [self.create_depths()]
        )
        if not _exist(conn, self.q.fires, self.q.leaders):
            # A role without CREATE on the schema still opens the store (a worker needs
            # no beat tables); the beat's calls then say what to do.
            self._add(conn, self.create_beat())
        # A role that may not add the column records the leader without it.
        self.keeps_leader_schedules = self._has_leader_schedules(conn) or (
            _exist(conn, self.q.leaders) and self._add(conn, [self.add_leader_schedules()])
        )
        schema = self._schema_name(conn)
        indexes = [sql.Identifier(schema, name) for name in _LEDGER_INDEXES]
        if not _exist(conn, *indexes) and not self._add(conn, self.create_ledger_indexes()):
            # Its queries are only slower; the next open by the owner adds them.
            log.warning(
                "%r: cannot create the dashboard's indexes (not the tables' owner);"
                " open the store once as the owner to add them",
                self._store,
            )
        return keeps_payloads

    def advice(self, error: psycopg.Error, text: str) -> str | None:
        """What to do about ``error`` (its message ``text``, the DSN masked), the
        first case that fits: most are about these tables (one missing, a grant
        lacking); None when the store knows nothing better than its message."""
        denied = isinstance(error, pg_errors.InsufficientPrivilege)
        missing = isinstance(error, pg_errors.UndefinedTable)
        beat, history = "broker_jobs_beat_" in text, "broker_jobs_executions" in text
        records, executions = self.q.records.as_string(), self.q.executions.as_string()
        beat_tables = f"{self.q.fires.as_string()} and {self.q.leaders.as_string()}"
        cases = (
            (
                denied and beat,
                f"Grant the beat's user SELECT, INSERT and UPDATE on {beat_tables}, see"
                " docs/store.md",
            ),
            (
                missing and history,
                "The executions table is missing (the database is from schema version 1 and"
                " this role may not create tables): open the store once as a role with CREATE"
                f" on the schema, then grant this one SELECT on {executions}, see docs/store.md",
            ),
            (
                denied and history,
                f"Grant this user SELECT on {executions} to read job history, see docs/store.md",
            ),
            (
                denied,
                f"Grant this user SELECT, INSERT, UPDATE and DELETE on {records} (and CREATE on"
                " the schema for the first start), see docs/store.md",
            ),
            (
                missing and beat,
                "The beat's tables are missing (the database predates them and this role may"
                " not create tables): open the store once as a role with CREATE on the schema,"
                f" then grant this one SELECT, INSERT and UPDATE on {beat_tables}, see"
                " docs/store.md",
            ),
            (
                isinstance(error, pg_errors.CheckViolation) and STATUS_CHECK in text,
                "The database is from schema version 2, which knows no queued, scheduled or"
                f" cancelled job: open the store once as the owner of {records} to migrate it,"
                " see docs/store.md",
            ),
            (
                isinstance(error, psycopg.OperationalError),
                "Check that the database is up and reachable from this host and that the DSN"
                " is right",
            ),
        )
        return next((advice for applies, advice in cases if applies), None)

    @contextmanager
    def _locked(self, conn: Connection) -> Iterator[None]:
        """A transaction holding the schema lock (other stores opening wait)."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            yield

    def _create(self, conn: Connection) -> int:
        """Create the schema (if named) and the tables of a new database; the version
        found under the lock (another store may have created them meanwhile)."""
        with self._locked(conn):
            if self.q.schema is not None:
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(self.q.schema))
            conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} (version integer NOT NULL)").format(
                    self.q.version_table
                )
            )
            version = self._version(conn)
            if version is not None:
                return version
            schema = self._schema_name(conn)
            for statement in (*self.create(), *self.create_executions(schema)):
                conn.execute(statement)
            conn.execute(self.create_payloads())
            conn.execute(
                sql.SQL("INSERT INTO {} (version) VALUES (%s)").format(self.q.version_table),
                (SCHEMA_VERSION,),
            )
        return SCHEMA_VERSION

    def _step(self, conn: Connection, start: int, change: Callable[[Connection], Any]) -> bool:
        """Migrate from version ``start`` to the next by ``change``, under the lock.
        False when the database is not at ``start`` by then (another store migrated
        it, or an earlier step failed), or when this role may not: it still opens the
        database, and the log says what goes missing (:data:`_STEPS`)."""
        try:
            with self._locked(conn):
                if self._version(conn) != start:
                    return False
                change(conn)
                conn.execute(
                    sql.SQL("UPDATE {} SET version = %s").format(self.q.version_table),
                    (start + 1,),
                )
        except pg_errors.InsufficientPrivilege as error:
            added, missing = _STEPS[start]
            log.warning(
                "%r: cannot add %s (schema version %d -> %d): %s. %s (see docs/store.md)",
                self._store,
                added,
                start,
                start + 1,
                mask_dsn(str(error).strip()),
                missing,
            )
            return False
        return True

    def _add_executions(self, conn: Connection) -> None:
        """Version 1 -> 2: add the executions. A role without CREATE on the schema still
        opens the database (and works as before, keeping no history)."""
        schema = self._schema_name(conn)
        for statement in self.create_executions(schema):
            conn.execute(statement)
        conn.execute(self.backfill_executions(schema))

    def _add_statuses(self, conn: Connection) -> None:
        """Version 2 -> 3: the statuses queued, scheduled and cancelled. The status
        CHECK is replaced (found by its column: its name was PostgreSQL's choice) and
        the executions' trigger function too (a ledger status is never an outcome).
        Quick under the table's lock: the new CHECK is added NOT VALID and validated
        after the commit (:meth:`open`), which does not block the workers. A role
        that does not own the tables still opens the database; publishing to the
        ledger and cancelling fail (the CHECK refuses their statuses)."""
        records = self.q.records.as_string(conn)
        for (name,) in conn.execute(_STATUS_CHECKS, {"records": records}):
            conn.execute(
                sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                    self.q.records, sql.Identifier(name)
                )
            )
        conn.execute(self.status_check())
        conn.execute(self.track_function(self._schema_name(conn)))

    def _add(self, conn: Connection, statements: Sequence[sql.Composed]) -> bool:
        """Run ``statements`` (an addition without a version) under the lock; False
        when this role may not."""
        try:
            with self._locked(conn):
                for statement in statements:
                    conn.execute(statement)
        except pg_errors.InsufficientPrivilege:
            return False
        return True

    def _can_keep_payloads(self, conn: Connection) -> bool:
        """Whether this store writes payloads: the table exists (version 4) and this
        role may insert and delete there. Else payloads are left out rather than fail
        the outcome they come with."""
        if not _exist(conn, self.q.payloads):
            return False
        return self._may_write(conn, self.q.payloads, "job payloads are not kept")

    def _may_write(self, conn: Connection, name: sql.Identifier, else_: str) -> bool:
        """Whether this role may select, insert and delete in table ``name``; if not,
        says so (``else_``: what is left out then)."""
        table = name.as_string(conn)
        (allowed,) = one_row(
            conn.execute(
                "SELECT has_table_privilege(%(t)s, 'INSERT') AND has_table_privilege(%(t)s,"
                " 'DELETE') AND has_table_privilege(%(t)s, 'SELECT')"
                " AND has_table_privilege(%(t)s, 'UPDATE')",
                {"t": table},
            )
        )
        if not allowed:
            log.warning(
                "%r: this role may not write %s: %s (grant it SELECT, INSERT, UPDATE and"
                " DELETE there, see docs/store.md)",
                self._store,
                table,
                else_,
            )
        return bool(allowed)

    def _has_leader_schedules(self, conn: Connection) -> bool:
        """Whether the leaders' table exists and has the schedules column."""
        (found,) = one_row(
            conn.execute(
                "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass(%s)"
                " AND attname = 'schedules' AND NOT attisdropped)",
                (self.q.leaders.as_string(conn),),
            )
        )
        return bool(found)

    def _version(self, conn: Connection) -> int | None:
        if not _exist(conn, self.q.version_table):
            return None
        (version,) = one_row(
            conn.execute(sql.SQL("SELECT max(version) FROM {}").format(self.q.version_table))
        )
        return int(version) if version is not None else None

    def _schema_name(self, conn: Connection) -> str:
        if self.schema is not None:
            return self.schema
        (name,) = one_row(conn.execute("SELECT current_schema()"))
        if name is None:
            raise StoreError(
                f"{self._where}: no current schema (the search_path names none that"
                " exists); pass schema= or fix the search_path"
            )
        return str(name)

    # --- the statements of the layout ---------------------------------------------

    def create_payloads(self) -> sql.Composed:
        """Version 4: the payloads the ledger keeps (docs/store.md, "Payloads"), in a
        table of their own so the records a claim writes stay narrow. ``payload`` is the
        JSON text, NULL when it was too large to keep (``bytes`` says how large)."""
        return sql.SQL(
            "CREATE TABLE IF NOT EXISTS {payloads} ("
            " idempotency_key text PRIMARY KEY,"
            " payload text,"
            " bytes integer NOT NULL,"
            " kept_at timestamptz NOT NULL)"
        ).format(payloads=self.q.payloads)

    def create_outputs(self) -> sql.Composed:
        """What a success keeps beside its record (docs/store.md, "Results and
        follow-ups"): the handler's result (JSON text; NULL when too large, with
        ``result_bytes``; both NULL for none) and the follow-up jobs recorded with it
        (a JSON array), ``sent_at`` once the broker confirmed them all. Added without
        a version whenever a store opens the database: older code ignores it."""
        return sql.SQL(
            "CREATE TABLE IF NOT EXISTS {outputs} ("
            " idempotency_key text PRIMARY KEY,"
            " result text,"
            " result_bytes integer,"
            " follow_ups text,"
            " sent_at timestamptz,"
            " kept_at timestamptz NOT NULL)"
        ).format(outputs=self.q.outputs)

    def create_processes(self) -> list[sql.Composed]:
        """The daemons' heartbeat records (:mod:`broker_jobs.store.processes`): one JSON
        document per process id, rewritten every few seconds; and the paused tasks
        (:mod:`broker_jobs.store.controls`). Added without a version whenever a store
        opens the database: older code ignores them."""
        return [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {processes} ("
                " id text PRIMARY KEY,"
                " namespace text NOT NULL,"
                " seen_at timestamptz NOT NULL,"
                " document text NOT NULL)"
            ).format(processes=self.q.processes.table),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {pauses} ("
                " namespace text NOT NULL,"
                " task text NOT NULL,"
                " paused_at timestamptz NOT NULL,"
                " paused_by text NOT NULL,"
                " PRIMARY KEY (namespace, task))"
            ).format(pauses=self.q.processes.pauses),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {stops} ("
                " worker_id text PRIMARY KEY,"
                " namespace text NOT NULL,"
                " asked_at timestamptz NOT NULL,"
                " asked_by text NOT NULL)"
            ).format(stops=self.q.processes.stops),
        ]

    def create_depths(self) -> sql.Composed:
        """The queue depths over time (:mod:`broker_jobs.store.depths`), keyed so that a
        chart's rows and the pruning of old ones are ranges of the key. Added without
        a version whenever a store opens the database: older code ignores it."""
        return sql.SQL(
            "CREATE TABLE IF NOT EXISTS {depths} ("
            " namespace text NOT NULL,"
            ' task text COLLATE "C" NOT NULL,'
            " step integer NOT NULL,"
            " at timestamptz NOT NULL,"
            " ready bigint NOT NULL,"
            " PRIMARY KEY (namespace, step, at, task))"
        ).format(depths=self.q.depths.table)

    def create_dead_letters(self) -> list[sql.Composed]:
        """The ledger's index of dead letters (:mod:`broker_jobs.store.dead_letter_index`):
        one row per dead letter of a task's queue, keyed by (task, letter_id); ``seq``
        (an identity: never reused, and no grant on a sequence needed) is its place,
        the order listings read it in, and a pass's mark. Added without a version
        whenever a store opens the database: older code ignores it (its workers index
        nothing, which the next pass over the queue mends). By (task, seq): a task's
        page and its count; by job id and by key: a dead job's page finds its letter."""

        def index(name: str, columns: str) -> sql.Composed:
            template = "CREATE INDEX IF NOT EXISTS {name} ON {letters} (" + columns + ")"
            return sql.SQL(template).format(name=sql.Identifier(name), letters=letters)

        letters = self.q.letters.table
        return [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {letters} ("
                " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " task text NOT NULL,"
                " letter_id text NOT NULL,"
                " job_id text,"
                " idempotency_key text,"
                " reason text,"
                " error text,"
                " dead_at timestamptz,"
                " document text NOT NULL,"
                " body text,"
                " body_size integer NOT NULL,"
                " pass_id text,"
                " indexed_at timestamptz NOT NULL,"
                " UNIQUE (task, letter_id))"
            ).format(letters=letters),
            index("broker_jobs_dead_letters_task", "task, seq"),
            index("broker_jobs_dead_letters_job_id", "job_id"),
            index("broker_jobs_dead_letters_key", "idempotency_key"),
        ]

    def status_check(self) -> sql.Composed:
        """Version 2 -> 3: the CHECK of the records' status, with every status."""
        statuses = ", ".join(f"'{s.value}'" for s in Status)
        return sql.SQL(
            "ALTER TABLE {records} ADD CONSTRAINT {name} CHECK (status IN (" + statuses + "))"
            " NOT VALID"
        ).format(records=self.q.records, name=sql.Identifier(STATUS_CHECK))

    def create(self) -> list[sql.Composed]:
        def index(name: str, columns: str) -> sql.Composed:
            template = "CREATE INDEX IF NOT EXISTS {name} ON {records} (" + columns + ")"
            return sql.SQL(template).format(name=sql.Identifier(name), records=self.q.records)

        statuses = ", ".join(f"'{s.value}'" for s in Status)
        return [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {records} ("
                " idempotency_key text PRIMARY KEY,"
                " job_id text NOT NULL,"
                " task text NOT NULL,"
                " status text NOT NULL CHECK (status IN (" + statuses + ")),"
                " attempts integer NOT NULL,"
                " created_at timestamptz NOT NULL,"
                " updated_at timestamptz NOT NULL,"
                " worker text,"
                " lease_until timestamptz,"
                " last_error text,"
                " due_at timestamptz)"
            ).format(records=self.q.records),
            index("broker_jobs_records_status", "status, updated_at"),
            index("broker_jobs_records_task", "task, updated_at"),
            index("broker_jobs_records_job_id", "job_id"),
            *self.create_beat(),
        ]

    def create_ledger_indexes(self) -> list[sql.Composed]:
        """The indexes of the dashboard's listings (added after version 3, without a
        version: made when missing, like the beat's tables). The records newest updated
        first (the order of ``find``): a listing without a status or task filter reads
        a page instead of sorting every record; the finished executions by
        ``finished_at``: ``task_summaries`` finds the last hour's by a range."""
        return [
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS broker_jobs_records_updated"
                " ON {records} (updated_at, idempotency_key)"
            ).format(records=self.q.records),
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS broker_jobs_executions_finished"
                " ON {executions} (finished_at) WHERE finished_at IS NOT NULL"
            ).format(executions=self.q.executions),
        ]

    def create_executions(self, schema: str) -> list[sql.Composed]:
        """Version 2: the executions table, kept by triggers on the records (the rule
        of :func:`broker_jobs.store.rules.track_execution`), so every statement that
        changes a record records its executions in the same statement. The trigger
        functions are SECURITY DEFINER: a worker's role needs no privilege on the
        executions table to write them (only SELECT, to read them), and workers of an
        older version keep working while a newer one migrates the database. ``schema``:
        where the tables are (the functions name them fully, with a fixed search_path)."""
        executions = sql.Identifier(schema, "broker_jobs_executions")
        records = sql.Identifier(schema, "broker_jobs_records")
        track = sql.Identifier(schema, "broker_jobs_track_executions")
        forget = sql.Identifier(schema, "broker_jobs_forget_executions")
        outcomes = ", ".join(f"'{o.value}'" for o in ExecutionOutcome)
        return [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {executions} ("
                " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " idempotency_key text NOT NULL,"
                " job_id text NOT NULL,"
                " attempt integer NOT NULL,"
                " worker text NOT NULL,"
                " started_at timestamptz NOT NULL,"
                " finished_at timestamptz,"
                " outcome text CHECK (outcome IN (" + outcomes + ")),"
                " error text)"
            ).format(executions=executions),
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS broker_jobs_executions_key"
                " ON {executions} (idempotency_key, id)"
            ).format(executions=executions),
            self.track_function(schema),
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {forget}() RETURNS trigger " + _DEFINER + " AS $body$"
                " BEGIN"
                "  DELETE FROM {executions} WHERE idempotency_key = OLD.idempotency_key;"
                "  RETURN NULL;"
                " END $body$"
            ).format(forget=forget, executions=executions),
            *_trigger(
                "broker_jobs_executions_track",
                "INSERT OR UPDATE OF status, worker, attempts",
                records,
                track,
            ),
            *_trigger("broker_jobs_executions_forget", "DELETE", records, forget),
        ]

    def track_function(self, schema: str) -> sql.Composed:
        """The executions' trigger function (:meth:`create_executions`); replaced by
        the version 2 -> 3 migration (its outcomes: see the comment)."""
        executions = sql.Identifier(schema, "broker_jobs_executions")
        track = sql.Identifier(schema, "broker_jobs_track_executions")
        return sql.SQL(
            "CREATE OR REPLACE FUNCTION {track}() RETURNS trigger " + _DEFINER + " AS $body$"
            " BEGIN"
            "  UPDATE {executions} SET"
            "   finished_at = CASE WHEN NEW.status = 'running' AND NEW.worker IS NULL"
            "    THEN coalesce(NEW.lease_until, NEW.updated_at) ELSE NEW.updated_at END,"
            # A ledger status (queued, scheduled, cancelled) is no outcome: no
            # rule reaches one with an open execution, but none may be written.
            "   outcome = CASE WHEN NEW.status IN ('succeeded', 'retrying', 'failed',"
            "    'dead') THEN NEW.status WHEN NEW.status = 'running' AND NEW.worker"
            "    IS NOT NULL THEN 'lost' ELSE 'released' END,"
            "   error = CASE WHEN NEW.status IN ('retrying', 'failed', 'dead')"
            "    THEN NEW.last_error END"
            "  WHERE idempotency_key = NEW.idempotency_key AND finished_at IS NULL"
            "   AND NOT (NEW.status = 'running' AND worker IS NOT DISTINCT FROM NEW.worker"
            "            AND attempt = NEW.attempts);"
            "  IF NEW.status = 'running' AND NEW.worker IS NOT NULL AND NOT EXISTS ("
            "    SELECT FROM {executions} WHERE idempotency_key = NEW.idempotency_key"
            "    AND finished_at IS NULL) THEN"
            "   INSERT INTO {executions} (idempotency_key, job_id, attempt, worker, started_at)"
            "   VALUES (NEW.idempotency_key, NEW.job_id, NEW.attempts, NEW.worker,"
            "           NEW.updated_at);"
            "  END IF;"
            "  RETURN NULL;"
            " END $body$"
        ).format(track=track, executions=executions)

    def backfill_executions(self, schema: str) -> sql.Composed:
        """Version 1 -> 2: an open execution for each record held at the migration."""
        return sql.SQL(
            "INSERT INTO {executions} (idempotency_key, job_id, attempt, worker, started_at)"
            " SELECT idempotency_key, job_id, attempts, worker, updated_at FROM {records}"
            " WHERE status = 'running' AND worker IS NOT NULL"
        ).format(
            executions=sql.Identifier(schema, "broker_jobs_executions"),
            records=sql.Identifier(schema, "broker_jobs_records"),
        )

    def create_beat(self) -> list[sql.Composed]:
        """The beat's tables, added after version 1 without changing the others (older
        code ignores them): also created in a database of that version that lacks them."""
        return [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {fires} ("
                " schedule text PRIMARY KEY,"
                " fire_at timestamptz NOT NULL)"
            ).format(fires=self.q.fires),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {leaders} ("
                " group_name text PRIMARY KEY,"
                " identity text NOT NULL,"
                " since timestamptz NOT NULL,"
                " seen_at timestamptz NOT NULL,"
                " schedules text)"
            ).format(leaders=self.q.leaders),
        ]

    def add_leader_schedules(self) -> sql.Composed:
        """The leader's schedule digests (``values.leader_schedules_text``), added to the
        leaders of an older database without a version: older code names its columns,
        and its upsert leaves this one as it was, which the identity inside tells."""
        return sql.SQL("ALTER TABLE {leaders} ADD COLUMN IF NOT EXISTS schedules text").format(
            leaders=self.q.leaders
        )


def _trigger(
    name: str, event: str, table: sql.Identifier, function: sql.Identifier
) -> list[sql.Composed]:
    """``name`` on ``table`` (made again if it exists): ``function`` after ``event``
    (the rows' changes it follows), for each row."""
    return [
        sql.SQL("DROP TRIGGER IF EXISTS " + name + " ON {table}").format(table=table),
        sql.SQL(
            "CREATE TRIGGER " + name + " AFTER " + event + " ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION {function}()"
        ).format(table=table, function=function),
    ]


def _exist(conn: Connection, *tables: sql.Identifier) -> bool:
    """Whether every one of ``tables`` (or indexes) exists."""
    names = tuple(table.as_string(conn) for table in tables)
    test = " AND ".join(["to_regclass(%s) IS NOT NULL"] * len(names))
    (exists,) = one_row(conn.execute(sql.SQL("SELECT " + test), names))
    return bool(exists)
