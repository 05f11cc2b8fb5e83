"""How fast the dashboard's pages answer, on the demo's data and on a big ledger.

Fills a store (SQLite by default; PostgreSQL with ``--store postgresql://...``) with
``--records`` ledger records (1,000,000 by default) through the store's own schema
(its tables, indexes and triggers), with a realistic spread of tasks, statuses and
times and a few executions per record; then serves the dashboard in-process (uvicorn
on a free port, in a thread) and times every page and JSON endpoint over real HTTP:
the first page of /jobs, a deep page through its cursor, filtered lists, a job's page,
the overview. The same runs first for a demo-sized ledger (``--demo-records``).

Beside the pages, the store queries behind them are timed on their own and, on
SQLite, their plans are printed (``EXPLAIN QUERY PLAN``: a ``SCAN`` of the records
is a query whose time grows with the ledger).

    python -m bench.dashboard                       # SQLite, 1,000,000 records
    python -m bench.dashboard --records 100000 --requests 10
    python -m bench.dashboard --store postgresql://user@localhost/db
    python -m bench.dashboard --store postgres      # a throwaway PostgreSQL node

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.publish import throwaway_postgres
from broker_jobs.store import SQLiteStore, Store
from broker_jobs.store.base import Status
from broker_jobs.store.ledger import Filters

DEFAULT_RECORDS = 1_000_000
DEFAULT_DEMO_RECORDS = 30
DEFAULT_REQUESTS = 20
#: The aims of the issue: p50 of every page, in ms.
DEMO_AIM_MS = 100.0
BIG_AIM_MS = 300.0

#: Tasks and their shares of the ledger.
TASKS = {
    "email.send": 30,
    "webhook.deliver": 18,
    "image.resize": 16,
    "report.build": 10,
    "invoice.render": 10,
    "search.index": 8,
    "thumbnail.make": 6,
    "export.csv": 2,
}
DEMO_TASKS = {"email.send": 1, "image.resize": 1}
#: Statuses and their shares: mostly finished; a backlog, a few running, a few failing.
STATUSES = {
    Status.SUCCEEDED: 9000,
    Status.QUEUED: 300,
    Status.SCHEDULED: 150,
    Status.FAILED: 200,
    Status.DEAD: 100,
    Status.CANCELLED: 50,
    Status.RETRYING: 50,
    Status.RUNNING: 5,
}
WORKERS = [f"worker-{host}-{pid}" for host in ("a", "b", "c", "d") for pid in (4101, 4102)]
ERRORS = (
    "ConnectionError: SMTP server smtp.example.com:587 refused the connection",
    "TimeoutError: the handler ran longer than its time limit (10 s)",
    "ValueError: image is 0x0 pixels",
    "HTTPError: 503 Service Unavailable from https://hooks.example.com/in",
)
#: Rows per executemany (and per transaction when filling).
CHUNK = 50_000


# -- the ledger's rows ------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One record and its executions, times as datetimes (each store writes its own)."""

    record: tuple[Any, ...]  # the columns of broker_jobs_records, in table order
    executions: list[tuple[Any, ...]]  # (attempt, worker, started, finished, outcome, error)


def job_id(at: datetime, rng: random.Random) -> str:
    """A UUID 7 of ``at``, like :func:`broker_jobs.envelope.new_job_id`."""
    milliseconds = int(at.timestamp() * 1000)
    value = milliseconds << 80 | rng.getrandbits(80)
    value = value & ~(0xF << 76 | 0x3 << 62) | (0x7 << 76 | 0x2 << 62)  # version 7, RFC 9562
    return str(uuid.UUID(int=value))


