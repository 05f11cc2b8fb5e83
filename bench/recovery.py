"""Broker recovery: kill -9 the RabbitMQ node under load, time until jobs run again.

A throwaway RabbitMQ node (always: this bench kills it), two worker processes started
once with the ``broker-jobs worker`` command line and never restarted, and a publisher
thread sending a steady ``--rate`` of confirmed jobs, each with a unique key. The task's
handler is transactional: it inserts the job's key and the wall time it ran into an
``effects`` table through the store's own connection, so a job run twice shows as two
rows and a lost job as none.

Each round lets the load run steady for ``--steady`` seconds, kills the node
(``kill -9`` of beam), starts it again, and reports the time from the first moment the
AMQP port accepts a connection again ("broker up") to the first job that ran after it,
and to both workers logging that they consume again. At the end the publisher stops,
every confirmed job must run (lost: 0) and none twice (twice: 0), and the workers must
exit 0 on SIGTERM.

    python -m bench.recovery                   # 5 rounds at 200 jobs/s, ~1.5 min
    python -m bench.recovery --rounds 10 --steady 3
    python -m bench.recovery --store postgresql://postgres@127.0.0.1:5432/postgres

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import secrets
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import workers as bench_workers
from bench.publish import URL_ENV, Admin, describe_broker, percentile
from bench.workers import Record, WorkerProcess, stop_workers
from broker_jobs import App, Job, JobRequest, PublishBatchError, Publisher
from broker_jobs.store.urls import open_store
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.urls import mask_url

TASK = "bench.effect"
APP_MODULE = "recovery_app"
REPO = Path(__file__).resolve().parent.parent

DEFAULT_ROUNDS, DEFAULT_RATE, DEFAULT_STEADY = 5, 200.0, 5.0
DEFAULT_WORKERS, DEFAULT_CONCURRENCY = 2, 4

#: Aims (issue 12) for broker up -> first job run, in seconds.
AIM_P50, AIM_MAX = 1.0, 3.0
#: Seconds between two publishes of the load (rate x TICK jobs each).
TICK = 0.02
#: The publisher's confirm and connect timeouts (seconds): a publish meeting a dead
#: node fails at once (the kernel resets the socket); these only bound a stuck one.
CONFIRM_TIMEOUT, CONNECT_TIMEOUT = 5.0, 2.0
#: Seconds the workers have to start consuming and run a first job.
START_TIMEOUT = 60.0
#: Seconds after broker up for a round to see a job run and both workers consume.
RECOVERY_TIMEOUT = 30.0
#: Seconds at the end for every confirmed job to run.
DRAIN_TIMEOUT = 60.0
#: Seconds after the drain to catch a late duplicate.
AFTER_DRAIN = 2.0
#: Seconds the workers have to exit after SIGTERM.
STOP_TIMEOUT = 40.0
#: Seconds between two probes of the AMQP port while the node is down.
PROBE_EVERY = 0.005
#: Stray worker log records shown in full at most.
SHOW_STRAY = 8

#: Worker WARNINGs expected: a lost broker's, and the one at start about the task
#: having no time limit (the bench's handler is a single INSERT).
EXPECTED_WARNINGS = (
    "lost the broker at ",
    "no broker yet: ",
    "still no broker after ",
    f"task {TASK} has no time limit",
)
BACK_AFTER = re.compile(r"broker link back at .* after ([\d.]+) s without it")

APP_SOURCE = '''\
"""The app of one bench.recovery run (written by bench/recovery.py)."""

import os
import time

from pydantic import BaseModel

from broker_jobs import App


class Effect(BaseModel):
    key: str


app = App(namespace={namespace!r})


@app.task({task!r}, transactional=True)
def effect(payload: Effect, db) -> None:
    """Record the run in the store's transaction: it commits with the job's outcome."""
    db.execute({insert!r}, (payload.key, time.time(), os.getpid()))
'''


# -- options ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    rounds: int
    rate: float
    steady: float
    workers: int
    concurrency: int
    store: str | None  # a PostgreSQL DSN; None: an SQLite file in the run's temp dir


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recovery",
        description=__doc__.split("\n\n", 1)[0],
        epilog=(
            "The broker is always a throwaway RabbitMQ node started from the local"
            " rabbitmq-server and removed at the end: kill -9 needs a node this bench"
            " owns. Unlike the other benches (bench.failover kills beats, not the broker,"
            f" so it can use a given one), --url is refused and ${URL_ENV} is ignored."
        ),
    )
    parser.add_argument(
        "--url",
        help="not supported: this bench kills the node, so it always starts its own",
    )
    parser.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help="kill -9 rounds (%(default)s)"
    )
    parser.add_argument(
        "--rate", type=float, default=DEFAULT_RATE, help="jobs published per second (%(default)g)"
    )
    parser.add_argument(
        "--steady",
        type=float,
        default=DEFAULT_STEADY,
        help="seconds of steady load before each kill (%(default)g)",
    )
    parser.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, help="worker processes (%(default)s)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="each worker's --concurrency (%(default)s)",
    )
    parser.add_argument(
        "--store",
        help="a PostgreSQL DSN (postgresql://...) for the workers' store and the effects"
        " (in a fresh schema, dropped at the end); default: an SQLite file in a temp dir",
    )
    args = parser.parse_args(argv)
    if args.url:
        parser.error(
            "--url is not supported: the bench kill -9s the broker, so it starts a"
            " throwaway node of its own (leave --url out)"
        )
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 1 <= args.rate <= 5000:
        parser.error("--rate must be between 1 and 5000 jobs/s")
    if args.steady < 0.5:
        parser.error("--steady must be at least 0.5 s")
    if args.workers < 1 or args.concurrency < 1:
        parser.error("--workers and --concurrency must be at least 1")
    if args.store and not args.store.startswith(("postgresql://", "postgres://")):
        parser.error("--store takes a PostgreSQL DSN (postgresql://...)")
    return Options(
        rounds=args.rounds,
        rate=args.rate,
        steady=args.steady,
        workers=args.workers,
        concurrency=args.concurrency,
        store=args.store,
    )


# -- the effects table --------------------------------------------------------------------


class Effects:
    """The table the handler writes, in the store's database: SQLite or PostgreSQL."""

    def __init__(self, workdir: Path, dsn: str | None, *, prefix: str = "brec") -> None:
        """SQLite: the file ``workdir/store.db``; PostgreSQL: a fresh schema
        ``<prefix>_<hex>`` of ``dsn``."""
        self.dsn = dsn
        if dsn is None:
            self.path = workdir / "store.db"
            self.store_url = f"sqlite:///{self.path}"
            self.table = "effects"
            self.mark = "?"
        else:
            self.schema = f"{prefix}_{secrets.token_hex(4)}"
            separator = "&" if "?" in dsn else "?"
            self.store_url = f"{dsn}{separator}schema={self.schema}"
            self.table = f'"{self.schema}".effects'
            self.mark = "%s"

    @property
    def kind(self) -> str:
        return "sqlite" if self.dsn is None else "postgresql"

    def create(self) -> None:
        if self.dsn is not None:
            self._execute(f'CREATE SCHEMA "{self.schema}"')
        self._execute(
            f"CREATE TABLE {self.table}"
            " (key TEXT NOT NULL, ran_at DOUBLE PRECISION NOT NULL, pid INTEGER NOT NULL)"
        )

    def insert_sql(self) -> str:
        m = self.mark
        return f"INSERT INTO {self.table} (key, ran_at, pid) VALUES ({m}, {m}, {m})"

    def first_after(self, moment: float) -> float | None:
        """The earliest run later than ``moment`` (wall time), if any."""
        rows = self._execute(
            f"SELECT MIN(ran_at) FROM {self.table} WHERE ran_at > {self.mark}", (moment,)
        )
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    def count(self) -> int:
        return int(self._execute(f"SELECT COUNT(*) FROM {self.table}")[0][0])

    def runs(self) -> dict[str, list[float]]:
        """Every key's run times, earliest first."""
        found: dict[str, list[float]] = {}
        for key, ran_at in self._execute(f"SELECT key, ran_at FROM {self.table} ORDER BY ran_at"):
            found.setdefault(str(key), []).append(float(ran_at))
        return found

    def drop(self) -> None:
        if self.dsn is not None:
            with contextlib.suppress(Exception):
                self._execute(f'DROP SCHEMA "{self.schema}" CASCADE')

    def _execute(self, sql: str, parameters: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        if self.dsn is None:
            with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db:
                rows = db.execute(sql, parameters).fetchall()
                db.commit()
                return rows
        import psycopg  # noqa: PLC0415 - only with --store postgresql://

        with psycopg.connect(self.dsn, autocommit=True) as db:
            cursor = db.execute(sql.encode(), parameters or None)
            return list(cursor.fetchall()) if cursor.description else []


def write_app(workdir: Path, namespace: str, effects: Effects) -> App:
    """Write the app module the workers load (``recovery_app:app``) and load it here."""
    source = APP_SOURCE.format(namespace=namespace, task=TASK, insert=effects.insert_sql())
    return bench_workers.write_app(workdir, APP_MODULE, source)


# -- the load -----------------------------------------------------------------------------


class Load:
    """A thread publishing ``rate`` confirmed jobs per second, on schedule: each tick
    publishes the jobs due since the last one. A publish that fails (the broker is
    down) counts its jobs as not published; the next tick tries again with new jobs.

    Each job is ``task`` with a unique key, ``prefix`` and a number (``bench.faults``
    runs one load per task, with prefixes of their own), also its idempotency key with
    ``keyed`` (else the key is the job id); with ``limit`` the thread ends after that
    many jobs (published or not)."""

    def __init__(
        self,
        url: str,
        app: App,
        rate: float,
        *,
        task: str = TASK,
        prefix: str = "k",
        limit: int | None = None,
        keyed: bool = False,
        name: str = "bench.recovery publisher",
    ) -> None:
        self.url, self.app, self.rate = url, app, rate
        self.task, self.prefix, self.limit, self.keyed = task, prefix, limit, keyed
        self.name = name
        self.lock = threading.Lock()
        #: Confirmed keys and the wall time of their confirm.
        self.confirmed: dict[str, float] = {}
        #: Keys whose publish failed (not counted as published).
        self.failed: dict[str, float] = {}
        self.errors: Counter[str] = Counter()
        #: The first error message of each kind in :attr:`errors`.
        self.messages: dict[str, str] = {}
        self.attempted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=CONFIRM_TIMEOUT + CONNECT_TIMEOUT + 5)

    def confirmed_since(self, moment: float) -> float | None:
        with self.lock:
            return min((at for at in self.confirmed.values() if at > moment), default=None)

    def _run(self) -> None:
        publisher = Publisher(
            self.url,
            self.app,
            confirm_timeout=CONFIRM_TIMEOUT,
            connect_timeout=CONNECT_TIMEOUT,
            connection_name=self.name,
        )
        try:
            started = time.monotonic()
            next_tick = started
            while not self._stop.is_set():
                due = int((time.monotonic() - started) * self.rate) - self.attempted
                if self.limit is not None:
                    if self.attempted >= self.limit:
                        break
                    due = min(due, self.limit - self.attempted)
                if due > 0:
                    self._publish(publisher, due)
                next_tick += TICK
                pause = next_tick - time.monotonic()
                if pause > 0:
                    self._stop.wait(pause)
                else:
                    next_tick = time.monotonic()
        finally:
            with contextlib.suppress(Exception):
                publisher.close()

    def _publish(self, publisher: Publisher, count: int) -> None:
        keys = [f"{self.prefix}{self.attempted + index:07d}" for index in range(count)]
        self.attempted += count

        def confirmed(job: Job) -> None:
            with self.lock:
                self.confirmed[str(job.payload["key"])] = time.time()

        try:
            publisher.publish_many(
                [
                    JobRequest(self.task, {"key": key}, idempotency_key=key if self.keyed else None)
                    for key in keys
                ],
                on_confirmed=confirmed,
            )
        except Exception as error:  # whatever the broker's state: count it, go on
            kind = type(error).__name__
            if isinstance(error, PublishBatchError):
                kinds = {type(e).__name__ for e in error.failed.values()}
                kind = f"{kind} ({', '.join(sorted(kinds))})"
            now = time.time()
            with self.lock:
                self.errors[kind] += 1
                self.messages.setdefault(kind, str(error))
                for key in keys:
                    if key not in self.confirmed:
                        self.failed[key] = now


