"""The PostgreSQL store's statements, composed once per store for its schema, and
the parameters they take. Each state change is one statement (a claim is an upsert
whose ``WHERE`` is the claim rules of :func:`broker_jobs.store.rules.decide`; an
outcome and the payload kept with it are one statement with a CTE), so the store's
methods mostly pick a statement and its parameters: the SQL is here, the control
flow in :mod:`broker_jobs.store.postgres`. The tables themselves are
:mod:`broker_jobs.store.postgres_schema`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from broker_jobs.envelope import Job
from broker_jobs.store.dead_letter_index import Dialect as LetterDialect
from broker_jobs.store.dead_letter_index import IndexRow
from broker_jobs.store.ledger import BUCKETS_SQL, COUNTS_SQL, FINISHED_COUNTS_SQL, Dialect
from broker_jobs.store.records import Finish, JobRecord, Output, PayloadText
from broker_jobs.store.rows import record_of
from broker_jobs.store.values import follow_ups_text, payload_text, utc

with contextlib.suppress(ImportError):  # the store says what to install
    import psycopg
    from psycopg import sql

COLUMNS = (
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
COLUMN_TYPES = tuple(
    zip(
        COLUMNS,
        ("text", "text", "text", "text", "integer")
        + ("timestamptz",) * 2
        + ("text", "timestamptz", "text", "timestamptz"),
        strict=True,
    )
)
#: The statement's time: the caller's fixed clock, else the server's.
NOW = "COALESCE(%(now)s::timestamptz, statement_timestamp())"
NEWEST_FIRST = 'ORDER BY updated_at DESC, idempotency_key COLLATE "C" DESC'


def table_name(schema: str | None, table: str) -> sql.Identifier:
    """``table`` in ``schema`` (else in the connection's search path)."""
    return sql.Identifier(schema, table) if schema else sql.Identifier(table)


class Queries:
    """Every statement of the store's calls, composed once for the store's schema."""

    def __init__(self, schema: str | None) -> None:
        def name(table: str) -> sql.Identifier:
            return table_name(schema, table)

        self.records = name("broker_jobs_records")
        self.version_table = name("broker_jobs_schema")
        self.fires = name("broker_jobs_beat_fires")
        self.leaders = name("broker_jobs_beat_leaders")
        self.executions = name("broker_jobs_executions")
        self.payloads = name("broker_jobs_payloads")
        self.outputs = name("broker_jobs_outputs")
        # The dead letters' index, the heartbeats and the queue depths: statements of
        # their own.
        self.letters, self.processes, self.depths = (
            LetterQueries(name("broker_jobs_dead_letters")),
            ProcessQueries(
                name("broker_jobs_processes"), name("broker_jobs_pauses"), name("broker_jobs_stops")
            ),
            DepthQueries(name("broker_jobs_depths")),
        )
        self.schema = sql.Identifier(schema) if schema else None
        cols = sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
        self.cols = cols

        def q(template: str) -> sql.Composed:
            return sql.SQL(template).format(records=self.records, cols=cols)

        self.claim = q(
            "INSERT INTO {records} AS r ({cols})"
            " SELECT %(key)s, %(job_id)s, %(task)s, 'running', %(attempt)s,"
            "  LEAST(%(created_at)s::timestamptz, n.now), n.now,"  # rules.created_time
            "  %(worker)s, n.now + make_interval(secs => %(lease)s), NULL, NULL"
            f" FROM (SELECT {NOW} AS now) AS n"
            " ON CONFLICT (idempotency_key) DO UPDATE SET"
            "  job_id = excluded.job_id, task = excluded.task, status = 'running',"
            "  attempts = excluded.attempts, updated_at = excluded.updated_at,"
            "  worker = excluded.worker, lease_until = excluded.lease_until, due_at = NULL"
            # The claim rules of broker_jobs.store.rules.decide, as SQL:
            " WHERE (r.status = 'running' AND r.attempts <= excluded.attempts"
            "        AND (r.worker = excluded.worker OR r.lease_until IS NULL"
            "             OR r.lease_until <= excluded.updated_at))"
            "  OR (r.status = 'retrying' AND r.attempts < excluded.attempts)"
            "  OR r.status IN ('queued', 'scheduled')"  # known from its publish: as new
            " RETURNING {cols}"
        )
        self.get_at = q(f"SELECT {{cols}}, {NOW} FROM {{records}} WHERE idempotency_key = %(key)s")
        self.lock_at = q(
            f"SELECT {{cols}}, {NOW} FROM {{records}} WHERE idempotency_key = %(key)s FOR UPDATE"
        )
        held = " WHERE idempotency_key = %(key)s AND status = 'running' AND worker = %(worker)s"
        self.renew = q(
            f"UPDATE {{records}} SET lease_until = {NOW} + make_interval(secs => %(lease)s)" + held
        )
        self.finish = q(
            f"UPDATE {{records}} SET status = %(status)s, updated_at = {NOW},"
            " lease_until = NULL, last_error = COALESCE(%(error)s::text, last_error),"
            " due_at = %(due_at)s::timestamptz" + held
        )
        # The claim given back (no holder), or its lease ended (a holder known dead).
        self.release, self.lapse = (
            q(f"UPDATE {{records}} SET {ending}lease_until = {NOW}" + held)
            for ending in ("worker = NULL, ", "")
        )
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
        # A success and its output (docs/store.md, "Results and follow-ups") in one
        # statement: the count says if it was ours; the output replaces any before.
        self.finish_with_output = sql.Composed(
            [
                sql.SQL("WITH done AS ("),
                self.finish,
                sql.SQL(
                    " RETURNING idempotency_key, updated_at), kept AS (INSERT INTO {outputs}"
                    " (idempotency_key, result, result_bytes, follow_ups, sent_at, kept_at)"
                    " SELECT idempotency_key, %(result)s, %(result_bytes)s, %(follow_ups)s,"
                    " NULL, updated_at FROM done ON CONFLICT (idempotency_key) DO UPDATE SET"
                    " result = excluded.result, result_bytes = excluded.result_bytes,"
                    " follow_ups = excluded.follow_ups, sent_at = NULL,"
                    " kept_at = excluded.kept_at) SELECT count(*) FROM done"
                ).format(outputs=self.outputs),
            ]
        )
        self.kept_output = sql.SQL(
            "SELECT result, result_bytes, follow_ups, sent_at, kept_at FROM {outputs}"
            " WHERE idempotency_key = %(key)s"
        ).format(outputs=self.outputs)
        self.follow_ups_sent = sql.SQL(
            f"UPDATE {{outputs}} SET sent_at = {NOW} WHERE idempotency_key = %(key)s"
        ).format(outputs=self.outputs)
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
        self.server_now = sql.SQL(f"SELECT {NOW}")
        # One statement for a batch: the rows as one array per column.
        arrays = ", ".join(f"%({column})s::{kind}[]" for column, kind in COLUMN_TYPES)
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
        self.get = q("SELECT {cols} FROM {records} WHERE idempotency_key = %(key)s")
        self.by_job_id = q("SELECT {cols} FROM {records} WHERE job_id = %(job_id)s " + NEWEST_FIRST)
        self.counts = q("SELECT status, count(*) FROM {records} GROUP BY status")
        self.executions_of = sql.SQL(
            "SELECT idempotency_key, job_id, attempt, worker, started_at, finished_at, outcome,"
            " error FROM {executions} WHERE idempotency_key = %(key)s ORDER BY id"
        ).format(executions=self.executions)
        self.prune = q(
            "DELETE FROM {records} WHERE status = ANY(%(terminal)s) AND updated_at < %(cutoff)s"
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
            "INSERT INTO {leaders} (group_name, identity, since, seen_at, schedules)"
            f" VALUES (%(group)s, %(identity)s, %(since)s, {NOW}, %(schedules)s)"
            " ON CONFLICT (group_name) DO UPDATE SET identity = excluded.identity,"
            "  since = excluded.since, seen_at = excluded.seen_at,"
            "  schedules = excluded.schedules"
        )
        self.leader = beat(
            "SELECT group_name, identity, since, seen_at, schedules FROM {leaders}"
            " WHERE group_name = %(group)s"
        )
        # The same, on leaders without the schedules column (a role that could not add
        # it): the record says nothing of the schedules.
        self.record_leader_alone = beat(
            "INSERT INTO {leaders} (group_name, identity, since, seen_at)"
            f" VALUES (%(group)s, %(identity)s, %(since)s, {NOW})"
            " ON CONFLICT (group_name) DO UPDATE SET identity = excluded.identity,"
            "  since = excluded.since, seen_at = excluded.seen_at"
        )
        self.leader_alone = beat(
            "SELECT group_name, identity, since, seen_at FROM {leaders}"
            " WHERE group_name = %(group)s"
        )

    def prune_with(self, tables: Sequence[sql.Identifier]) -> sql.Composed:
        """:attr:`prune`, deleting the records' rows in ``tables`` (payloads, outputs)
        in the same statement; returns the count of records."""
        if not tables:
            return self.prune
        gone = [
            sql.SQL(
                ", gone_{n} AS (DELETE FROM {table} WHERE"
                " idempotency_key IN (SELECT idempotency_key FROM doomed))"
            ).format(n=sql.SQL(str(n)), table=table)
            for n, table in enumerate(tables)
        ]
        return sql.Composed(
            [
                sql.SQL("WITH doomed AS ("),
                self.prune,
                sql.SQL(" RETURNING idempotency_key)"),
                *gone,
                sql.SQL(" SELECT count(*) FROM doomed"),
            ]
        )

    def keep(self, rows: str) -> sql.Composed:
        """Keep the payloads of ``rows`` (a VALUES or SELECT of key, payload, bytes,
        kept_at); a key that has one keeps it (the first one kept wins)."""
        return sql.SQL(
            "INSERT INTO {payloads} (idempotency_key, payload, bytes, kept_at) "
            + rows
            + " ON CONFLICT (idempotency_key) DO NOTHING"
        ).format(payloads=self.payloads)

    def find(self, where: str, order: str = NEWEST_FIRST) -> sql.Composed:
        return sql.SQL(
            "SELECT {cols} FROM {records} " + where + " " + order + " LIMIT %(limit)s"
        ).format(records=self.records, cols=self.cols)

    def count(self, where: str) -> sql.Composed:
        return sql.SQL("SELECT count(*) FROM {records} " + where).format(records=self.records)

    def summary(self, template: str, **more: str) -> sql.Composed:
        """A query of :mod:`broker_jobs.store.ledger` for these tables."""
        marks = {name: f"%({name})s" for name in ("now", "minute", "hour")}
        text = template.format(records="{records}", executions="{executions}", **marks, **more)
        return sql.SQL(text).format(records=self.records, executions=self.executions)


class ProcessQueries:
    """The statements of the heartbeat records (:mod:`broker_jobs.store.processes`,
    in ``table``) and of the paused tasks (:mod:`broker_jobs.store.controls`, in
    ``pauses``): what the operator sees of the daemons and tells them."""

    def __init__(
        self, table: sql.Identifier, pauses: sql.Identifier, stops: sql.Identifier
    ) -> None:
        def q(template: str) -> sql.Composed:
            return sql.SQL(template).format(processes=table, pauses=pauses, stops=stops)

        self.table, self.pauses, self.stops = table, pauses, stops
        self.request_stop = q(
            "INSERT INTO {stops} (worker_id, namespace, asked_at, asked_by)"
            f" VALUES (%(worker_id)s, %(namespace)s, {NOW}, %(by)s)"
            " ON CONFLICT (worker_id) DO NOTHING"
        )
        self.stops_of = q(
            "SELECT namespace, worker_id, asked_at, asked_by FROM {stops}"
            ' WHERE namespace = %(namespace)s ORDER BY worker_id COLLATE "C"'
        )
        self.clear_stop = q("DELETE FROM {stops} WHERE worker_id = %(worker_id)s RETURNING 1")
        self.pause = q(
            "INSERT INTO {pauses} (namespace, task, paused_at, paused_by)"
            f" VALUES (%(namespace)s, %(task)s, {NOW}, %(by)s)"
            " ON CONFLICT (namespace, task) DO NOTHING"
        )
        self.pauses_of = q(
            "SELECT namespace, task, paused_at, paused_by FROM {pauses}"
            " WHERE namespace = %(namespace)s AND (%(task)s::text IS NULL OR task = %(task)s)"
            ' ORDER BY task COLLATE "C"'
        )
        self.resume = q(
            "DELETE FROM {pauses} WHERE namespace = %(namespace)s AND task = %(task)s RETURNING 1"
        )
        self.record = q(
            "INSERT INTO {processes} (id, namespace, seen_at, document)"
            " VALUES (%(id)s, %(namespace)s, %(seen_at)s, %(document)s)"
            " ON CONFLICT (id) DO UPDATE SET namespace = excluded.namespace,"
            "  seen_at = excluded.seen_at, document = excluded.document"
        )
        self.of_namespace = q(
            "SELECT document FROM {processes}"
            " WHERE %(namespace)s::text IS NULL OR namespace = %(namespace)s"
            " ORDER BY seen_at DESC"
        )
        self.forget = q("DELETE FROM {processes} WHERE seen_at < %(cutoff)s RETURNING 1")


class DepthQueries:
    """The statements of the queue depths over time (:mod:`broker_jobs.store.depths`,
    in ``table``): a minute's row takes the newest sample, an hour's the largest."""

    def __init__(self, table: sql.Identifier) -> None:
        def q(template: str) -> sql.Composed:
            return sql.SQL(template).format(depths=table)

        self.table = table
        self.record = q(
            "INSERT INTO {depths} AS d (namespace, task, step, at, ready)"
            " VALUES (%(namespace)s, %(task)s, %(step)s, %(at)s, %(ready)s)"
            " ON CONFLICT (namespace, step, at, task) DO UPDATE SET ready = CASE"
            "  WHEN %(peak)s THEN GREATEST(d.ready, excluded.ready) ELSE excluded.ready END"
        )
        self.forget = q(
            "DELETE FROM {depths}"
            " WHERE namespace = %(namespace)s AND step = %(step)s AND at < %(cutoff)s"
        )
        self.of_step = q(
            "SELECT task, at, ready FROM {depths}"
            " WHERE namespace = %(namespace)s AND step = %(step)s AND at >= %(since)s"
            ' ORDER BY task COLLATE "C", at'
        )


class LetterQueries:
    """The statements of the index of dead letters
    (:mod:`broker_jobs.store.dead_letter_index`), for its ``table``."""

    def __init__(self, table: sql.Identifier) -> None:
        self.table = table
        # A second copy of an entry rewrites it in its place (seq stays), seen anew
        # (after :attr:`renew`).
        self.index = self._q(
            "INSERT INTO {letters} (task, letter_id, job_id, idempotency_key, reason, error,"
            " dead_at, document, body, body_size, pass_id, indexed_at) VALUES (%(task)s,"
            " %(letter_id)s, %(job_id)s, %(idempotency_key)s, %(reason)s, %(error)s,"
            " %(dead_at)s, %(document)s, %(body)s, %(body_size)s, %(pass_id)s, " + NOW + ")"
            " ON CONFLICT (task, letter_id) DO UPDATE SET job_id = excluded.job_id,"
            " idempotency_key = excluded.idempotency_key, reason = excluded.reason,"
            " error = excluded.error, dead_at = excluded.dead_at, document = excluded.document,"
            " body = excluded.body, body_size = excluded.body_size, pass_id = excluded.pass_id,"
            " indexed_at = excluded.indexed_at"
        )
        # An entry of an earlier dead-lettering of the job (another dead at: it was
        # replayed and died again) goes before the new one is written: placed last.
        self.renew = self._q(
            "DELETE FROM {letters} WHERE task = %(task)s AND letter_id = %(letter_id)s"
            " AND dead_at IS DISTINCT FROM %(dead_at)s"
        )
        # Only while it is the dead-lettering the pass took (the same dead at).
        self.unindex = self._q(
            "DELETE FROM {letters} AS entry USING unnest(%(ids)s::text[],"
            " %(dead_ats)s::timestamptz[]) AS taken (letter_id, dead_at)"
            " WHERE entry.task = %(task)s AND entry.letter_id = taken.letter_id"
            " AND entry.dead_at IS NOT DISTINCT FROM taken.dead_at"
        )
        self.mark = self._q("SELECT coalesce(max(seq), 0) FROM {letters} WHERE task = %(task)s")
        self.sweep = self._q(
            "DELETE FROM {letters} WHERE task = %(task)s AND seq <= %(up_to)s"
            " AND pass_id IS DISTINCT FROM %(pass_id)s"
        )

    def page(self, where: str) -> sql.Composed:
        """The entries ``where`` takes (the condition of
        :func:`~broker_jobs.store.dead_letter_index.where_sql`), a page in their order."""
        # The page's places first (the skipped rows' wide columns are never read:
        # at offset 99,950 of 100,000, 366 ms -> 112 ms), then its rows.
        return self._q(
            "SELECT document, body, body_size, seq, indexed_at FROM {letters} WHERE seq IN"
            " (SELECT seq FROM {letters} WHERE "
            + where
            + " ORDER BY seq LIMIT %(limit)s OFFSET %(offset)s) ORDER BY seq"
        )

    def counts(self, where: str) -> sql.Composed:
        """How many entries of each task ``where`` takes."""
        return self._q("SELECT task, count(*) FROM {letters} WHERE " + where + " GROUP BY task")

    def _q(self, template: str) -> sql.Composed:
        return sql.SQL(template).format(letters=self.table)


def as_is(moment: datetime) -> datetime:
    return moment


DIALECT = Dialect(
    mark=lambda name: f"%({name})s",
    key='idempotency_key COLLATE "C"',  # by code point, as the order of find
    starts_with="starts_with(idempotency_key, {prefix})",
    time=as_is,
)


#: The index of dead letters' filter (a time is passed as it is).
LETTER_DIALECT = LetterDialect(
    placeholder=lambda name: f"%({name})s",
    substring="strpos",
    moment=as_is,
    table="{letters}",  # LetterQueries fills in the table of the store's schema
)


def one_row(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    row = cursor.fetchone()
    assert row is not None  # an aggregate or expression query always returns a row
    return tuple(row)


def opt_utc(moment: datetime | None) -> datetime | None:
    return utc(moment) if moment is not None else None


def aware(value: Any) -> datetime:
    assert isinstance(value, datetime)
    return value.astimezone(UTC)


def maybe_aware(value: Any) -> datetime | None:
    return aware(value) if value is not None else None


def read_record(row: Sequence[Any]) -> JobRecord:
    return record_of(row, maybe_aware)


def record_params(record: JobRecord) -> dict[str, Any]:
    params = asdict(record)
    params["status"] = record.status.value
    return params


def payload_params(key: str, stored: PayloadText, moment: datetime) -> dict[str, Any]:
    return {"key": key, "payload": stored.text, "bytes": stored.size, "kept_at": moment}


def payload_columns(jobs: Sequence[Job], moment: datetime) -> dict[str, Any]:
    """The payloads of ``jobs`` as arrays (the first copy of a key only; a job whose
    payload is no JSON is left out), for :attr:`Queries.publish_keeping`."""
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


def claim_params(job: Job, worker: str, lease: float, now: datetime | None) -> dict[str, Any]:
    return {
        "key": job.idempotency_key,
        "job_id": job.id,
        "task": job.task,
        "attempt": job.attempt,
        "created_at": job.created_at,
        "worker": worker,
        "lease": lease,
        "now": opt_utc(now),
    }


def letter_params(row: IndexRow, pass_id: str | None, now: datetime | None) -> dict[str, Any]:
    """The parameters of :attr:`Queries.index_letter` (``now``: None, the server's time)."""
    return {**row.params(), "pass_id": pass_id, "now": opt_utc(now)}


def output_params(output: Output) -> dict[str, Any]:
    """The columns of :attr:`Queries.finish_with_output` beside the finish's."""
    result = output.result
    return {
        "result": result.text if result is not None else None,
        "result_bytes": result.size if result is not None else None,
        "follow_ups": follow_ups_text(output.follow_ups),
    }


def finish_params(key: str, worker: str, finish: Finish, now: datetime | None) -> dict[str, Any]:
    return {
        "key": key,
        "worker": worker,
        "status": finish.status.value,
        "error": finish.error,
        "due_at": finish.due_at,
        "now": opt_utc(now),
    }