def ledger_rows(
    count: int, now: datetime, *, days: float, tasks: dict[str, int], seed: int = 7
) -> Iterator[Row]:
    """``count`` records ordered by creation over ``days`` before ``now``: finished
    jobs over the whole span, the queued, scheduled, running and retrying ones in its
    last hour; one execution per attempt (a retried job has two or three)."""
    rng = random.Random(seed)
    task_names, task_weights = list(tasks), list(tasks.values())
    statuses, status_weights = list(STATUSES), list(STATUSES.values())
    span = days * 86400.0
    recent = {Status.QUEUED, Status.SCHEDULED, Status.RUNNING, Status.RETRYING}
    for i in range(count):
        status = rng.choices(statuses, status_weights)[0]
        task = rng.choices(task_names, task_weights)[0]
        if status in recent:
            created = now - timedelta(seconds=rng.uniform(0, 3600))
        else:
            created = now - timedelta(seconds=span * (1 - (i + rng.random()) / count))
        yield _row(rng, job_id(created, rng), task, status, created)


class _Runs:
    """A record's executions, one after another (a back-off between attempts)."""

    def __init__(self, rng: random.Random, at: datetime, worker: str) -> None:
        self.rng, self.at, self.worker = rng, at, worker
        self.executions: list[tuple[Any, ...]] = []

    def run(self, attempt: int, outcome: str, error: str | None = None) -> datetime:
        started = self.at
        finished = started + timedelta(seconds=self.rng.lognormvariate(-2.5, 0.8))
        self.executions.append((attempt, self.worker, started, finished, outcome, error))
        self.at = finished + timedelta(seconds=2**attempt)
        return finished


def _row(rng: random.Random, jid: str, task: str, status: Status, created: datetime) -> Row:
    runs = _Runs(rng, created + timedelta(milliseconds=rng.uniform(1, 40)), rng.choice(WORKERS))
    worker: str | None = runs.worker
    error: str | None = None
    due: datetime | None = None
    lease: datetime | None = None
    if status in (Status.QUEUED, Status.SCHEDULED, Status.CANCELLED):
        attempts, worker, updated = 0, None, created
        if status is Status.SCHEDULED:
            due = created + timedelta(seconds=rng.uniform(60, 7200))
        if status is Status.CANCELLED:
            updated = created + timedelta(seconds=rng.uniform(1, 600))
    elif status is Status.SUCCEEDED:
        attempts = rng.choices((1, 2, 3), (85, 12, 3))[0]
        for attempt in range(1, attempts):
            runs.run(attempt, "retrying", rng.choice(ERRORS))
        updated = runs.run(attempts, "succeeded")
    elif status in (Status.FAILED, Status.DEAD):
        attempts, error = (1 if status is Status.FAILED else 3), rng.choice(ERRORS)
        for attempt in range(1, attempts):
            runs.run(attempt, "retrying", error)
        updated = runs.run(attempts, status.value, error)
    elif status is Status.RETRYING:
        attempts, error = rng.choice((1, 2)), rng.choice(ERRORS)
        for attempt in range(1, attempts + 1):
            updated = runs.run(attempt, "retrying", error)
        due = updated + timedelta(seconds=2**attempts)
    else:  # RUNNING: the record's insert trigger opens its execution
        attempts, updated = 1, runs.at
        lease = updated + timedelta(seconds=30)
    record = (jid, jid, task, status.value, attempts, created, updated, worker, lease, error, due)
    return Row(record, runs.executions)


def chunks(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# -- filling the stores -------------------------------------------------------------------


def sqlite_text(moment: datetime | None) -> str | None:
    """A time as :class:`SQLiteStore` writes it (fixed-width UTC ISO text)."""
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="microseconds")


def fill_sqlite(path: Path, rows: Iterator[Row]) -> int:
    """Write ``rows`` into the SQLite store at ``path`` (its schema made by opening it)."""
    SQLiteStore(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -262144")  # 256 MiB
    written = 0
    try:
        for chunk in chunks(rows, CHUNK):
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO broker_jobs_records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    tuple(sqlite_text(v) if isinstance(v, datetime) else v for v in row.record)
                    for row in chunk
                ],
            )
            conn.executemany(
                "INSERT INTO broker_jobs_executions (idempotency_key, number, job_id, attempt,"
                " worker, started_at, finished_at, outcome, error)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (row.record[0], number, row.record[1], attempt, worker,
                     sqlite_text(started), sqlite_text(finished), outcome, error)
                    for row in chunk
                    for number, (attempt, worker, started, finished, outcome, error)
                    in enumerate(row.executions, 1)
                ],
            )  # fmt: skip
            conn.execute("COMMIT")
            written += len(chunk)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return written