# -- the workers --------------------------------------------------------------------------


class Workers:
    """The worker processes, their stderr read (and parsed) by one thread each."""

    def __init__(self, url: str, store_url: str, options: Options, workdir: Path) -> None:
        args = ["--url", url, f"{APP_MODULE}:app", "--store", store_url]
        args += ["--concurrency", str(options.concurrency)]
        self.every = [
            WorkerProcess.spawn(f"w{index}", args, workdir)
            for index in range(1, options.workers + 1)
        ]

    def exited(self) -> list[WorkerProcess]:
        return [worker for worker in self.every if not worker.alive]

    def stop(self) -> dict[str, int | None]:
        """SIGTERM each worker; their exit codes (None: still running, then killed)."""
        return stop_workers(self.every, STOP_TIMEOUT)

    def levels(self) -> dict[str, dict[str, int]]:
        """Each worker's log records by level ("?": output that is not a log line)."""
        return {w.name: dict(Counter(r.level for r in list(w.records))) for w in self.every}

    def stray(self) -> list[tuple[str, Record]]:
        return [
            (w.name, r)
            for w in self.every
            for r in list(w.records)
            if not r.expected(EXPECTED_WARNINGS)
        ]


# -- rounds -------------------------------------------------------------------------------


@dataclass
class Round:
    """One kill -9: wall times (``time.time()``) and what was seen after it."""

    number: int
    killed_at: float
    dead_at: float  # kill() returned: beam gone, ports free
    up_at: float | None = None  # the AMQP port first accepted a connection
    start_returned_at: float | None = None
    first_run_at: float | None = None
    published_again_at: float | None = None  # the first confirm after broker up
    consuming_at: dict[str, float | None] = field(default_factory=dict)
    loss_noticed_at: dict[str, float | None] = field(default_factory=dict)
    outage_logged: dict[str, float | None] = field(default_factory=dict)
    not_published: int = 0
    carried_over: int = 0
    error: str | None = None

    def after_up(self, moment: float | None) -> float | None:
        if moment is None or self.up_at is None:
            return None
        return moment - self.up_at

    @property
    def downtime(self) -> float | None:
        return None if self.up_at is None else self.up_at - self.killed_at

    @property
    def first_run(self) -> float | None:
        return self.after_up(self.first_run_at)

    @property
    def all_consuming(self) -> float | None:
        times = list(self.consuming_at.values())
        if not times or any(t is None for t in times):
            return None
        return self.after_up(max(t for t in times if t is not None))


