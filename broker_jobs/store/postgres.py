"""The PostgreSQL store (psycopg 3): workers on many hosts share one database.

A claim is one statement, ``INSERT ... ON CONFLICT (idempotency_key) DO UPDATE ...
WHERE <claimable> RETURNING``: PostgreSQL makes the insert-or-update atomic, so two
workers can never both get CLAIMED. When nothing comes back, the row is read to say
why (DONE, BUSY or STALE). State changes are single ``UPDATE ... WHERE status =
'running' AND worker = <us>`` statements. Times come from the database server's
clock unless a ``now`` is given, so clock skew between worker hosts cannot shorten a
lease.

The beat's records are single statements too: a fire is ``INSERT ... ON CONFLICT DO
UPDATE SET fire_at = GREATEST(...)``, so it never moves backwards, whatever the
callers' order; the leader of a group is a plain upsert (the last writer wins).

:meth:`PostgresStore.succeed_with` runs a handler's own writes and the SUCCEEDED
record in one transaction: exactly-once effects for writes into the same database.

psycopg is optional (``pip install 'broker-jobs[postgres]'``); this module imports
without it and the store says what to install.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from broker_jobs.envelope import Job
from broker_jobs.store.base import (
    TERMINAL,
    Cancellation,
    CancelOutcome,
    Claim,
    ClaimOutcome,
    Execution,
    ExecutionOutcome,
    JobRecord,
    KeptPayload,
    LeaderRecord,
    LeaseLostError,
    PayloadText,
    Status,
    Store,
    StoreError,
    TaskSummary,
    cancelled,
    check_lease,
    check_limit,
    clip_error,
    dead_record,
    decide,
    holds,
    mask_dsn,
    payload_text,
    published_record,
    read_payload,
    replay_record,
    utc,
)
from broker_jobs.store.ledger import (
    BUCKETS_SQL,
    COUNTS_SQL,
    FINISHED_COUNTS_SQL,
    Buckets,
    Dialect,
    Filters,
    Tally,
    summaries,
    tally_records,
    window_params,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.pq import TransactionStatus
except ImportError as _error:  # pragma: no cover - exercised by a test that hides psycopg
    _MISSING: ImportError | None = _error
else:
    _MISSING = None

log = logging.getLogger(__name__)

#: The layout this code writes; a database with a higher one is refused. Version 2
#: added the executions, version 3 the statuses queued, scheduled and cancelled (an
#: older database is migrated, step by step, when a store opens it); version 4 the
#: payloads table.
SCHEMA_VERSION = 4
#: Connections kept per store; callers beyond that wait (up to ``pool_wait`` seconds).
DEFAULT_MAX_CONNECTIONS = 4
#: Seconds to wait for the server when connecting, unless the DSN sets connect_timeout.
DEFAULT_CONNECT_TIMEOUT = 10
#: libpq's TCP settings unless the DSN sets them: a server that vanishes behind a
#: network cut (no reset, no answer) is noticed within ~25 s on an idle connection
#: (keepalives) and ~15 s on one waiting for an answer to what it sent
#: (tcp_user_timeout), so the call fails and the worker holds its jobs, instead of a
#: query hanging for the kernel's 15 minutes of retransmissions.
DEFAULT_TCP_OPTIONS: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}
#: Advisory lock serialising table creation between workers starting together.
_SCHEMA_LOCK = 0x62726F6B65726A73  # "brokerjs"
#: How often a claim re-tries when the row changed between its upsert and its read.
_CLAIM_ROUNDS = 10

_COLUMNS = (
    "idempotency_key",
    "job_id",
    "task",
    "status",
    "attempts",
    "created_at",
    "updated_at",
    "worker",
    "lease_until",
    "last_error",
    "due_at",
)
_COLS = sql.SQL(", ").join(map(sql.Identifier, _COLUMNS)) if _MISSING is None else None
_COLUMN_TYPES = tuple(
    zip(
        _COLUMNS,
        ("text", "text", "text", "text", "integer")
        + ("timestamptz",) * 2
        + ("text", "timestamptz", "text", "timestamptz"),
        strict=True,
    )
)
#: The statement's time: the caller's fixed clock, else the server's.
_NOW = "COALESCE(%(now)s::timestamptz, statement_timestamp())"
_NEWEST_FIRST = 'ORDER BY updated_at DESC, idempotency_key COLLATE "C" DESC'
#: The executions' trigger functions run with their owner's rights, on fixed names.
_DEFINER = "LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
#: The records' status CHECK constraint, as CREATE TABLE names it.
_STATUS_CHECK = "broker_jobs_records_status_check"


class _Queries:
    """Every statement, composed once for the store's schema."""

    def __init__(self, schema: str | None) -> None:
        def name(table: str) -> sql.Identifier:
            return sql.Identifier(schema, table) if schema else sql.Identifier(table)

        self.records = name("broker_jobs_records")
        self.version_table = name("broker_jobs_schema")
        self.fires = name("broker_jobs_beat_fires")
        self.leaders = name("broker_jobs_beat_leaders")
        self.executions = name("broker_jobs_executions")
        self.payloads = name("broker_jobs_payloads")
        self.schema = sql.Identifier(schema) if schema else None
        assert _COLS is not None

        def q(template: str) -> sql.Composed:
            return sql.SQL(template).format(records=self.records, cols=_COLS)

        self.claim = q(
            "INSERT INTO {records} AS r ({cols})"
            " SELECT %(key)s, %(job_id)s, %(task)s, 'running', %(attempt)s, n.now, n.now,"
            "  %(worker)s, n.now + make_interval(secs => %(lease)s), NULL, NULL"
            f" FROM (SELECT {_NOW} AS now) AS n"
            " ON CONFLICT (idempotency_key) DO UPDATE SET"
            "  job_id = excluded.job_id, task = excluded.task, status = 'running',"
            "  attempts = excluded.attempts, updated_at = excluded.updated_at,"
            "  worker = excluded.worker, lease_until = excluded.lease_until, due_at = NULL"
            # The claim rules of broker_jobs.store.base.decide, as SQL:
            " WHERE (r.status = 'running' AND r.attempts <= excluded.attempts"
            "        AND (r.worker = excluded.worker OR r.lease_until IS NULL"
            "             OR r.lease_until <= excluded.updated_at))"
            "  OR (r.status = 'retrying' AND r.attempts < excluded.attempts)"
            "  OR r.status IN ('queued', 'scheduled')"  # known from its publish: as new
            " RETURNING {cols}"
        )
        self.get_at = q(f"SELECT {{cols}}, {_NOW} FROM {{records}} WHERE idempotency_key = %(key)s")
        self.lock_at = q(
            f"SELECT {{cols}}, {_NOW} FROM {{records}} WHERE idempotency_key = %(key)s FOR UPDATE"
        )
        held = " WHERE idempotency_key = %(key)s AND status = 'running' AND worker = %(worker)s"
        self.renew = q(
            f"UPDATE {{records}} SET lease_until = {_NOW} + make_interval(secs => %(lease)s)" + held
        )
        self.finish = q(
            f"UPDATE {{records}} SET status = %(status)s, updated_at = {_NOW},"
            " lease_until = NULL, last_error = COALESCE(%(error)s::text, last_error),"
            " due_at = %(due_at)s::timestamptz" + held
        )
        self.release = q(f"UPDATE {{records}} SET worker = NULL, lease_until = {_NOW}" + held)
        self.keep_payload = self.keep("VALUES (%(key)s, %(payload)s, %(bytes)s, %(kept_at)s)")
        # An outcome and its payload in one statement: the count says if it was ours.
        self.finish_keeping = sql.Composed(
            [
                sql.SQL("WITH done AS ("),
                self.finish,
                sql.SQL(" RETURNING idempotency_key, updated_at), kept AS ("),
                self.keep("SELECT idempotency_key, %(payload)s, %(bytes)s, updated_at FROM done"),
                sql.SQL(") SELECT count(*) FROM done"),
            ]
        )
        self.kept_payload = sql.SQL(
            "SELECT payload, bytes, kept_at FROM {payloads} WHERE idempotency_key = %(key)s"
        ).format(payloads=self.payloads)
        self.insert_missing = q(
            "INSERT INTO {records} ({cols}) VALUES (%(idempotency_key)s, %(job_id)s,"
            " %(task)s, %(status)s, %(attempts)s, %(created_at)s, %(updated_at)s, %(worker)s,"
            " %(lease_until)s, %(last_error)s, %(due_at)s)"
            " ON CONFLICT (idempotency_key) DO NOTHING"
        )
        self.overwrite = q(
            "UPDATE {records} SET job_id = %(job_id)s, task = %(task)s, status = %(status)s,"
            " attempts = %(attempts)s, created_at = %(created_at)s, updated_at = %(updated_at)s,"
            " worker = %(worker)s, lease_until = %(lease_until)s, last_error = %(last_error)s,"
            " due_at = %(due_at)s WHERE idempotency_key = %(idempotency_key)s"
        )
        self.server_now = sql.SQL(f"SELECT {_NOW}")
        # One statement for a batch: the rows as one array per column.
        arrays = ", ".join(f"%({column})s::{kind}[]" for column, kind in _COLUMN_TYPES)
        self.publish = q(
            "INSERT INTO {records} ({cols}) SELECT * FROM unnest(" + arrays + ")"
            " ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key"
        )
        # The same, keeping the payload of each record it creates (one statement).
        self.publish_keeping = sql.Composed(
            [
                sql.SQL("WITH inserted AS ("),
                self.publish,
                sql.SQL("), kept AS ("),
                self.keep(
                    "SELECT p.key, p.payload, p.bytes, %(kept_at)s FROM unnest("
                    "%(payload_keys)s::text[], %(payload_texts)s::text[],"
                    " %(payload_bytes)s::integer[]) AS p (key, payload, bytes)"
                    " JOIN inserted ON inserted.idempotency_key = p.key"
                ),
                sql.SQL(") SELECT idempotency_key FROM inserted"),
            ]
        )
        self.get_many = q("SELECT {cols} FROM {records} WHERE idempotency_key = ANY(%(keys)s)")
        self.task_counts = self.summary(COUNTS_SQL)
        durations = "WITHIN GROUP (ORDER BY e.finished_at - e.started_at)"
        self.task_finished = self.summary(
            FINISHED_COUNTS_SQL,
            more=f", percentile_cont(0.5) {durations}, percentile_cont(0.99) {durations}",
        )
        # extract: numeric seconds from PostgreSQL 14 on, exact; a double before, still
        # exact to the microsecond once ::bigint rounds it (epoch microseconds < 2^53).
        self.outcome_buckets = self.summary(
            BUCKETS_SQL,
            finished_us="(extract(epoch FROM e.finished_at) * 1000000)::bigint",
            **{name: f"%({name})s" for name in ("since", "since_us", "width_us")},
        )
        self.status_checks = sql.SQL(
            "SELECT c.conname FROM pg_constraint AS c JOIN pg_attribute AS a"
            " ON a.attrelid = c.conrelid AND a.attname = 'status'"
            " WHERE c.conrelid = %(records)s::regclass AND c.contype = 'c'"
            " AND c.conkey = ARRAY[a.attnum]"
        )
        self.get = q("SELECT {cols} FROM {records} WHERE idempotency_key = %(key)s")
        self.by_job_id = q(
            "SELECT {cols} FROM {records} WHERE job_id = %(job_id)s " + _NEWEST_FIRST
        )
        self.counts = q("SELECT status, count(*) FROM {records} GROUP BY status")
        self.executions_of = sql.SQL(
            "SELECT idempotency_key, job_id, attempt, worker, started_at, finished_at, outcome,"
            " error FROM {executions} WHERE idempotency_key = %(key)s ORDER BY id"
        ).format(executions=self.executions)
        self.prune = q(
            "DELETE FROM {records} WHERE status = ANY(%(terminal)s) AND updated_at < %(cutoff)s"
        )
        # The records' payloads with them, in the same statement.
        self.prune_keeping = sql.Composed(
            [
                sql.SQL("WITH doomed AS ("),
                self.prune,
                sql.SQL(
                    " RETURNING idempotency_key), gone AS (DELETE FROM {payloads} WHERE"
                    " idempotency_key IN (SELECT idempotency_key FROM doomed))"
                    " SELECT count(*) FROM doomed"
                ).format(payloads=self.payloads),
            ]
        )

        def beat(template: str) -> sql.Composed:
            return sql.SQL(template).format(fires=self.fires, leaders=self.leaders)

        self.record_fire = beat(
            "INSERT INTO {fires} AS f (schedule, fire_at) VALUES (%(schedule)s, %(fire_at)s)"
            " ON CONFLICT (schedule) DO UPDATE SET fire_at = GREATEST(f.fire_at, excluded.fire_at)"
        )
        self.last_fire = beat("SELECT fire_at FROM {fires} WHERE schedule = %(schedule)s")
        self.last_fires = beat(
            "SELECT schedule, fire_at FROM {fires} WHERE starts_with(schedule, %(prefix)s)"
            ' ORDER BY schedule COLLATE "C"'
        )
        self.record_leader = beat(
            "INSERT INTO {leaders} (group_name, identity, since, seen_at)"
            f" VALUES (%(group)s, %(identity)s, %(since)s, {_NOW})"
            " ON CONFLICT (group_name) DO UPDATE SET identity = excluded.identity,"
            "  since = excluded.since, seen_at = excluded.seen_at"
        )
        self.leader = beat(
            "SELECT group_name, identity, since, seen_at FROM {leaders}"
            " WHERE group_name = %(group)s"
        )

    def keep(self, rows: str) -> sql.Composed:
        """Keep the payloads of ``rows`` (a VALUES or SELECT of key, payload, bytes,
        kept_at); a key that has one keeps it (the first one kept wins)."""
        return sql.SQL(
            "INSERT INTO {payloads} (idempotency_key, payload, bytes, kept_at) "
            + rows
            + " ON CONFLICT (idempotency_key) DO NOTHING"
        ).format(payloads=self.payloads)

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
        ).format(payloads=self.payloads)

    def find(self, where: str) -> sql.Composed:
        return sql.SQL(
            "SELECT {cols} FROM {records} " + where + " " + _NEWEST_FIRST + " LIMIT %(limit)s"
        ).format(records=self.records, cols=_COLS)

    def summary(self, template: str, **more: str) -> sql.Composed:
        """A query of :mod:`broker_jobs.store.ledger` for these tables."""
        marks = {name: f"%({name})s" for name in ("now", "minute", "hour")}
        text = template.format(records="{records}", executions="{executions}", **marks, **more)
        return sql.SQL(text).format(records=self.records, executions=self.executions)

    def status_check(self) -> sql.Composed:
        """Version 2 -> 3: the CHECK of the records' status, with every status."""
        statuses = ", ".join(f"'{s.value}'" for s in Status)
        return sql.SQL(
            "ALTER TABLE {records} ADD CONSTRAINT {name} CHECK (status IN (" + statuses + "))"
            " NOT VALID"
        ).format(records=self.records, name=sql.Identifier(_STATUS_CHECK))

    def create(self) -> list[sql.Composed]:
        def index(name: str, columns: str) -> sql.Composed:
            template = "CREATE INDEX IF NOT EXISTS {name} ON {records} (" + columns + ")"
            return sql.SQL(template).format(name=sql.Identifier(name), records=self.records)

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
            ).format(records=self.records),
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
            ).format(records=self.records),
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS broker_jobs_executions_finished"
                " ON {executions} (finished_at) WHERE finished_at IS NOT NULL"
            ).format(executions=self.executions),
        ]

    def create_executions(self, schema: str) -> list[sql.Composed]:
        """Version 2: the executions table, kept by triggers on the records (the rule
        of :func:`broker_jobs.store.base.track_execution`), so every statement that
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
            sql.SQL("DROP TRIGGER IF EXISTS broker_jobs_executions_track ON {records}").format(
                records=records
            ),
            sql.SQL(
                "CREATE TRIGGER broker_jobs_executions_track"
                " AFTER INSERT OR UPDATE OF status, worker, attempts ON {records}"
                " FOR EACH ROW EXECUTE FUNCTION {track}()"
            ).format(records=records, track=track),
            sql.SQL("DROP TRIGGER IF EXISTS broker_jobs_executions_forget ON {records}").format(
                records=records
            ),
            sql.SQL(
                "CREATE TRIGGER broker_jobs_executions_forget AFTER DELETE ON {records}"
                " FOR EACH ROW EXECUTE FUNCTION {forget}()"
            ).format(records=records, forget=forget),
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
            ).format(fires=self.fires),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {leaders} ("
                " group_name text PRIMARY KEY,"
                " identity text NOT NULL,"
                " since timestamptz NOT NULL,"
                " seen_at timestamptz NOT NULL)"
            ).format(leaders=self.leaders),
        ]


#: SQLSTATEs of a server shutting down or not ready: admin_shutdown, crash_shutdown,
#: cannot_connect_now.
_SHUTDOWN_STATES = frozenset({"57P01", "57P02", "57P03"})


class PostgresStore(Store):
    """Records in a PostgreSQL table, ``broker_jobs_records`` (in ``schema`` if given,
    else the connection's default schema), created on first use.

    Thread-safe: a small pool of autocommit connections (``max_connections``), each
    call takes one. A broken connection is dropped and the next call reconnects; the
    call that met the breakage raises :class:`StoreError`. Open the store in each
    process after forking, never before.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        pool_wait: float = 30.0,
    ) -> None:
        if _MISSING is not None:
            raise StoreError(
                "the PostgreSQL store needs psycopg 3, which is not installed:"
                " pip install 'broker-jobs[postgres]'"
            ) from _MISSING
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self._dsn = dsn
        self.masked_dsn = mask_dsn(dsn)
        self.schema = schema
        try:
            settings = conninfo_to_dict(dsn)
        except psycopg.Error as error:
            raise StoreError(
                f"invalid PostgreSQL DSN {self.masked_dsn!r}: {mask_dsn(str(error))}. Use"
                " postgresql://user:password@host:5432/database"
            ) from None
        self._connect_options: dict[str, Any] = {}
        if "connect_timeout" not in settings:
            self._connect_options["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT
        if "application_name" not in settings:
            self._connect_options["application_name"] = "broker-jobs"
        for option, value in DEFAULT_TCP_OPTIONS.items():
            if option not in settings:  # (libpq ignores them on a Unix socket)
                self._connect_options[option] = value
        self._q = _Queries(schema)
        self._keeps_payloads = False  # until _migrate finds the table writable
        self._pool = _Pool(self._connect, max_connections, pool_wait, self)
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    def is_outage(self, error: BaseException) -> bool:
        # The connection lost (no SQLSTATE: the client's own failure), a server
        # shutting down or starting, class 08 (connection) or 53 (a full disk, too
        # many connections); InterfaceError: the connection closed under the
        # statement. Not a statement timeout or a deadlock: the handler's failures.
        if isinstance(error, psycopg.InterfaceError):
            return True
        if not isinstance(error, psycopg.OperationalError):
            return False
        state = error.sqlstate
        return state is None or state[:2] in {"08", "53"} or state in _SHUTDOWN_STATES

    def __repr__(self) -> str:
        schema = f", schema={self.schema!r}" if self.schema else ""
        return f"PostgresStore({self.masked_dsn!r}{schema})"

    # --- connections and errors -----------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        with self._translate("connect"):
            return psycopg.connect(self._dsn, autocommit=True, **self._connect_options)

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as error:
            self._raise(action, error)

    def _raise(self, action: str, error: psycopg.Error) -> NoReturn:
        text = mask_dsn(str(error).strip())
        where = f"PostgreSQL store {self.masked_dsn}"
        if isinstance(error, pg_errors.InsufficientPrivilege) and "broker_jobs_beat_" in text:
            raise StoreError(
                f"{where}: cannot {action}: {text}. Grant the beat's user SELECT, INSERT"
                f" and UPDATE on {self._q.fires.as_string()} and"
                f" {self._q.leaders.as_string()}, see docs/store.md"
            ) from None
        if isinstance(error, pg_errors.UndefinedTable) and "broker_jobs_executions" in text:
            raise StoreError(
                f"{where}: cannot {action}: {text}. The executions table is missing (the"
                " database is from schema version 1 and this role may not create tables):"
                " open the store once as a role with CREATE on the schema, then grant this"
                f" one SELECT on {self._q.executions.as_string()}, see docs/store.md"
            ) from None
        if isinstance(error, pg_errors.InsufficientPrivilege) and "broker_jobs_executions" in text:
            raise StoreError(
                f"{where}: cannot {action}: {text}. Grant this user SELECT on"
                f" {self._q.executions.as_string()} to read job history, see docs/store.md"
            ) from None
        if isinstance(error, pg_errors.InsufficientPrivilege):
            raise StoreError(
                f"{where}: cannot {action}: {text}. Grant this user SELECT, INSERT, UPDATE"
                f" and DELETE on {self._q.records.as_string()} (and CREATE on the schema for"
                " the first start), see docs/store.md"
            ) from None
        if isinstance(error, pg_errors.UndefinedTable) and "broker_jobs_beat_" in text:
            raise StoreError(
                f"{where}: cannot {action}: {text}. The beat's tables are missing (the"
                " database predates them and this role may not create tables): open the"
                " store once as a role with CREATE on the schema, then grant this one"
                f" SELECT, INSERT and UPDATE on {self._q.fires.as_string()} and"
                f" {self._q.leaders.as_string()}, see docs/store.md"
            ) from None
        if isinstance(error, pg_errors.CheckViolation) and _STATUS_CHECK in text:
            raise StoreError(
                f"{where}: cannot {action}: {text}. The database is from schema version 2,"
                " which knows no queued, scheduled or cancelled job: open the store once as"
                f" the owner of {self._q.records.as_string()} to migrate it, see docs/store.md"
            ) from None
        if isinstance(error, psycopg.OperationalError):
            raise StoreError(
                f"{where}: cannot {action}: {text}. Check that the database is up and"
                " reachable from this host and that the DSN is right"
            ) from None
        raise StoreError(f"{where}: cannot {action}: {type(error).__name__}: {text}") from None

    def _migrate(self) -> None:
        with self._pool.connection() as conn, self._translate("create the tables"):
            version = self._version(conn)
            if version is None:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                    if self._q.schema is not None:
                        conn.execute(
                            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(self._q.schema)
                        )
                    conn.execute(
                        sql.SQL("CREATE TABLE IF NOT EXISTS {} (version integer NOT NULL)").format(
                            self._q.version_table
                        )
                    )
                    version = self._version(conn)
                    if version is None:
                        for statement in self._q.create():
                            conn.execute(statement)
                        for statement in self._q.create_executions(self._schema_name(conn)):
                            conn.execute(statement)
                        conn.execute(self._q.create_payloads())
                        conn.execute(
                            sql.SQL("INSERT INTO {} (version) VALUES (%s)").format(
                                self._q.version_table
                            ),
                            (SCHEMA_VERSION,),
                        )
                        version = SCHEMA_VERSION
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"PostgreSQL store {self.masked_dsn} (table"
                    f" {self._q.records.as_string()}) was created by a newer broker-jobs"
                    f" (schema version {version}; this one knows up to {SCHEMA_VERSION})."
                    " Upgrade broker-jobs on this host, or use another schema or database"
                )
            if version < 2:
                self._migrate_to_2(conn)
            if version < 3 and self._migrate_to_3(conn):
                conn.execute(
                    sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(
                        self._q.records, sql.Identifier(_STATUS_CHECK)
                    )
                )
            if version < 4:
                self._migrate_to_4(conn)
            self._keeps_payloads = self._can_keep_payloads(conn)
            if not self._beat_tables_exist(conn):
                self._create_beat_tables(conn)
            if not self._ledger_indexes_exist(conn):
                self._create_ledger_indexes(conn)

    def _schema_name(self, conn: psycopg.Connection[Any]) -> str:
        if self.schema is not None:
            return self.schema
        (name,) = _one(conn.execute("SELECT current_schema()"))
        if name is None:
            raise StoreError(
                f"PostgreSQL store {self.masked_dsn}: no current schema (the search_path"
                " names none that exists); pass schema= or fix the search_path"
            )
        return str(name)

    def _migrate_to_2(self, conn: psycopg.Connection[Any]) -> None:
        """Version 1 -> 2: add the executions. A role without CREATE on the schema still
        opens the database (and works as before, keeping no history) until a role with
        it opens the store once."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                if self._version(conn) != 1:
                    return  # another store migrated it meanwhile
                schema = self._schema_name(conn)
                for statement in self._q.create_executions(schema):
                    conn.execute(statement)
                conn.execute(self._q.backfill_executions(schema))
                conn.execute(sql.SQL("UPDATE {} SET version = 2").format(self._q.version_table))
        except pg_errors.InsufficientPrivilege as error:
            log.warning(
                "%r: cannot add the executions table (schema version 1 -> 2): %s. Job"
                " history is not kept until a role with CREATE on the schema opens the"
                " store once (see docs/store.md)",
                self,
                mask_dsn(str(error).strip()),
            )

    def _migrate_to_3(self, conn: psycopg.Connection[Any]) -> bool:
        """Version 2 -> 3: the statuses queued, scheduled and cancelled. The status
        CHECK is replaced (found by its column: its name was PostgreSQL's choice) and
        the executions' trigger function too (a ledger status is never an outcome).
        Quick under the table's lock: the new CHECK is added NOT VALID (every row
        passed the narrower one) and validated after the commit by the caller (True),
        which does not block the workers. A role that does not own the tables still
        opens the database; publishing to the ledger and cancelling fail (the CHECK
        refuses their statuses) until the owner opens the store once."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                if self._version(conn) != 2:
                    return False  # another store migrated it meanwhile, or 1 -> 2 failed
                records = self._q.records.as_string(conn)
                for (name,) in conn.execute(self._q.status_checks, {"records": records}):
                    conn.execute(
                        sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                            self._q.records, sql.Identifier(name)
                        )
                    )
                conn.execute(self._q.status_check())
                conn.execute(self._q.track_function(self._schema_name(conn)))
                conn.execute(sql.SQL("UPDATE {} SET version = 3").format(self._q.version_table))
        except pg_errors.InsufficientPrivilege as error:
            log.warning(
                "%r: cannot add the statuses queued, scheduled and cancelled (schema"
                " version 2 -> 3): %s. Recording published jobs and cancelling fail until"
                " the tables' owner opens the store once (see docs/store.md)",
                self,
                mask_dsn(str(error).strip()),
            )
            return False
        return True

    def _migrate_to_4(self, conn: psycopg.Connection[Any]) -> None:
        """Version 3 -> 4: add the payloads table (the records are untouched). A role
        without CREATE on the schema still opens the database and works as before,
        keeping no payloads, until a role with it opens the store once."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                if self._version(conn) != 3:
                    return  # another store migrated it meanwhile, or an earlier step failed
                conn.execute(self._q.create_payloads())
                conn.execute(sql.SQL("UPDATE {} SET version = 4").format(self._q.version_table))
        except pg_errors.InsufficientPrivilege as error:
            log.warning(
                "%r: cannot add the payloads table (schema version 3 -> 4): %s. Job"
                " payloads are not kept until a role with CREATE on the schema opens the"
                " store once (see docs/store.md)",
                self,
                mask_dsn(str(error).strip()),
            )

    def _can_keep_payloads(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether this store writes payloads: the table exists (version 4) and this
        role may insert and delete there. Else payloads are left out rather than fail
        the outcome they come with."""
        table = self._q.payloads.as_string(conn)
        (exists,) = _one(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)))
        if not exists:
            return False
        (allowed,) = _one(
            conn.execute(
                "SELECT has_table_privilege(%(t)s, 'INSERT') AND has_table_privilege(%(t)s,"
                " 'DELETE') AND has_table_privilege(%(t)s, 'SELECT')",
                {"t": table},
            )
        )
        if not allowed:
            log.warning(
                "%r: this role may not write %s: job payloads are not kept (grant it"
                " SELECT, INSERT and DELETE there, see docs/store.md)",
                self,
                table,
            )
        return bool(allowed)

    def _beat_tables_exist(self, conn: psycopg.Connection[Any]) -> bool:
        names = (self._q.fires.as_string(conn), self._q.leaders.as_string(conn))
        (exists,) = _one(
            conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL", names
            )
        )
        return bool(exists)

    def _create_beat_tables(self, conn: psycopg.Connection[Any]) -> None:
        """Add the beat's tables to a database created before them. A role without
        CREATE on the schema still opens the store (a worker needs no beat tables); the
        beat's calls then say what to do."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in self._q.create_beat():
                    conn.execute(statement)
        except pg_errors.InsufficientPrivilege:
            pass

    def _ledger_indexes_exist(self, conn: psycopg.Connection[Any]) -> bool:
        schema = self._schema_name(conn)
        (exists,) = _one(
            conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
                tuple(
                    sql.Identifier(schema, name).as_string(conn)
                    for name in ("broker_jobs_records_updated", "broker_jobs_executions_finished")
                ),
            )
        )
        return bool(exists)

    def _create_ledger_indexes(self, conn: psycopg.Connection[Any]) -> None:
        """Add the dashboard's indexes to a database created before them. A role that
        does not own the tables still opens the store (its queries are only slower);
        the next open by the owner adds them."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in self._q.create_ledger_indexes():
                    conn.execute(statement)
        except pg_errors.InsufficientPrivilege:
            log.warning(
                "%r: cannot create the dashboard's indexes (not the tables' owner);"
                " open the store once as the owner to add them",
                self,
            )

    def _version(self, conn: psycopg.Connection[Any]) -> int | None:
        table = self._q.version_table.as_string(conn)
        (exists,) = _one(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)))
        if not exists:
            return None
        (version,) = _one(
            conn.execute(sql.SQL("SELECT max(version) FROM {}").format(self._q.version_table))
        )
        return int(version) if version is not None else None

    # --- claims and state changes ---------------------------------------------------

    def claim(self, job: Job, worker: str, lease: float, *, now: datetime | None = None) -> Claim:
        params = _claim_params(job, worker, check_lease(lease), now)
        with self._pool.connection() as conn, self._translate(f"claim job {job.id}"):
            return self._claim_on(conn, job, params, upserted=False)

    def claim_many(self, claims: Sequence[tuple[Job, str]], lease: float) -> list[Claim]:
        """Every claim in ONE transaction, their upserts sent pipelined (one round
        trip, one commit: claimed one by one, a batch cost two commits per job and a
        round trip each). Keys are locked in key order, so two workers' batches that
        share keys (a redelivered job) wait for each other rather than deadlock."""
        check_lease(lease)
        if len(claims) <= 1:
            return [self.claim(job, worker, lease) for job, worker in claims]
        order = sorted(range(len(claims)), key=lambda index: claims[index][0].idempotency_key)
        params = [_claim_params(job, worker, lease, None) for job, worker in claims]
        found: dict[int, Claim] = {}
        with (
            self._pool.connection() as conn,
            self._translate(f"claim {len(claims)} jobs"),
            conn.transaction(),
        ):
            with conn.pipeline():
                cursors = [(index, conn.execute(self._q.claim, params[index])) for index in order]
            for index, cursor in cursors:
                row = cursor.fetchone()
                if row is not None:
                    found[index] = Claim(ClaimOutcome.CLAIMED, _record(row))
            for index in order:  # not claimable by the upsert: read why, as claim does
                if index not in found:
                    job = claims[index][0]
                    found[index] = self._claim_on(conn, job, params[index], upserted=True)
        return [found[index] for index in range(len(claims))]

    def _claim_on(
        self,
        conn: psycopg.Connection[Any],
        job: Job,
        params: dict[str, Any],
        *,
        upserted: bool,
    ) -> Claim:
        """The claim rounds of one job on ``conn``; ``upserted``: its upsert ran already
        (and claimed nothing), so the first round starts with the read."""
        for _ in range(_CLAIM_ROUNDS):
            if not upserted:
                row = conn.execute(self._q.claim, params).fetchone()
                if row is not None:
                    return Claim(ClaimOutcome.CLAIMED, _record(row))
            upserted = False
            # Not claimable when the upsert ran; read why. The row may have changed
            # since (released, expired, pruned): then try the upsert again.
            found = conn.execute(self._q.get_at, params).fetchone()
            if found is None:
                continue
            record, moment = _record(found[:-1]), _aware(found[-1])
            worker = params["worker"]
            outcome = decide(record, job, worker, moment)
            if outcome is not ClaimOutcome.CLAIMED:
                return Claim(outcome, record)
        raise StoreError(
            f"PostgreSQL store {self.masked_dsn}: the record of job key"
            f" {job.idempotency_key!r} kept changing during {_CLAIM_ROUNDS} claim rounds"
        )

    def succeed_many(self, finished: Sequence[tuple[str, str]]) -> list[str]:
        """Every success in ONE transaction, pipelined (one round trip, one commit),
        in key order like :meth:`claim_many`; the keys whose lease was lost."""
        if len(finished) <= 1:
            return super().succeed_many(finished)
        params = [
            _finish_params(key, worker, Status.SUCCEEDED, now=None)
            for key, worker in sorted(finished)
        ]
        with (
            self._pool.connection() as conn,
            self._translate(f"record {len(finished)} successes"),
            conn.transaction(),
        ):
            with conn.pipeline():
                cursors = [(one["key"], conn.execute(self._q.finish, one)) for one in params]
            return [key for key, cursor in cursors if cursor.rowcount != 1]

    def renew(self, key: str, worker: str, lease: float, *, now: datetime | None = None) -> None:
        params = {"key": key, "worker": worker, "lease": check_lease(lease), "now": _opt_utc(now)}
        self._update_held(self._q.renew, params, "renew the lease of")

    def succeed(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        self._update_held(
            self._q.finish,
            _finish_params(key, worker, Status.SUCCEEDED, now=now),
            "record success of",
        )

    def retry(
        self,
        key: str,
        worker: str,
        error: str,
        due_at: datetime,
        *,
        now: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        params = _finish_params(
            key, worker, Status.RETRYING, error=error, due_at=utc(due_at), now=now
        )
        self._finish_keeping(params, payload, "record a retry of")

    def fail(
        self,
        key: str,
        worker: str,
        error: str,
        *,
        now: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        params = _finish_params(key, worker, Status.FAILED, error=error, now=now)
        self._finish_keeping(params, payload, "record failure of")

    def _finish_keeping(
        self, params: dict[str, Any], payload: Mapping[str, Any] | None, action: str
    ) -> None:
        """The outcome of ``params``, and ``payload`` kept with it (one statement)."""
        stored = self._storable(payload)
        if stored is None:
            self._update_held(self._q.finish, params, action)
        else:
            more = {"payload": stored.text, "bytes": stored.size}
            self._update_held(self._q.finish_keeping, {**params, **more}, action, counted=True)

    def _storable(self, payload: Mapping[str, Any] | None) -> PayloadText | None:
        """``payload`` as stored; None when there is none or this store keeps none."""
        return payload_text(payload) if self._keeps_payloads else None

    def _update_held(
        self,
        statement: sql.Composed,
        params: dict[str, Any],
        action: str,
        *,
        counted: bool = False,
    ) -> None:
        """``counted``: the statement returns how many records it changed."""
        key = params["key"]
        with self._pool.connection() as conn, self._translate(f"{action} job key {key!r}"):
            cursor = conn.execute(statement, params)
            changed = _one(cursor)[0] if counted else cursor.rowcount
            if changed == 1:
                return
            row = conn.execute(self._q.get, params).fetchone()
        raise LeaseLostError(key, params["worker"], _record(row) if row else None, action)

    def succeed_with(
        self,
        key: str,
        worker: str,
        effects: Callable[[Any], None],
        *,
        now: datetime | None = None,
    ) -> None:
        """Run ``effects(conn)`` and record SUCCEEDED in ONE transaction: both are
        committed, or neither.

        The record is locked first (``SELECT ... FOR UPDATE``): if ``worker`` does not
        hold it, :class:`LeaseLostError` is raised before ``effects`` runs. While the
        transaction is open, another worker's claim of the key waits for it, then sees
        SUCCEEDED (DONE). ``effects`` writes with ``conn`` (inside the transaction: do
        not commit, roll back or change session settings); an exception from it rolls
        everything back and propagates unchanged, and the record stays RUNNING, ours.
        If the connection breaks during the commit, the outcome is unknown:
        ``get(key)`` tells (SUCCEEDED means the effects were committed too).
        """
        params = _finish_params(key, worker, Status.SUCCEEDED, now=now)
        stage = "lock the record of"
        with self._pool.connection() as conn:
            try:
                with conn.transaction():
                    row = conn.execute(self._q.lock_at, params).fetchone()
                    record = _record(row[:-1]) if row else None
                    if not holds(record, worker):
                        raise LeaseLostError(key, worker, record, "record success of")
                    stage = "effects"
                    effects(conn)
                    stage = "record success (effects rolled back) of"
                    conn.execute(self._q.finish, params)
                    stage = "commit (outcome unknown: get(key) tells) the success of"
            except psycopg.Error as error:
                if stage == "effects":
                    raise
                self._raise(f"{stage} job key {key!r}", error)

    def dead(
        self,
        key: str,
        worker: str | None,
        error: str,
        *,
        job: Job | None = None,
        job_id: str | None = None,
        task: str | None = None,
        now: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        stored = self._storable(payload)
        for _ in range(_CLAIM_ROUNDS):
            with self._locked(key, now, f"mark job key {key!r} dead") as (conn, record, moment):
                new = dead_record(
                    record,
                    key,
                    worker,
                    error,
                    job=job,
                    job_id=job_id,
                    task=task,
                    now=moment,
                )
                if new is None:
                    return
                if record is not None:
                    conn.execute(self._q.overwrite, _record_params(new))
                elif conn.execute(self._q.insert_missing, _record_params(new)).rowcount != 1:
                    continue  # another call created the record meanwhile: decide again
                if stored is not None:  # in the record's transaction
                    conn.execute(self._q.keep_payload, _payload_params(key, stored, moment))
                return
            # Another call created the record meanwhile: decide again on it.
        raise StoreError(f"PostgreSQL store {self.masked_dsn}: job key {key!r} kept changing")

    @contextmanager
    def _locked(
        self, key: str, now: datetime | None, action: str
    ) -> Iterator[tuple[psycopg.Connection[Any], JobRecord | None, datetime]]:
        """A transaction holding the row lock of ``key``'s record: the connection, the
        record (None without one) and the statement's time."""
        with (
            self._pool.connection() as conn,
            self._translate(action),
            conn.transaction(),
        ):
            row = conn.execute(self._q.lock_at, {"key": key, "now": _opt_utc(now)}).fetchone()
            if row is None:
                yield conn, None, self._moment(conn, now)
            else:
                yield conn, _record(row[:-1]), _aware(row[-1])

    def _moment(self, conn: psycopg.Connection[Any], now: datetime | None) -> datetime:
        """``now`` in UTC, else the server's time."""
        if now is not None:
            return utc(now)
        return _aware(_one(conn.execute(self._q.server_now, {"now": None}))[0])

    def release(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        params = {"key": key, "worker": worker, "now": _opt_utc(now)}
        with self._pool.connection() as conn, self._translate(f"release job key {key!r}"):
            conn.execute(self._q.release, params)

    # --- the ledger -------------------------------------------------------------------

    def get(self, key: str) -> JobRecord | None:
        with self._pool.connection() as conn, self._translate("read a record"):
            row = conn.execute(self._q.get, {"key": key}).fetchone()
        return _record(row) if row else None

    def get_by_job_id(self, job_id: str) -> list[JobRecord]:
        with self._pool.connection() as conn, self._translate("read records"):
            rows = conn.execute(self._q.by_job_id, {"job_id": job_id}).fetchall()
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
        filters = Filters.of(
            status=status, task=task, since=since, until=until, key=key, after=after
        )
        where, params = filters.sql(_DIALECT)
        with self._pool.connection() as conn, self._translate("find records"):
            rows = conn.execute(self._q.find(where), {**params, "limit": limit}).fetchall()
        return [_record(row) for row in rows]

    def task_summaries(self, *, now: datetime | None = None) -> dict[str, TaskSummary]:
        with self._pool.connection() as conn, self._translate("summarise the tasks"):
            params = window_params(self._moment(conn, now), _as_is)
            tallies = tally_records(conn.execute(self._q.task_counts, params), _maybe)
            for task, *counts, p50, p99 in conn.execute(self._q.task_finished, params):
                tally = tallies.setdefault(task, Tally())  # a record added in between
                tally.add_counts(*map(int, counts))
                tally.percentiles = (p50, p99)
        return summaries(tallies)

    def outcome_buckets(
        self, *, since: datetime, bucket: timedelta, now: datetime | None = None
    ) -> dict[str, list[tuple[int, int]]]:
        with self._pool.connection() as conn, self._translate("count the outcomes by time"):
            buckets = Buckets.of(since, bucket, self._moment(conn, now))
            rows = conn.execute(self._q.outcome_buckets, buckets.params(_as_is)).fetchall()
        return buckets.gather(rows)

    def record_published(
        self, jobs: Sequence[Job], *, now: datetime | None = None
    ) -> list[JobRecord | None]:
        if not jobs:
            return []
        keys = [job.idempotency_key for job in jobs]
        with self._pool.connection() as conn, self._translate("record published jobs"):
            moment = self._moment(conn, now)
            rows = [_record_params(published_record(job, moment)) for job in jobs]
            columns = {column: [row[column] for row in rows] for column in _COLUMNS}
            statement, params = self._q.publish, columns
            if self._keeps_payloads:
                statement = self._q.publish_keeping
                params = {**columns, **_payload_columns(jobs, moment)}
            inserted = {key for (key,) in conn.execute(statement, params)}
            # The records of the keys seen before (and of a key's second copy).
            wanted = [k for k, n in Counter(keys).items() if n > 1 or k not in inserted]
            found = conn.execute(self._q.get_many, {"keys": wanted}).fetchall() if wanted else []
        existing = {record.idempotency_key: record for record in map(_record, found)}
        result: list[JobRecord | None] = []
        for key in keys:
            result.append(None if key in inserted else existing.get(key))
            inserted.discard(key)  # a second copy finds the first one's record
        return result

    def cancel(self, ref: str, *, now: datetime | None = None) -> Cancellation:
        found = self.lookup(ref)
        if found is None:
            return Cancellation(CancelOutcome.UNKNOWN, None)
        key = found.idempotency_key
        with self._locked(key, now, f"cancel job key {key!r}") as (conn, record, moment):
            result = cancelled(record, moment)
            if result.outcome is CancelOutcome.CANCELLED:
                assert result.record is not None
                conn.execute(self._q.overwrite, _record_params(result.record))
        return result

    def reset_for_replay(self, key: str, *, now: datetime | None = None) -> JobRecord | None:
        with self._locked(key, now, f"reset job key {key!r}") as (conn, record, moment):
            new = replay_record(record, moment)
            if new is not None:
                conn.execute(self._q.overwrite, _record_params(new))
        return new

    def counts(self) -> dict[Status, int]:
        with self._pool.connection() as conn, self._translate("count records"):
            rows = conn.execute(self._q.counts).fetchall()
        counts = dict.fromkeys(Status, 0)
        counts.update({Status(status): int(n) for status, n in rows})
        return counts

    def executions(self, key: str) -> list[Execution]:
        with self._pool.connection() as conn, self._translate("read executions"):
            rows = conn.execute(self._q.executions_of, {"key": key}).fetchall()
        return [
            Execution(
                idempotency_key=k,
                job_id=job_id,
                attempt=attempt,
                worker=worker,
                started_at=_aware(started),
                finished_at=_maybe(finished),
                outcome=ExecutionOutcome(outcome) if outcome is not None else None,
                error=error,
            )
            for k, job_id, attempt, worker, started, finished, outcome, error in rows
        ]

    def prune(self, older_than: datetime) -> int:
        # The records' delete trigger deletes their executions in the same statement,
        # and the statement their payloads.
        params = {"terminal": sorted(s.value for s in TERMINAL), "cutoff": utc(older_than)}
        with self._pool.connection() as conn, self._translate("prune records"):
            if not self._keeps_payloads:
                return conn.execute(self._q.prune, params).rowcount
            return int(_one(conn.execute(self._q.prune_keeping, params))[0])

    def kept_payload(self, key: str) -> KeptPayload | None:
        if not self._keeps_payloads:  # no table (a role that cannot migrate): none kept
            return None
        with self._pool.connection() as conn, self._translate("read a payload"):
            row = conn.execute(self._q.kept_payload, {"key": key}).fetchone()
        if row is None:
            return None
        text, size, kept_at = row
        return read_payload(text, size, _aware(kept_at))

    # --- beat records -------------------------------------------------------------

    def record_fire(self, schedule: str, fire_at: datetime) -> None:
        params = {"schedule": schedule, "fire_at": utc(fire_at)}
        with self._pool.connection() as conn, self._translate("record a fire"):
            conn.execute(self._q.record_fire, params)

    def last_fire(self, schedule: str) -> datetime | None:
        with self._pool.connection() as conn, self._translate("read the beat's fires"):
            row = conn.execute(self._q.last_fire, {"schedule": schedule}).fetchone()
        return _aware(row[0]) if row else None

    def last_fires(self, prefix: str = "") -> dict[str, datetime]:
        with self._pool.connection() as conn, self._translate("read the beat's fires"):
            rows = conn.execute(self._q.last_fires, {"prefix": prefix}).fetchall()
        return {schedule: _aware(fire_at) for schedule, fire_at in rows}

    def record_leader(
        self, group: str, identity: str, since: datetime, *, now: datetime | None = None
    ) -> None:
        params = {"group": group, "identity": identity, "since": utc(since), "now": _opt_utc(now)}
        with self._pool.connection() as conn, self._translate("record the beat leader"):
            conn.execute(self._q.record_leader, params)

    def leader(self, group: str) -> LeaderRecord | None:
        with self._pool.connection() as conn, self._translate("read the beat leader"):
            row = conn.execute(self._q.leader, {"group": group}).fetchone()
        if row is None:
            return None
        name, identity, since, seen_at = row
        return LeaderRecord(name, identity, _aware(since), _aware(seen_at))

    def close(self) -> None:
        self._pool.close()


class _Pool:
    """A few autocommit connections, made on demand, shared by threads.

    Not psycopg_pool: this needs no background thread and no extra dependency.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        size: int,
        wait: float,
        owner: PostgresStore,
    ) -> None:
        self._connect, self._size, self._wait, self._owner = connect, size, wait, owner
        self._idle: list[psycopg.Connection[Any]] = []
        self._open = 0
        self._closed = False
        self._cond = threading.Condition()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        conn = self._acquire()
        try:
            yield conn
        finally:
            self._release(conn)

    def _acquire(self) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + self._wait
        with self._cond:
            while True:
                if self._closed:
                    raise StoreError(f"{self._owner!r} is closed; open a new store")
                if self._idle:
                    return self._idle.pop()
                if self._open < self._size:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreError(
                        f"{self._owner!r}: all {self._size} connections stayed busy for"
                        f" {self._wait:g} s; raise max_connections (or look for a slow"
                        " succeed_with effects function)"
                    )
                self._cond.wait(left)
        try:
            return self._connect()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _release(self, conn: psycopg.Connection[Any]) -> None:
        healthy = not conn.closed and not conn.broken
        reusable = healthy and conn.info.transaction_status == TransactionStatus.IDLE
        stale: list[psycopg.Connection[Any]] = []
        with self._cond:
            if reusable and not self._closed:
                self._idle.append(conn)
                self._cond.notify()
                return
            self._open -= 1
            if not healthy:
                # The server restarted or the network broke: the idle ones are most
                # likely dead too; reconnect on demand rather than fail once each.
                stale, self._idle = self._idle, []
                self._open -= len(stale)
            self._cond.notify_all()
        for dead in [conn, *stale]:
            with contextlib.suppress(Exception):
                dead.close()

    def close(self) -> None:
        """Close the idle connections now; those in use are closed when given back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()


def _as_is(moment: datetime) -> datetime:
    return moment


_DIALECT = Dialect(
    mark=lambda name: f"%({name})s",
    key='idempotency_key COLLATE "C"',  # by code point, as the order of find
    starts_with="starts_with(idempotency_key, {prefix})",
    time=_as_is,
)


def _one(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    row = cursor.fetchone()
    assert row is not None  # an aggregate or expression query always returns a row
    return tuple(row)


def _opt_utc(moment: datetime | None) -> datetime | None:
    return utc(moment) if moment is not None else None


def _aware(value: Any) -> datetime:
    assert isinstance(value, datetime)
    return value.astimezone(UTC)


def _maybe(value: Any) -> datetime | None:
    return _aware(value) if value is not None else None


def _record(row: tuple[Any, ...] | Any) -> JobRecord:
    key, job_id, task, status, attempts, created, updated, worker, lease, error, due = row
    return JobRecord(
        idempotency_key=key,
        job_id=job_id,
        task=task,
        status=Status(status),
        attempts=attempts,
        created_at=_aware(created),
        updated_at=_aware(updated),
        worker=worker,
        lease_until=_maybe(lease),
        last_error=error,
        due_at=_maybe(due),
    )


def _record_params(record: JobRecord) -> dict[str, Any]:
    params = asdict(record)
    params["status"] = record.status.value
    return params


def _payload_params(key: str, stored: PayloadText, moment: datetime) -> dict[str, Any]:
    return {"key": key, "payload": stored.text, "bytes": stored.size, "kept_at": moment}


def _payload_columns(jobs: Sequence[Job], moment: datetime) -> dict[str, Any]:
    """The payloads of ``jobs`` as arrays (the first copy of a key only; a job whose
    payload is no JSON is left out), for :attr:`_Queries.publish_keeping`."""
    keys: list[str] = []
    texts: list[str | None] = []
    sizes: list[int] = []
    for job in jobs:
        stored = payload_text(job.payload)
        if stored is not None and job.idempotency_key not in keys:
            keys.append(job.idempotency_key)
            texts.append(stored.text)
            sizes.append(stored.size)
    return {"payload_keys": keys, "payload_texts": texts, "payload_bytes": sizes, "kept_at": moment}


def _claim_params(job: Job, worker: str, lease: float, now: datetime | None) -> dict[str, Any]:
    return {
        "key": job.idempotency_key,
        "job_id": job.id,
        "task": job.task,
        "attempt": job.attempt,
        "worker": worker,
        "lease": lease,
        "now": _opt_utc(now),
    }


def _finish_params(
    key: str,
    worker: str,
    status: Status,
    *,
    error: str | None = None,
    due_at: datetime | None = None,
    now: datetime | None,
) -> dict[str, Any]:
    return {
        "key": key,
        "worker": worker,
        "status": status.value,
        "error": clip_error(error) if error is not None else None,
        "due_at": due_at,
        "now": _opt_utc(now),
    }