def fill_postgres(dsn: str, schema: str, rows: Iterator[Row]) -> int:
    """Write ``rows`` into the PostgreSQL store in ``schema`` (COPY, then ANALYZE)."""
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    from broker_jobs.store.postgres import PostgresStore  # noqa: PLC0415

    PostgresStore(dsn, schema=schema).close()
    records = sql.Identifier(schema, "broker_jobs_records")
    executions = sql.Identifier(schema, "broker_jobs_executions")
    written = 0
    with psycopg.connect(dsn, autocommit=False) as conn:
        for chunk in chunks(rows, CHUNK):
            with conn.cursor() as cur:
                with cur.copy(sql.SQL("COPY {} FROM STDIN").format(records)) as copy:
                    for row in chunk:
                        copy.write_row(row.record)
                with cur.copy(
                    sql.SQL(
                        "COPY {} (idempotency_key, job_id, attempt, worker, started_at,"
                        " finished_at, outcome, error) FROM STDIN"
                    ).format(executions)
                ) as copy:
                    for row in chunk:
                        for execution in row.executions:
                            copy.write_row((row.record[0], row.record[1], *execution))
            conn.commit()
            written += len(chunk)
        conn.autocommit = True
        conn.execute(sql.SQL("ANALYZE {}").format(records))
        conn.execute(sql.SQL("ANALYZE {}").format(executions))
    return written


# -- timing -------------------------------------------------------------------------------


@dataclass
class Timing:
    name: str
    samples: list[float]  # ms

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)

    @property
    def p95(self) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]

    def figures(self) -> dict[str, Any]:
        return {
            "p50_ms": round(self.p50, 2),
            "p95_ms": round(self.p95, 2),
            "max_ms": round(max(self.samples), 2),
            "n": len(self.samples),
        }


def timed(name: str, action: Callable[[], object], requests: int) -> Timing:
    """``action`` once to warm up, then ``requests`` times, each timed."""
    action()
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return Timing(name, samples)