def probe_port(port: int, found: list[float], stop: threading.Event) -> None:
    """Append the first moment a TCP connection to ``port`` succeeds."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                found.append(time.time())
                return
        except OSError:
            time.sleep(PROBE_EVERY)


def kill_and_restart(node: RabbitNode, number: int) -> Round:
    killed_at = time.time()
    node.kill()
    dead_at = time.time()
    accepted: list[float] = []
    stop = threading.Event()
    probe = threading.Thread(target=probe_port, args=(node.amqp_port, accepted, stop))
    probe.start()
    try:
        node.start()
    finally:
        start_returned_at = time.time()
        stop.set()
        probe.join()
    record = Round(number, killed_at, dead_at, start_returned_at=start_returned_at)
    record.up_at = accepted[0] if accepted else start_returned_at
    return record


def wait_recovered(record: Round, workers: Workers, effects: Effects, load: Load) -> None:
    """Wait for a job to run after broker up and for every worker to consume again."""
    assert record.up_at is not None
    deadline = time.monotonic() + RECOVERY_TIMEOUT
    while True:
        if record.first_run_at is None:
            record.first_run_at = effects.first_after(record.up_at)
        for worker in workers.every:
            consuming = worker.first(" consuming ", record.killed_at)
            record.consuming_at[worker.name] = consuming.at if consuming else None
        done = record.first_run_at is not None and all(record.consuming_at.values())
        if exited := workers.exited():
            record.error = "worker(s) exited: " + ", ".join(
                f"{w.name} ({w.process.returncode})" for w in exited
            )
            return
        if done:
            break
        if time.monotonic() > deadline:
            missing = [] if record.first_run_at else ["no job ran"]
            missing += [f"{n} not consuming" for n, at in record.consuming_at.items() if not at]
            record.error = f"within {RECOVERY_TIMEOUT:g} s of broker up: {', '.join(missing)}"
            return
        time.sleep(0.02)
    record.published_again_at = load.confirmed_since(record.up_at)
    for worker in workers.every:
        lost = worker.first("lost the broker", record.killed_at)
        record.loss_noticed_at[worker.name] = lost.at if lost else None
        back = worker.first("broker link back", record.killed_at)
        outage = BACK_AFTER.search(back.message) if back else None
        record.outage_logged[worker.name] = float(outage.group(1)) if outage else None


def steady(seconds: float, workers: Workers) -> str | None:
    """Let the load run; a worker exit ends it early (the error)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if exited := workers.exited():
            return "worker(s) exited: " + ", ".join(
                f"{w.name} ({w.process.returncode})" for w in exited
            )
        time.sleep(0.05)
    return None


