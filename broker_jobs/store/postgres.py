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

The ledger's index of dead letters is one more table: an entry is written in the
transaction of the record that makes its job dead; a role that may not write the
table keeps none (:attr:`~broker_jobs.store.base.Store.indexes_dead_letters` is False).

Why some 780 lines: each method of :class:`~broker_jobs.store.base.Store` is a few
lines around one statement, and they stay together so that one reads how this store
meets the contract; the SQL lives in ``postgres_queries``, the schema, its migrations
and the advice on a missing table or grant in ``postgres_schema``, the connection
pool in ``postgres_pool``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, NoReturn

from broker_jobs.dead_letter import DeadLetter, DeadLetterFilter
from broker_jobs.envelope import Job
from broker_jobs.plural import plural
from broker_jobs.store.base import Rule, Store
from broker_jobs.store.controls import StopRequest, TaskPause
from broker_jobs.store.dead_letter_index import IndexedDeadLetter, IndexRow, read_entry, where_sql
from broker_jobs.store.depths import (
    DepthSeries,
    cutoffs,
    depth_rows,
    series_by_task,
    step_seconds,
)
from broker_jobs.store.errors import LeaseLostError, StoreError, StoreUnavailableError
from broker_jobs.store.ledger import (
    Buckets,
    Filters,
    Tally,
    summaries,
    tally_records,
    window_params,
)
from broker_jobs.store.postgres_logs import ours, pipelined
from broker_jobs.store.postgres_pool import Pool
from broker_jobs.store.postgres_queries import (
    COLUMNS,
    DIALECT,
    LETTER_DIALECT,
    Queries,
    as_is,
    aware,
    claim_params,
    finish_params,
    letter_params,
    maybe_aware,
    one_row,
    opt_utc,
    output_params,
    payload_columns,
    payload_params,
    read_record,
    record_params,
)
from broker_jobs.store.postgres_schema import SCHEMA_VERSION, Schema
from broker_jobs.store.processes import ProcessRecord, process_document, process_of
from broker_jobs.store.records import (
    SUCCESS,
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
    PayloadText,
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
from broker_jobs.store.rules import decide, holds, published_record
from broker_jobs.store.values import check_lease, leader_schedules_text, mask_dsn, utc

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
except ImportError as _error:  # pragma: no cover - exercised by a test that hides psycopg
    _MISSING: ImportError | None = _error
else:
    _MISSING = None

__all__ = ["PostgresStore", "SCHEMA_VERSION", "DEFAULT_MAX_CONNECTIONS", "DEFAULT_CONNECT_TIMEOUT"]

log = logging.getLogger(__name__)

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
#: How often a claim re-tries when the row changed between its upsert and its read.
_CLAIM_ROUNDS = 10
#: SQLSTATEs of a server shutting down or not ready: admin_shutdown, crash_shutdown,
#: cannot_connect_now.
_SHUTDOWN_STATES = frozenset({"57P01", "57P02", "57P03"})
#: A server's FATAL refusals of a connection that pass: starting up, shutting down,
#: recovering, out of connection slots.
_BUSY_SERVER = ("the database system is", "too many", "connection slots")


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
        self._q = Queries(schema)
        self._layout = Schema(self._q, schema, self, f"PostgreSQL store {self.masked_dsn}")
        self._keeps_payloads = False  # until _migrate finds the table writable
        self.indexes_dead_letters = False  # likewise
        self._pool = Pool(self._connect, max_connections, pool_wait, self)
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
        # libpq's messages span lines ("...refused\n\tIs the server running..."):
        # one line, as every error and log line of ours is.
        text = mask_dsn(" ".join(str(error).split()))
        where = f"PostgreSQL store {self.masked_dsn}"
        advice = self._layout.advice(error, text)
        kind = StoreUnavailableError if self._unavailable(error, text) else StoreError
        if advice is None:
            raise kind(f"{where}: cannot {action}: {type(error).__name__}: {text}") from None
        raise kind(f"{where}: cannot {action}: {text}. {advice}") from None

    def _unavailable(self, error: psycopg.Error, text: str) -> bool:
        """An outage (:meth:`is_outage`), unless the server refused the connection
        for good: a missing database or role, a wrong password (libpq gives these no
        SQLSTATE, only the server's FATAL line)."""
        if not self.is_outage(error):
            return False
        refused = "FATAL:" in text and not any(busy in text for busy in _BUSY_SERVER)
        return not refused

    def _run(self, action: str, statement: sql.Composed, params: Any = None) -> list[Any]:
        """One statement on a connection of the pool; the rows it returns (none: [])."""
        with self._pool.connection() as conn, self._translate(action):
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description is not None else []

    def _run_one(self, action: str, statement: sql.Composed, params: Any = None) -> Any:
        """The row of a query of at most one (None without)."""
        found = self._run(action, statement, params)
        return found[0] if found else None

    def _migrate(self) -> None:
        with self._pool.connection() as conn, self._translate("create the tables"):
            self._keeps_payloads = self._layout.open(conn)
        self.indexes_dead_letters = self._layout.keeps_dead_letters

    # --- claims and state changes ---------------------------------------------------

    def claim(self, job: Job, worker: str, lease: float, *, now: datetime | None = None) -> Claim:
        params = claim_params(job, worker, check_lease(lease), now)
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
        params = [claim_params(job, worker, lease, None) for job, worker in claims]
        found: dict[int, Claim] = {}
        with (
            self._pool.connection() as conn,
            self._translate(f"claim {plural(len(claims), 'job')}"),
            conn.transaction(),
        ):
            with pipelined(conn):
                cursors = [(index, conn.execute(self._q.claim, params[index])) for index in order]
            for index, cursor in cursors:
                row = cursor.fetchone()
                if row is not None:
                    found[index] = Claim(ClaimOutcome.CLAIMED, read_record(row))
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
                    return Claim(ClaimOutcome.CLAIMED, read_record(row))
            upserted = False
            # Not claimable when the upsert ran; read why. The row may have changed
            # since (released, expired, pruned): then try the upsert again.
            found = conn.execute(self._q.get_at, params).fetchone()
            if found is None:
                continue
            record, moment = read_record(found[:-1]), aware(found[-1])
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
        params = [finish_params(key, worker, SUCCESS, None) for key, worker in sorted(finished)]
        with (
            self._pool.connection() as conn,
            self._translate(f"record {plural(len(finished), 'success', 'successes')}"),
            conn.transaction(),
        ):
            with pipelined(conn):
                cursors = [(one["key"], conn.execute(self._q.finish, one)) for one in params]
            return [key for key, cursor in cursors if cursor.rowcount != 1]

    def succeed_many_keeping(self, finished: Sequence[tuple[str, str, Output]]) -> list[str]:
        """Every success and its output in ONE transaction, pipelined, as
        :meth:`succeed_many` (measured: one transaction per success halved the
        drain of a task that returns a result)."""
        if not self._layout.keeps_outputs:
            return self.succeed_many([(key, worker) for key, worker, _ in finished])
        params = [
            {**finish_params(key, worker, SUCCESS, None), **output_params(output)}
            for key, worker, output in sorted(finished, key=lambda one: one[0])
        ]
        with (
            self._pool.connection() as conn,
            self._translate(f"record {plural(len(finished), 'success', 'successes')}"),
            conn.transaction(),
        ):
            with pipelined(conn):
                statement = self._q.finish_with_output
                cursors = [(one["key"], conn.execute(statement, one)) for one in params]
            return [key for key, cursor in cursors if one_row(cursor)[0] != 1]

    def renew(self, key: str, worker: str, lease: float, *, now: datetime | None = None) -> None:
        params = {"key": key, "worker": worker, "lease": check_lease(lease), "now": opt_utc(now)}
        self._update_held(self._q.renew, params, "renew the lease of")

    def _finish(self, key: str, worker: str, finish: Finish, now: datetime | None) -> None:
        # The outcome, and its payload or output kept with it, in one statement.
        params = finish_params(key, worker, finish, now)
        stored = self._kept(finish.payload)
        if finish.output is not None and self._layout.keeps_outputs:
            statement, params = (
                self._q.finish_with_output,
                {**params, **output_params(finish.output)},
            )
            self._update_held(statement, params, finish.action, counted=True)
        elif stored is None:
            self._update_held(self._q.finish, params, finish.action)
        else:
            more = {"payload": stored.text, "bytes": stored.size}
            statement, params = self._q.finish_keeping, {**params, **more}
            self._update_held(statement, params, finish.action, counted=True)

    def _kept(self, payload: PayloadText | None) -> PayloadText | None:
        """``payload``, unless this store keeps none (no table, or a role that cannot
        write it)."""
        return payload if self._keeps_payloads else None

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
            changed = one_row(cursor)[0] if counted else cursor.rowcount
            if changed == 1:
                return
            row = conn.execute(self._q.get, params).fetchone()
        raise LeaseLostError(key, params["worker"], read_record(row) if row else None, action)

    def succeed_with(
        self,
        key: str,
        worker: str,
        effects: Callable[[Any], Output | None],
        *,
        now: datetime | None = None,
    ) -> None:
        """Run ``effects(conn)`` and record SUCCEEDED (with the output ``effects``
        returns) in ONE transaction: both are committed, or neither.

        The record is locked first (``SELECT ... FOR UPDATE``): if ``worker`` does not
        hold it, :class:`LeaseLostError` is raised before ``effects`` runs. While the
        transaction is open, another worker's claim of the key waits for it, then sees
        SUCCEEDED (DONE). ``effects`` writes with ``conn`` (inside the transaction: do
        not commit, roll back or change session settings); an exception from it rolls
        everything back and propagates unchanged, and the record stays RUNNING, ours.
        If the connection breaks during the commit, the outcome is unknown:
        ``get(key)`` tells (SUCCEEDED means the effects were committed too).
        """
        params = finish_params(key, worker, SUCCESS, now)
        stage = "lock the record of"
        with self._pool.connection() as conn:
            try:
                with conn.transaction():
                    row = conn.execute(self._q.lock_at, params).fetchone()
                    record = read_record(row[:-1]) if row else None
                    if not holds(record, worker):
                        raise LeaseLostError(key, worker, record, SUCCESS.action)
                    stage = "effects"
                    output = effects(conn)
                    stage = "record success (effects rolled back) of"
                    if output is not None and not output.empty and self._layout.keeps_outputs:
                        more = output_params(output)
                        conn.execute(self._q.finish_with_output, {**params, **more})
                    else:
                        conn.execute(self._q.finish, params)
                    stage = "commit (outcome unknown: get(key) tells) the success of"
            except psycopg.Error as error:
                if stage == "effects":
                    raise
                self._raise(f"{stage} job key {key!r}", error)

    def _rewrite(
        self,
        key: str,
        rule: Rule,
        now: datetime | None,
        action: str,
        payload: PayloadText | None = None,
        *,
        letter: IndexRow | None = None,
    ) -> JobRecord | None:
        stored = self._kept(payload)
        indexed = letter if self.indexes_dead_letters else None
        for _ in range(_CLAIM_ROUNDS):
            with self._locked(key, now, action) as (conn, record, moment):
                new = rule(record, moment)
                if new is not None:
                    if record is not None:
                        conn.execute(self._q.overwrite, record_params(new))
                    elif conn.execute(self._q.insert_missing, record_params(new)).rowcount != 1:
                        continue  # another call created the record meanwhile: decide again
                    if stored is not None:  # in the record's transaction
                        conn.execute(self._q.keep_payload, payload_params(key, stored, moment))
                if indexed is not None:  # likewise, whatever the rule decided
                    params = letter_params(indexed, None, moment)
                    conn.execute(self._q.letters.renew, params)
                    conn.execute(self._q.letters.index, params)
                return new
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
            row = conn.execute(self._q.lock_at, {"key": key, "now": opt_utc(now)}).fetchone()
            if row is None:
                yield conn, None, self._moment(conn, now)
            else:
                yield conn, read_record(row[:-1]), aware(row[-1])

    def _moment(self, conn: psycopg.Connection[Any], now: datetime | None) -> datetime:
        """``now`` in UTC, else the server's time."""
        if now is not None:
            return utc(now)
        return aware(one_row(conn.execute(self._q.server_now, {"now": None}))[0])

    def release(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        params = {"key": key, "worker": worker, "now": opt_utc(now)}
        self._run(f"release job key {key!r}", self._q.release, params)

    def lapse(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        params = {"key": key, "worker": worker, "now": opt_utc(now)}
        self._run(f"end the lease of job key {key!r}", self._q.lapse, params)

    # --- the ledger -------------------------------------------------------------------

    def get(self, key: str) -> JobRecord | None:
        row = self._run_one("read a record", self._q.get, {"key": key})
        return read_record(row) if row else None

    def get_by_job_id(self, job_id: str) -> list[JobRecord]:
        rows = self._run("read records", self._q.by_job_id, {"job_id": job_id})
        return [read_record(row) for row in rows]

    def _find(self, filters: Filters, limit: int) -> list[JobRecord]:
        where, params = filters.sql(DIALECT)
        query = self._q.find(where, filters.order_sql(DIALECT))
        rows = self._run("find records", query, {**params, "limit": limit})
        return [read_record(row) for row in rows]

    def _count(self, filters: Filters) -> int:
        where, params = filters.sql(DIALECT)
        return int(self._run_one("count records", self._q.count(where), params)[0])

    def task_summaries(self, *, now: datetime | None = None) -> dict[str, TaskSummary]:
        with self._pool.connection() as conn, self._translate("summarise the tasks"):
            params = window_params(self._moment(conn, now), as_is)
            tallies = tally_records(conn.execute(self._q.task_counts, params), maybe_aware)
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
            rows = conn.execute(self._q.outcome_buckets, buckets.params(as_is)).fetchall()
        return buckets.gather(rows)

    def record_published(
        self, jobs: Sequence[Job], *, now: datetime | None = None
    ) -> list[JobRecord | None]:
        if not jobs:
            return []
        keys = [job.idempotency_key for job in jobs]
        with self._pool.connection() as conn, self._translate("record published jobs"):
            moment = self._moment(conn, now)
            rows = [record_params(published_record(job, moment)) for job in jobs]
            columns = {column: [row[column] for row in rows] for column in COLUMNS}
            statement, params = self._q.publish, columns
            if self._keeps_payloads:
                statement = self._q.publish_keeping
                params = {**columns, **payload_columns(jobs, moment)}
            inserted = {key for (key,) in conn.execute(statement, params)}
            # The records of the keys seen before (and of a key's second copy).
            wanted = [k for k, n in Counter(keys).items() if n > 1 or k not in inserted]
            found = conn.execute(self._q.get_many, {"keys": wanted}).fetchall() if wanted else []
        existing = {record.idempotency_key: record for record in map(read_record, found)}
        result: list[JobRecord | None] = []
        for key in keys:
            result.append(None if key in inserted else existing.get(key))
            inserted.discard(key)  # a second copy finds the first one's record
        return result

    def counts(self) -> dict[Status, int]:
        return status_counts(self._run("count records", self._q.counts))

    def executions(self, key: str) -> list[Execution]:
        rows = self._run("read executions", self._q.executions_of, {"key": key})
        return [execution_of(row, maybe_aware) for row in rows]

    def prune(self, older_than: datetime) -> int:
        # The records' delete trigger deletes their executions in the same statement,
        # and the statement their payloads and outputs.
        params = {"terminal": sorted(s.value for s in TERMINAL), "cutoff": utc(older_than)}
        tables = [self._q.payloads] if self._keeps_payloads else []
        if self._layout.keeps_outputs:
            tables.append(self._q.outputs)
        with self._pool.connection() as conn, self._translate("prune records"):
            if not tables:
                return conn.execute(self._q.prune, params).rowcount
            return int(one_row(conn.execute(self._q.prune_with(tables), params))[0])

    def output(self, key: str) -> KeptOutput | None:
        if not self._layout.keeps_outputs:  # no table (a role that cannot add it): none kept
            return None
        row = self._run_one("read an output", self._q.kept_output, {"key": key})
        return kept_output_of(row, maybe_aware)

    def mark_follow_ups_sent(self, key: str, *, now: datetime | None = None) -> None:
        if self._layout.keeps_outputs:
            params = {"key": key, "now": opt_utc(now)}  # else the server's time, as kept_at
            self._run("record follow-ups sent", self._q.follow_ups_sent, params)

    def kept_payload(self, key: str) -> KeptPayload | None:
        if not self._keeps_payloads:  # no table (a role that cannot migrate): none kept
            return None
        row = self._run_one("read a payload", self._q.kept_payload, {"key": key})
        return kept_payload_of(row, maybe_aware)

    # --- the index of dead letters (none kept by a role that may not write it) ---------

    def _index(self, rows: Sequence[IndexRow], pass_id: str | None) -> None:
        params = [letter_params(row, pass_id, None) for row in rows]
        with (
            self._pool.connection() as conn,
            self._translate(f"index {len(rows)} dead letters"),
            conn.transaction(),
            pipelined(conn),
        ):
            cursor = conn.cursor()
            for row in params:  # row by row: a batch may hold one letter twice
                cursor.execute(self._q.letters.renew, row)
                cursor.execute(self._q.letters.index, row)

    def dead_letters(
        self,
        tasks: Sequence[str],
        where: DeadLetterFilter | None = None,
        *,
        limit: int = 100,
        offset: int = 0,
    ) -> list[IndexedDeadLetter]:
        if not self.indexes_dead_letters:
            return []
        condition, params = where_sql(LETTER_DIALECT, tasks, where)
        more = {"limit": limit, "offset": offset}
        rows = self._run("read dead letters", self._q.letters.page(condition), {**params, **more})
        return [read_entry(doc, body, size, seq, aware(at)) for doc, body, size, seq, at in rows]

    def dead_letter_counts(
        self, tasks: Sequence[str], where: DeadLetterFilter | None = None
    ) -> dict[str, int]:
        counts = dict.fromkeys(tasks, 0)
        if self.indexes_dead_letters:
            condition, params = where_sql(LETTER_DIALECT, tasks, where)
            rows = self._run("count dead letters", self._q.letters.counts(condition), params)
            counts.update((task, int(count)) for task, count in rows)
        return counts

    def unindex_dead_letters(self, task: str, letters: Sequence[DeadLetter]) -> int:
        taken = {(letter.letter_id, letter.dead_at) for letter in letters}
        params = {
            "task": task,
            "ids": [letter_id for letter_id, _ in taken],
            "dead_ats": [dead_at for _, dead_at in taken],
        }
        return self._change("drop dead letters", self._q.letters.unindex, params)

    def dead_letter_mark(self, task: str) -> int:
        if not self.indexes_dead_letters:
            return 0
        row = self._run_one("read the dead letters' mark", self._q.letters.mark, {"task": task})
        return int(row[0])

    def sweep_dead_letters(self, task: str, *, up_to: int, pass_id: str) -> int:
        params = {"task": task, "up_to": up_to, "pass_id": pass_id}
        return self._change("sweep dead letters", self._q.letters.sweep, params)

    def _change(self, action: str, statement: sql.Composed, params: dict[str, Any]) -> int:
        """How many entries of the index one statement changed (0: it keeps none)."""
        if not self.indexes_dead_letters:
            return 0
        with self._pool.connection() as conn, self._translate(action):
            return conn.execute(statement, params).rowcount

    # --- beat records -------------------------------------------------------------

    def record_fire(self, schedule: str, fire_at: datetime) -> None:
        params = {"schedule": schedule, "fire_at": utc(fire_at)}
        self._run("record a fire", self._q.record_fire, params)

    def last_fire(self, schedule: str) -> datetime | None:
        row = self._run_one("read the beat's fires", self._q.last_fire, {"schedule": schedule})
        return aware(row[0]) if row else None

    def last_fires(self, prefix: str = "") -> dict[str, datetime]:
        rows = self._run("read the beat's fires", self._q.last_fires, {"prefix": prefix})
        return {schedule: aware(fire_at) for schedule, fire_at in rows}

    def record_leader(
        self,
        group: str,
        identity: str,
        since: datetime,
        *,
        now: datetime | None = None,
        schedules: Mapping[str, str] | None = None,
    ) -> None:
        params = {
            "group": group,
            "identity": identity,
            "since": utc(since),
            "now": opt_utc(now),
            "schedules": leader_schedules_text(identity, schedules),
        }
        if self._layout.keeps_leader_schedules:
            self._run("record the beat leader", self._q.record_leader, params)
        else:
            self._run("record the beat leader", self._q.record_leader_alone, params)

    def leader(self, group: str) -> LeaderRecord | None:
        query = self._q.leader if self._layout.keeps_leader_schedules else self._q.leader_alone
        row = self._run_one("read the beat leader", query, {"group": group})
        return leader_of(row, maybe_aware)

    def record_process(self, record: ProcessRecord) -> None:
        if not self._layout.keeps_processes:
            return  # said once at open: this role may not write the table
        params = {
            "id": record.id,
            "namespace": record.namespace,
            "seen_at": utc(record.seen_at),
            "document": process_document(record),
        }
        self._run("record a heartbeat", self._q.processes.record, params)

    def processes(self, namespace: str | None = None) -> list[ProcessRecord]:
        if not self._layout.keeps_processes:
            return []
        query, params = self._q.processes.of_namespace, {"namespace": namespace}
        rows = self._run("read the heartbeats", query, params)
        return [process_of(text) for (text,) in rows]

    def forget_processes(self, seen_before: datetime) -> int:
        if not self._layout.keeps_processes:
            return 0
        cutoff = {"cutoff": utc(seen_before)}
        return len(self._run("forget old heartbeats", self._q.processes.forget, cutoff))

    def pause(
        self, namespace: str, task: str, by: str, *, now: datetime | None = None
    ) -> TaskPause:
        params = {"namespace": namespace, "task": task, "by": by, "now": opt_utc(now)}
        self._run("pause a task", self._q.processes.pause, params)
        return self._pauses(namespace, task)[task]

    def resume(self, namespace: str, task: str) -> bool:
        params = {"namespace": namespace, "task": task}
        return bool(self._run("resume a task", self._q.processes.resume, params))

    def pauses(self, namespace: str) -> dict[str, TaskPause]:
        return self._pauses(namespace, None)

    def _pauses(self, namespace: str, task: str | None) -> dict[str, TaskPause]:
        params = {"namespace": namespace, "task": task}
        rows = self._run("read the paused tasks", self._q.processes.pauses_of, params)
        return {t: TaskPause(ns, t, aware(at), by) for ns, t, at, by in rows}

    def request_stop(
        self, namespace: str, worker_id: str, by: str, *, now: datetime | None = None
    ) -> StopRequest:
        params = {"namespace": namespace, "worker_id": worker_id, "by": by, "now": opt_utc(now)}
        self._run("ask a worker to stop", self._q.processes.request_stop, params)
        return self.stop_requests(namespace)[worker_id]

    def stop_requests(self, namespace: str) -> dict[str, StopRequest]:
        params = {"namespace": namespace}
        rows = self._run("read the stop requests", self._q.processes.stops_of, params)
        return {w: StopRequest(ns, w, aware(at), by) for ns, w, at, by in rows}

    def clear_stop(self, worker_id: str) -> bool:
        params = {"worker_id": worker_id}
        return bool(self._run("clear a stop request", self._q.processes.clear_stop, params))

    def record_depths(
        self, namespace: str, depths: Mapping[str, int], *, now: datetime | None = None
    ) -> None:
        if not self._layout.keeps_depths:
            raise StoreError(
                f"{self!r} has no table of queue depths (this role may not create it):"
                " open the store once as the database's owner to add it"
            )
        moment = utc(now)
        queries, rows = self._q.depths, depth_rows(depths, moment)
        with self._pool.connection() as conn, self._translate("record queue depths"):
            with conn.cursor() as cursor, ours():  # executemany pipelines
                cursor.executemany(
                    queries.record,
                    [
                        {"namespace": namespace, "task": r.task, "step": r.step, "at": r.at,
                         "ready": r.ready, "peak": r.peak}
                        for r in rows
                    ],
                )  # fmt: skip
            for step, cutoff in cutoffs(moment).items():
                params = {"namespace": namespace, "step": step, "cutoff": cutoff}
                conn.execute(queries.forget, params)

    def depth_history(
        self, namespace: str, *, step: timedelta, since: datetime
    ) -> dict[str, DepthSeries]:
        if not self._layout.keeps_depths:
            return {}
        params = {"namespace": namespace, "step": step_seconds(step), "since": utc(since)}
        rows = self._run("read queue depths", self._q.depths.of_step, params)
        return series_by_task(rows, aware)

    def close(self) -> None:
        self._pool.close()