def print_timings(title: str, timings: Sequence[Timing], aim: float | None = None) -> None:
    print(f"\n{title}")
    width = max(len(t.name) for t in timings)
    print(f"  {'':{width}}  {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for t in timings:
        mark = ""
        if aim is not None:
            mark = "  ok" if t.p50 < aim else f"  ABOVE {aim:g} ms"
        print(f"  {t.name:{width}}  {t.p50:8.2f} {t.p95:8.2f} {max(t.samples):8.2f}{mark}")


def deep_cursor(store: Store, depth: int) -> tuple[datetime, str] | None:
    """The cursor of the page ``depth`` records down /jobs' unfiltered order, found by
    following pages of 1000 (the way a reader gets there, without OFFSET)."""
    after: tuple[datetime, str] | None = None
    left = depth
    while left > 0:
        page = store.page(after=after, limit=min(1000, left))
        if page.after is None:
            return after
        after = page.after
        left -= len(page.records)
    return after


def store_timings(store: Store, requests: int, depth: int) -> list[Timing]:
    """The store's queries behind the dashboard's pages, each on its own."""
    some = store.find(status=Status.DEAD, limit=1) or store.find(limit=1)
    key = some[0].idempotency_key if some else "missing"
    deep = deep_cursor(store, depth)
    return [
        timed("counts()", store.counts, requests),
        timed("task_summaries()", store.task_summaries, requests),
        timed("find(limit=50)", lambda: store.page(limit=50), requests),
        timed(f"find(after=<{depth}th>)", lambda: store.page(after=deep, limit=50), requests),
        timed("find(status=failed)", lambda: store.page(status=Status.FAILED, limit=50), requests),
        timed("find(status=dead)", lambda: store.page(status=Status.DEAD, limit=50), requests),
        timed("find(task=email.send)", lambda: store.page(task="email.send", limit=50), requests),
        timed(
            "find(task, status=failed)",
            lambda: store.page(task="email.send", status=Status.FAILED, limit=50),
            requests,
        ),
        timed("find(key=prefix)", lambda: store.page(key=key[:13], limit=50), requests),
        timed("lookup(ref)", lambda: store.lookup(key), requests),
        timed("executions(key)", lambda: store.executions(key), requests),
    ]


# -- SQLite's plans -----------------------------------------------------------------------


def sqlite_plans(path: Path) -> dict[str, list[str]]:
    """``EXPLAIN QUERY PLAN`` of the SQLite store's queries behind the pages."""
    from broker_jobs.store import sqlite as s  # noqa: PLC0415

    now = datetime.now(UTC)
    after = (now - timedelta(days=1), "0")
    cases: dict[str, Filters] = {
        "find()": Filters(),
        "find(after)": Filters(after=after),
        "find(status)": Filters(status=Status.FAILED),
        "find(status, after)": Filters(status=Status.FAILED, after=after),
        "find(task)": Filters(task="email.send"),
        "find(task, status)": Filters(task="email.send", status=Status.FAILED),
        "find(key)": Filters(key="0190"),
        "find(since)": Filters(since=now - timedelta(hours=1)),
    }
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    plans = {}
    try:
        for name, filters in cases.items():
            where, params = filters.sql(s._DIALECT)
            query = (
                f"SELECT {s._COLUMNS} FROM broker_jobs_records {where} {s._NEWEST_FIRST}"
                " LIMIT :limit"
            )
            plans[name] = explain(conn, query, {**params, "limit": 51})
        window = {
            "now": sqlite_text(now),
            "minute": sqlite_text(now - timedelta(minutes=1)),
            "hour": sqlite_text(now - timedelta(hours=1)),
            "cap": 1000,
        }
        plans["task_summaries: counts"] = explain(conn, s._COUNTS, window)
        plans["task_summaries: finished"] = explain(conn, s._FINISHED_COUNTS, window)
        plans["task_summaries: durations"] = explain(conn, s._DURATIONS, window)
        plans["counts()"] = explain(
            conn, "SELECT status, count(*) FROM broker_jobs_records GROUP BY status", {}
        )
    finally:
        conn.close()
    return plans


def explain(conn: sqlite3.Connection, query: str, params: dict[str, Any]) -> list[str]:
    return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", params)]


def print_plans(plans: dict[str, list[str]]) -> None:
    print("\nSQLite query plans (EXPLAIN QUERY PLAN)")
    for name, steps in plans.items():
        scans = any(step.startswith("SCAN") for step in steps)
        print(f"  {name}{'  <- scans' if scans else ''}")
        for step in steps:
            print(f"      {step}")


# -- what the ledger's indexes cost a worker's claims ---------------------------------------

#: The indexes the dashboard's queries need, dropped in the "without" file of
#: :func:`claim_cost` (their names in the SQLite schema).
DASHBOARD_INDEXES = ("broker_jobs_records_updated", "broker_jobs_executions_finished")


def claim_cost(directory: Path, records: int, rounds: int, batch: int = 5) -> dict[str, Any]:
    """Median microseconds of a worker's claim of ``batch`` new jobs and of their
    success (``claim_many`` then ``succeed_many``, the SQLite worker's hot path), on
    two stores of ``records`` records: one with :data:`DASHBOARD_INDEXES`, one
    without; interleaved, one claim and success on each per round."""
    from broker_jobs import Job  # noqa: PLC0415

    now = datetime.now(UTC)
    stores = {}
    for variant in ("with", "without"):
        path = directory / f"claims-{variant}.db"
        fill_sqlite(path, ledger_rows(records, now, days=7, tasks=TASKS))
        if variant == "without":
            conn = sqlite3.connect(path, isolation_level=None)
            for name in DASHBOARD_INDEXES:
                conn.execute(f"DROP INDEX IF EXISTS {name}")
            present = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN (?, ?)",
                DASHBOARD_INDEXES,
            ).fetchone()[0]
            conn.close()
            assert present == 0
            # Open without recreating them: the store creates them on open.
            stores[variant] = _store_without_indexes(path)
        else:
            stores[variant] = SQLiteStore(path)
    samples: dict[str, dict[str, list[float]]] = {v: {"claim": [], "succeed": []} for v in stores}
    try:
        for round_ in range(rounds + 20):  # the first 20: warm-up
            order = list(stores) if round_ % 2 else list(reversed(stores))
            for variant in order:
                store = stores[variant]
                jobs = [Job(task="email.send") for _ in range(batch)]
                started = time.perf_counter()
                store.claim_many([(job, "bench-worker") for job in jobs], 30.0)
                claimed = time.perf_counter()
                store.succeed_many([(job.id, "bench-worker") for job in jobs])
                done = time.perf_counter()
                if round_ >= 20:
                    samples[variant]["claim"].append((claimed - started) * 1e6)
                    samples[variant]["succeed"].append((done - claimed) * 1e6)
    finally:
        for store in stores.values():
            store.close()
    figures: dict[str, Any] = {"records": records, "batch": batch, "rounds": rounds}
    for variant, by_step in samples.items():
        for step, values in by_step.items():
            figures[f"{step}_{variant}_us"] = round(statistics.median(values), 1)
    for step in ("claim", "succeed"):
        figures[f"{step}_ratio"] = round(
            figures[f"{step}_with_us"] / figures[f"{step}_without_us"], 3
        )
    return figures