def warm_up(workers: Workers, effects: Effects) -> None:
    """Wait until every worker consumes and a first job ran."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if exited := workers.exited():
            raise SystemExit(
                "worker(s) exited at start: "
                + ", ".join(f"{w.name} ({w.process.returncode})" for w in exited)
                + "\n"
                + "\n".join(r.message for w in exited for r in w.records[-5:])
            )
        consuming = all(w.first(" consuming ", 0.0) for w in workers.every)
        if consuming and effects.count() > 0:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the workers did not consume and run a job in {START_TIMEOUT:g} s")
        time.sleep(0.05)


# -- the end: every confirmed job ran, none twice -----------------------------------------


@dataclass
class Tally:
    attempted: int
    published: int  # confirmed
    not_published: int
    ran_not_published: int  # keys whose publish failed (outcome unknown) that ran anyway
    ran: int  # distinct keys run
    runs: int  # effect rows
    lost: list[str]
    twice: list[str]
    unknown: list[str]  # keys run that were never published at all
    drain_s: float
    queue_left: int | None
    dead_letters: int | None


def drain(load: Load, effects: Effects) -> float:
    """Wait until every confirmed key ran (bounded); the seconds it took."""
    started = time.monotonic()
    with load.lock:
        wanted = set(load.confirmed)
    while time.monotonic() - started < DRAIN_TIMEOUT:
        if effects.count() >= len(wanted) and wanted <= set(effects.runs()):
            break
        time.sleep(0.25)
    return time.monotonic() - started


def tally(
    load: Load, effects: Effects, rounds: Sequence[Round], drain_s: float, admin: Admin | None
) -> Tally:
    runs = effects.runs()
    with load.lock:
        confirmed = dict(load.confirmed)
        failed = {key: at for key, at in load.failed.items() if key not in confirmed}
    for record in rounds:
        record.not_published = sum(
            record.killed_at <= at < (record.published_again_at or record.killed_at + 60)
            for at in failed.values()
        )
        if record.up_at is not None:
            record.carried_over = sum(
                confirmed_at < record.killed_at and runs.get(key, [0.0])[0] > record.up_at
                for key, confirmed_at in confirmed.items()
            )
    queue_left = dead = None
    if admin is not None:
        names = load.app.names
        with contextlib.suppress(Exception):
            queue_left = admin.depth(names.task_queue(TASK))
            dead = admin.depth(names.dead_letter_queue(TASK))
    return Tally(
        attempted=load.attempted,
        published=len(confirmed),
        not_published=len(failed),
        ran_not_published=sum(key in runs for key in failed),
        ran=len(runs),
        runs=sum(len(times) for times in runs.values()),
        lost=sorted(key for key in confirmed if key not in runs),
        twice=sorted(key for key, times in runs.items() if len(times) > 1),
        unknown=sorted(key for key in runs if key not in confirmed and key not in failed),
        drain_s=drain_s,
        queue_left=queue_left,
        dead_letters=dead,
    )


# -- reporting ----------------------------------------------------------------------------


def seconds(value: float | None, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def stats(values: Sequence[float]) -> dict[str, float | None]:
    def rounded(value: float) -> float | None:
        return None if math.isnan(value) else round(value, 3)

    return {
        "count": len(values),
        "p50_s": rounded(percentile(values, 50)),
        "max_s": rounded(max(values, default=math.nan)),
        "min_s": rounded(min(values, default=math.nan)),
    }


def print_config(config: dict[str, Any]) -> None:
    print("Broker recovery benchmark (broker_jobs)")
    for key, value in config.items():
        print(f"  {key:<16} {value}")
    print()


def print_header(names: Sequence[str]) -> None:
    consuming = "/".join(names)
    print("Rounds (seconds after broker up, the AMQP port accepting again, unless said):")
    print("  downtime   kill -9 -> broker up")
    print("  start()    RabbitNode.start() returned (await_startup, then its port check)")
    print("  first run  the first job run after broker up (the handler's time.time())")
    print(f"  consuming  each worker's 'consuming' log line after its reconnect ({consuming})")
    print("  publish    the publisher's first confirm after broker up")
    print(f"  noticed    seconds from the kill to each worker's 'lost the broker' ({consuming})")
    print()
    print(
        f"{'round':>7} {'downtime':>8} {'start()':>7} {'first run':>9}"
        f" {'consuming':>13} {'publish':>7} {'noticed':>11}"
    )


def print_round(record: Round, total: int) -> None:
    label = f"{record.number}/{total}"
    consuming = "/".join(seconds(record.after_up(at), True) for at in record.consuming_at.values())
    noticed = "/".join(
        seconds(None if at is None else at - record.killed_at)
        for at in record.loss_noticed_at.values()
    )
    line = (
        f"{label:>7} {seconds(record.downtime):>8}"
        f" {seconds(record.after_up(record.start_returned_at), True):>7}"
        f" {seconds(record.first_run, True):>9} {consuming:>13}"
        f" {seconds(record.after_up(record.published_again_at), True):>7} {noticed:>11}"
    )
    if record.error:
        line += f"  FAILED: {record.error}"
    print(line, flush=True)


def print_round_counts(rounds: Sequence[Round], total: int) -> None:
    print("Jobs around each kill (counted at the end):")
    for record in rounds:
        outage = ", ".join(
            f"{name} {'-' if value is None else f'{value:g} s'}"
            for name, value in record.outage_logged.items()
        )
        print(
            f"  round {record.number}/{total}: not published {record.not_published},"
            f" carried over {record.carried_over}; outage the workers logged: {outage}"
        )


def summary(rounds: Sequence[Round], counts: Tally) -> dict[str, Any]:
    done = [r for r in rounds if r.first_run is not None]
    return {
        "first_run": stats([r.first_run for r in done if r.first_run is not None]),
        "all_consuming": stats([r.all_consuming for r in rounds if r.all_consuming is not None]),
        "downtime": stats([r.downtime for r in rounds if r.downtime is not None]),
        "published_again": stats(
            [t for r in rounds if (t := r.after_up(r.published_again_at)) is not None]
        ),
        "rounds": len(rounds),
        "failed_rounds": sum(r.error is not None for r in rounds),
        "lost": len(counts.lost),
        "twice": len(counts.twice),
    }


def aims(figures: dict[str, Any], counts: Tally, rounds_wanted: int) -> dict[str, bool]:
    first = figures["first_run"]
    complete = figures["rounds"] == rounds_wanted and not figures["failed_rounds"]
    p50, worst = first["p50_s"], first["max_s"]
    return {
        f"broker up -> first job run p50 <= {AIM_P50:g} s": complete
        and p50 is not None
        and p50 <= AIM_P50,
        f"broker up -> first job run max <= {AIM_MAX:g} s": complete
        and worst is not None
        and worst <= AIM_MAX,
        "lost = 0": not counts.lost,
        "run twice = 0": not counts.twice,
    }


def print_summary(
    figures: dict[str, Any],
    counts: Tally,
    *,
    met: dict[str, bool],
    codes: dict[str, int | None],
    exited_early: Sequence[str],
    stray: Sequence[tuple[str, Record]],
    outcomes: dict[str, str],
    levels: dict[str, dict[str, int]],
) -> None:
    def line(label: str, group: dict[str, Any]) -> None:
        print(
            f"  {label:<40} p50 {seconds(group['p50_s']):>6} s  max {seconds(group['max_s']):>6}"
            f" s  min {seconds(group['min_s']):>6} s  ({group['count']} rounds)"
        )

    print()
    print("Summary:")
    line("broker up -> first job run", figures["first_run"])
    line("broker up -> every worker consuming", figures["all_consuming"])
    line("broker up -> first publish confirmed", figures["published_again"])
    line("downtime (kill -9 -> broker up)", figures["downtime"])
    print(
        f"  jobs: {counts.attempted} attempted, {counts.published} published (confirmed),"
        f" {counts.not_published} not published ({counts.ran_not_published} of them ran"
        f" anyway: the kill came between send and confirm); {counts.ran} ran"
        f" ({counts.runs} runs), all of them {counts.drain_s:.1f} s after the publisher stopped"
    )
    print(f"  lost (published, never ran): {len(counts.lost)}  (must be 0)")
    print(f"  run twice: {len(counts.twice)}  (must be 0)")
    if counts.unknown:
        print(f"  runs of keys never published: {len(counts.unknown)}  (must be 0)")
    print(
        f"  left in the task queue: {_maybe(counts.queue_left)},"
        f" dead letters: {_maybe(counts.dead_letters)}"
    )
    for label, keys in (("LOST", counts.lost), ("TWICE", counts.twice)):
        if keys:
            print(f"  {label}: {', '.join(keys[:10])}{' ...' if len(keys) > 10 else ''}")
    exits = ", ".join(f"{name} {_maybe(code)}" for name, code in codes.items())
    print(f"  workers exited during the run: {', '.join(exited_early) or 'none'}")
    print(f"  workers' exit codes on SIGTERM: {exits}  (must be 0)")
    for name, text in outcomes.items():
        print(f"  {name} reported: {text or '-'}")
    print("    (duplicate: a redelivery the store found done already, acked without a run)")
    for name, counted in levels.items():
        by_level = ", ".join(f"{count} {level}" for level, count in sorted(counted.items()))
        print(f"  {name} log records: {by_level or 'none'}")
    print(f"  stray worker log records (not INFO, not an expected WARNING): {len(stray)}")
    for name, record in stray[:SHOW_STRAY]:
        text = "\n      ".join([record.message, *record.more[-6:]])
        print(f"    {name} {record.level}: {text}")
    print()
    print("Aims:")
    for label, ok in met.items():
        print(f"  {label:<44} {'met' if ok else 'NOT met'}")


def _maybe(value: object) -> str:
    return "-" if value is None else str(value)


def problems(
    rounds: Sequence[Round],
    counts: Tally,
    codes: dict[str, int | None],
    exited_early: Sequence[str],
    wanted: int,
) -> list[str]:
    found = [f"round {r.number}: {r.error}" for r in rounds if r.error]
    if len(rounds) < wanted:
        found.append(f"only {len(rounds)} of {wanted} rounds ran")
    if counts.lost:
        found.append(f"{len(counts.lost)} published jobs never ran")
    if counts.twice:
        found.append(f"{len(counts.twice)} jobs ran twice")
    if counts.unknown:
        found.append(f"{len(counts.unknown)} runs of keys never published")
    found += [f"{name} exited during the run" for name in exited_early]
    found += [f"{name} exit code {code} on SIGTERM" for name, code in codes.items() if code != 0]
    return found


# -- main ---------------------------------------------------------------------------------


@contextlib.contextmanager
def throwaway_node(workdir: Path) -> Iterator[RabbitNode]:
    if not RabbitNode.available():
        raise SystemExit("no local rabbitmq-server: this bench needs a node it can kill")
    if os.environ.get(URL_ENV):
        print(f"${URL_ENV} is ignored: this bench kills the broker, so it starts its own")
    node = RabbitNode.create(workdir / "node")
    print(f"Starting a throwaway RabbitMQ node ({node.nodename}); it is removed at the end")
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


def describe_config(
    options: Options, node: RabbitNode, admin: Admin, namespace: str, effects: Effects
) -> dict[str, Any]:
    return {
        **describe_broker(node.url, node, admin),
        "broker_origin": "throwaway node (kill -9 and restarted by the bench)",
        "namespace": namespace,
        "rounds": options.rounds,
        "rate": options.rate,
        "steady_s": options.steady,
        "workers": f"{options.workers} x broker-jobs worker --concurrency {options.concurrency}",
        "store": (
            "sqlite (a file in the run's temp dir)"
            if effects.dsn is None
            else f"{mask_url(effects.dsn)} (schema {effects.schema})"
        ),
        "handler": "transactional: INSERT key, time.time(), pid INTO effects (store's connection)",
        "measure": "AMQP port accepting again -> first job run (effects.ran_at)",
    }


def run_rounds(
    options: Options,
    node: RabbitNode,
    workers: Workers,
    *,
    effects: Effects,
    load: Load,
    rounds: list[Round],
) -> None:
    """Run the rounds, appending each to ``rounds``; a failed round ends the run."""
    print_header([w.name for w in workers.every])
    for number in range(1, options.rounds + 1):
        if error := steady(options.steady, workers):
            print(f"  stopped before round {number}: {error}")
            break
        record = kill_and_restart(node, number)
        wait_recovered(record, workers, effects, load)
        print_round(record, options.rounds)
        rounds.append(record)
        if record.error:
            break


def bench(options: Options) -> tuple[dict[str, Any], bool]:
    namespace = f"brec{secrets.token_hex(4)}"
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # the publisher's failed connects
    logging.getLogger("broker_jobs").setLevel(logging.CRITICAL)  # ... and its reconnects
    with (
        tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp,
        throwaway_node(Path(tmp)) as node,
    ):
        workdir = Path(tmp)
        effects = Effects(workdir, options.store)
        try:
            effects.create()
            open_store(effects.store_url).close()  # the schema, before the workers race for it
            app = write_app(workdir, namespace, effects)
            admin = Admin(node.url)
            try:
                config = describe_config(options, node, admin, namespace, effects)
            finally:
                admin.close()
            print_config(config)
            result, ok = _measure(options, node, workdir, effects=effects, app=app, config=config)
        finally:
            effects.drop()
    return result, ok


def _measure(
    options: Options,
    node: RabbitNode,
    workdir: Path,
    *,
    effects: Effects,
    app: App,
    config: dict[str, Any],
) -> tuple[dict[str, Any], bool]:
    load = Load(node.url, app, options.rate)
    workers = Workers(node.url, effects.store_url, options, workdir)
    rounds: list[Round] = []
    try:
        load.start()
        warm_up(workers, effects)
        run_rounds(options, node, workers, effects=effects, load=load, rounds=rounds)
        time.sleep(1.0)  # a last second of steady load after the last recovery
    except BaseException:
        load.stop()
        workers.stop()
        raise
    load.stop()
    exited_early = [w.name for w in workers.exited()]
    drain_s = drain(load, effects)
    time.sleep(AFTER_DRAIN)  # a late duplicate would show now
    admin: Admin | None = None
    with contextlib.suppress(Exception):
        admin = Admin(node.url)
    try:
        counts = tally(load, effects, rounds, drain_s, admin)
    finally:
        if admin is not None:
            admin.close()
    codes = workers.stop()
    outcomes = {w.name: w.stdout_path.read_text(errors="replace").strip() for w in workers.every}
    stray, levels = workers.stray(), workers.levels()
    print()
    print_round_counts(rounds, options.rounds)
    figures = summary(rounds, counts)
    met = aims(figures, counts, options.rounds)
    found = problems(rounds, counts, codes, exited_early, options.rounds)
    print_summary(
        figures,
        counts,
        met=met,
        codes=codes,
        exited_early=exited_early,
        stray=stray,
        outcomes=outcomes,
        levels=levels,
    )
    for problem in found:
        print(f"FAILED: {problem}")
    jobs = asdict(counts)
    for key in ("lost", "twice", "unknown"):
        jobs[key] = jobs[key][:100]  # the first keys; the counts are in the summary
    result = {
        "config": config,
        "summary": figures,
        "rounds": [_round_json(r) for r in rounds],
        "jobs": jobs,
        "publish_errors": dict(load.errors),
        "workers": {
            "exited_during_run": exited_early,
            "exit_codes": codes,
            "reported": outcomes,
            "log_records": levels,
            "stray_log_records": [
                {"worker": name, "level": r.level, "message": r.message, "more": r.more[-6:]}
                for name, r in stray[:50]
            ],
        },
        "aims_met": met,
        "problems": found,
    }
    return result, not found


def _round_json(record: Round) -> dict[str, Any]:
    def rel(moment: float | None) -> float | None:
        value = record.after_up(moment)
        return None if value is None else round(value, 3)

    return {
        "round": record.number,
        "downtime_s": None if record.downtime is None else round(record.downtime, 3),
        "kill_s": round(record.dead_at - record.killed_at, 3),
        "start_returned_s": rel(record.start_returned_at),
        "first_run_s": rel(record.first_run_at),
        "consuming_s": {name: rel(at) for name, at in record.consuming_at.items()},
        "all_consuming_s": None if record.all_consuming is None else round(record.all_consuming, 3),
        "published_again_s": rel(record.published_again_at),
        "loss_noticed_s": {
            name: None if at is None else round(at - record.killed_at, 3)
            for name, at in record.loss_noticed_at.items()
        },
        "outage_logged_s": record.outage_logged,
        "not_published": record.not_published,
        "carried_over": record.carried_over,
        "error": record.error,
    }


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    result, ok = bench(options)
    print(json.dumps(result, sort_keys=False))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