def _store_without_indexes(path: Path) -> SQLiteStore:
    """An :class:`SQLiteStore` on ``path`` that does not create the dashboard's indexes
    (for :func:`claim_cost`'s comparison only)."""
    from broker_jobs.store import sqlite as s  # noqa: PLC0415

    saved = s._CREATE_LEDGER_INDEXES
    s._CREATE_LEDGER_INDEXES = ()  # type: ignore[assignment]
    try:
        return SQLiteStore(path)
    finally:
        s._CREATE_LEDGER_INDEXES = saved


# -- the dashboard over HTTP ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serving(app: Any, port: int | None = None) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    import uvicorn  # noqa: PLC0415

    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the dashboard's server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def dashboard_settings(store: Store, url: str, namespace: str, tasks: Sequence[str]) -> Any:
    from broker_jobs.dashboard.settings import DashboardSettings  # noqa: PLC0415
    from broker_jobs.urls import BrokerURLs  # noqa: PLC0415
    from topology.names import Names  # noqa: PLC0415

    return DashboardSettings(
        store=store, urls=BrokerURLs.parse(url), names=Names(namespace), tasks=tuple(tasks)
    )


def declare_topology(url: str, namespace: str, tasks: Sequence[str]) -> Callable[[], None]:
    """The namespace's queues and exchanges (so the overview reads real queues); returns
    what deletes them."""
    import pika  # noqa: PLC0415
    from pydantic import BaseModel  # noqa: PLC0415

    from broker_jobs import App  # noqa: PLC0415
    from topology import declare  # noqa: PLC0415

    class Payload(BaseModel):
        pass

    app = App(namespace=namespace)
    for task in tasks:
        app.declare(task, Payload)
    topology = app.topology()
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as conn:
        declare(conn, topology)

    def delete() -> None:
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as conn:
            channel = conn.channel()
            for queue in topology.queues:
                channel.queue_delete(queue.name)
            for exchange in topology.exchanges:
                channel.exchange_delete(exchange.name)

    return delete


def page_timings(base: str, store: Store, requests: int, depth: int) -> list[Timing]:
    """Each page and JSON endpoint, ``requests`` times over one keep-alive connection."""
    import httpx  # noqa: PLC0415

    from broker_jobs.ops.documents import encode_cursor  # noqa: PLC0415

    dead = store.find(status=Status.DEAD, limit=1) or store.find(limit=1)
    ref = dead[0].idempotency_key
    cursor = deep_cursor(store, depth)
    deep = f"after={encode_cursor(cursor)}" if cursor else ""
    task = "email.send"
    paths = {
        "/": "/",
        "/api/overview": "/api/overview",
        f"/tasks/{task}": f"/tasks/{task}",
        f"/api/tasks/{task}": f"/api/tasks/{task}",
        "/jobs": "/jobs",
        f"/jobs (page at record {depth})": f"/jobs?{deep}",
        "/jobs?state=failed": "/jobs?state=failed",
        f"/jobs?task={task}&state=dead": f"/jobs?task={task}&state=dead",
        "/api/jobs": "/api/jobs",
        f"/api/jobs (page at record {depth})": f"/api/jobs?{deep}",
        "/jobs/{ref} (dead)": f"/jobs/{ref}",
        "/api/jobs/{ref}": f"/api/jobs/{ref}",
        "/dead-letters": "/dead-letters",
        "/api/dead-letters": "/api/dead-letters",
        "/schedules": "/schedules",
        "/api/schedules": "/api/schedules",
    }
    timings = []
    with httpx.Client(base_url=base, timeout=60) as client:
        for name, path in paths.items():

            def get(path: str = path) -> None:
                answer = client.get(path)
                if answer.status_code != 200:
                    raise RuntimeError(f"GET {path}: {answer.status_code} {answer.text[:300]}")

            timings.append(timed(name, get, requests))
    return timings


# -- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    url: str | None
    store: str
    records: int
    demo_records: int
    requests: int
    depth: int
    days: float
    claims: int
    keep: Path | None


def parse_args(argv: Sequence[str] | None) -> Options:
    from bench.publish import add_url_argument  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="python -m bench.dashboard", description=__doc__.split("\n\n", 1)[0]
    )
    add_url_argument(parser)
    parser.add_argument(
        "--store",
        default="sqlite",
        help="sqlite (a temporary file), postgres (a throwaway node) or a postgresql:// DSN",
    )
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--demo-records", type=int, default=DEFAULT_DEMO_RECORDS)
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="per page")
    parser.add_argument(
        "--depth", type=int, default=20_000, help="records down /jobs for the deep page"
    )
    parser.add_argument("--days", type=float, default=7.0, help="the span of the ledger")
    parser.add_argument(
        "--claims",
        type=int,
        default=500,
        help="rounds of the claim-cost comparison (SQLite; 0: skip it)",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="a directory to keep the SQLite files in"
    )
    args = parser.parse_args(argv)
    return Options(
        url=args.url,
        store=args.store,
        records=args.records,
        demo_records=args.demo_records,
        requests=args.requests,
        depth=args.depth,
        days=args.days,
        claims=args.claims,
        keep=args.keep,
    )


@contextlib.contextmanager
def postgres(store: str) -> Iterator[str | None]:
    """The DSN of ``--store``: None for SQLite, a throwaway node for ``postgres``."""
    if store == "sqlite":
        yield None
        return
    if store != "postgres":
        yield store
        return
    with throwaway_postgres() as node:
        yield node.dsn


def one_case(
    options: Options,
    label: str,
    *,
    records: int,
    tasks: dict[str, int],
    url: str,
    dsn: str | None,
    work: Path,
) -> dict[str, Any]:
    """Fill a store with ``records``, time its queries and the pages over HTTP."""
    from broker_jobs.dashboard.app import create_app  # noqa: PLC0415
    from broker_jobs.store.postgres import PostgresStore  # noqa: PLC0415

    now = datetime.now(UTC)
    rows = ledger_rows(records, now, days=options.days, tasks=tasks)
    started = time.perf_counter()
    store: Store
    if dsn is None:
        path = work / f"{label}.db"
        for old in work.glob(f"{label}.db*"):
            old.unlink()
        written = fill_sqlite(path, rows)
        store = SQLiteStore(path)
    else:
        schema = f"bench_{label}_{uuid.uuid4().hex[:6]}"
        written = fill_postgres(dsn, schema, rows)
        store = PostgresStore(dsn, schema=schema)
    fill = time.perf_counter() - started
    print(f"\n== {label}: {written:,} records written in {fill:.1f} s", flush=True)
    figures: dict[str, Any] = {"records": written, "fill_s": round(fill, 1)}
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    delete = declare_topology(url, namespace, list(tasks))
    try:
        counts = store.counts()
        print("  " + ", ".join(f"{s.value} {n:,}" for s, n in counts.items()))
        depth = min(options.depth, max(1, written // 2))
        aim = DEMO_AIM_MS if records <= 10_000 else BIG_AIM_MS
        queries = store_timings(store, options.requests, depth)
        print_timings(f"{label}: the store's queries (ms)", queries)
        settings = dashboard_settings(store, url, namespace, list(tasks))
        with serving(create_app(settings)) as base:
            pages = page_timings(base, store, options.requests, depth)
        print_timings(f"{label}: the pages over HTTP (ms; aim: p50 < {aim:g} ms)", pages, aim)
        figures["aim_ms"] = aim
        figures["store"] = {t.name: t.figures() for t in queries}
        figures["pages"] = {t.name: t.figures() for t in pages}
        figures["slowest_page_p50_ms"] = round(max(t.p50 for t in pages), 2)
        figures["aim_met"] = all(t.p50 < aim for t in pages)
        if dsn is None:
            plans = sqlite_plans(work / f"{label}.db")
            print_plans(plans)
            figures["plans"] = plans
    finally:
        store.close()
        delete()
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    from bench.publish import broker  # noqa: PLC0415
    from broker_jobs import mask_url  # noqa: PLC0415

    options = parse_args(argv)
    print("Dashboard pages: p50/p95 of each page over HTTP (uvicorn in-process)")
    config = {
        "store": "sqlite" if options.store == "sqlite" else "postgresql",
        "records": options.records,
        "demo_records": options.demo_records,
        "requests": options.requests,
        "depth": options.depth,
        "days": options.days,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "starlette": version("starlette"),
        "uvicorn": version("uvicorn"),
        "cpus": os.cpu_count(),
    }
    results: dict[str, Any] = {"config": config}
    with contextlib.ExitStack() as stack:
        url, _node = stack.enter_context(broker(options.url))
        dsn = stack.enter_context(postgres(options.store))
        config["broker"] = mask_url(url)
        if options.keep:
            options.keep.mkdir(parents=True, exist_ok=True)
            work = options.keep
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-dash-")))
        for key, value in config.items():
            print(f"  {key}: {value}")
        results["demo"] = one_case(
            options,
            "demo",
            records=options.demo_records,
            tasks=DEMO_TASKS,
            url=url,
            dsn=dsn,
            work=work,
        )
        if options.records:
            results["big"] = one_case(
                options, "big", records=options.records, tasks=TASKS, url=url, dsn=dsn, work=work
            )
        if options.claims and dsn is None:
            cost = claim_cost(work, 50_000, options.claims)
            print(
                f"\nClaim path (SQLite, {cost['records']:,} records, claims of"
                f" {cost['batch']} new jobs, median of {cost['rounds']} each):"
                f" claim_many {cost['claim_with_us']} us with the dashboard's indexes,"
                f" {cost['claim_without_us']} us without (x{cost['claim_ratio']});"
                f" succeed_many {cost['succeed_with_us']} us vs"
                f" {cost['succeed_without_us']} us (x{cost['succeed_ratio']})"
            )
            results["claim_cost"] = cost
    met = all(results[case]["aim_met"] for case in ("demo", "big") if case in results)
    print(f"\nAims (p50 < {DEMO_AIM_MS:g} ms demo, < {BIG_AIM_MS:g} ms big): "
          + ("met" if met else "NOT met"))  # fmt: skip
    results["aims_met"] = met
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
