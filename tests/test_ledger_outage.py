"""A ledger outage never costs a job (docs/worker.md, *Ledger outages*).

A PostgreSQL server of the test's own is stopped in the middle of a drain: handlers
that finished cannot record their success, new deliveries cannot be claimed. The
worker holds them (unacked, no nack loop), says so once, answers /readyz 503, and goes
on when the server is back: every job succeeds, none is dead-lettered, none runs twice,
even on a queue whose delivery limit is 1 (a single return would dead-letter a job).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pika
import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg.conninfo import make_conninfo
from pydantic import BaseModel

from broker_jobs import App, JobContext, JobRequest, Publisher, QueueOptions, RetryPolicy
from broker_jobs.envelope import Job
from broker_jobs.observe import heartbeat as heartbeat_module
from broker_jobs.observe.heartbeat import Heartbeat, Pulse, process_record
from broker_jobs.observe.worker_metrics import WorkerMetrics
from broker_jobs.store import postgres_logs
from broker_jobs.store import sqlite as sqlite_store
from broker_jobs.store.base import Output, Status, Store
from broker_jobs.store.controls import TaskPause
from broker_jobs.store.errors import StoreError, StoreUnavailableError
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.postgres import PostgresStore
from broker_jobs.store.processes import ProcessKind, ProcessRecord
from broker_jobs.store.records import ClaimOutcome
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.testing.postgres_node import PostgresNode
from broker_jobs.worker import Worker, WorkerSettings, ledger_gate
from broker_jobs.worker import controls as controls_module
from broker_jobs.worker.controls import ControlWatch
from broker_jobs.worker.observer import JobObserver
from broker_jobs.worker.protocol import Runner
from tests.support import Broker, run_burst_worker, unavailable, wait_until

JOBS, BEFORE_OUTAGE = 120, 30


class Key(BaseModel):
    key: str


@pytest.fixture(scope="module")
def own_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresNode]:
    """A server of this module's own: the tests stop and start it."""
    if not PostgresNode.available():
        unavailable("no PostgreSQL: apt-get install postgresql")
    node = PostgresNode.create(tmp_path_factory.mktemp("outage-postgres"))
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


class Outage:
    """Jobs after the first BEFORE_OUTAGE wait in their handler until the server is
    down, so the outage lands mid-drain however fast the machine."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.runs: Counter[str] = Counter()
        self._lock = threading.Lock()

    def run(self, key: str) -> None:
        with self._lock:
            self.runs[key] += 1
            started = sum(self.runs.values())
        if started > BEFORE_OUTAGE:
            assert self.down.wait(60), "the test never stopped the server"


def publish(broker: Broker, app: App, task: str) -> list[str]:
    with Publisher(broker.url, app) as publisher:
        jobs = publisher.publish_many([JobRequest(task, {"key": f"k{n}"}) for n in range(JOBS)])
    return [job.idempotency_key for job in jobs]


def drain_through_an_outage(
    broker: Broker,
    app: App,
    store: Store,
    outage: Outage,
    begin: Callable[[], None],
    end: Callable[[], None],
) -> tuple[Counter[str], list[str]]:
    """Run a burst worker in a thread; ``begin()`` the outage once jobs wait for it,
    ``end()`` it once the worker says it holds its jobs for the ledger. The outcomes,
    and the reasons /readyz gave."""
    worker = Worker(broker.url, app, store, WorkerSettings(burst=True, concurrency=4))
    outcomes: list[Counter[str]] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcomes.append(asyncio.run(worker.run()))
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=run, name="worker under test")
    thread.start()
    reasons = []
    try:
        wait_until(lambda: sum(outage.runs.values()) > BEFORE_OUTAGE, within=60, what="jobs run")
        begin()
        outage.down.set()
        reasons.append(
            wait_until(
                lambda: held_for_the_ledger(worker),
                within=60,
                what="the worker to say it holds its jobs for the ledger",
            )
        )
    finally:
        outage.down.set()
        end()
        thread.join(120)
    assert not thread.is_alive(), "the worker did not drain after the server came back"
    if failure:
        raise failure[0]
    return outcomes[0], reasons


def restart(node: PostgresNode) -> None:
    if not node.running:
        node.start()


def held_for_the_ledger(worker: Worker) -> str | None:
    """/readyz's reason while the worker holds its jobs for the ledger, else None."""
    ready, reason = worker.readiness()
    return reason if not ready and "ledger" in reason else None


def dead_letter_count(connection: pika.BlockingConnection, app: App, task: str) -> int:
    declared = connection.channel().queue_declare(app.names.dead_letter_queue(task), passive=True)
    return declared.method.message_count


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
def test_a_postgres_outage_mid_drain_holds_the_jobs_and_loses_none(
    broker: Broker,
    make_app: Callable[[], App],
    own_postgres: PostgresNode,
    connection: pika.BlockingConnection,
    caplog: pytest.LogCaptureFixture,
    transactional: bool,
) -> None:
    app = make_app()
    outage = Outage()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    table = f'"{schema}".effects'
    one_return_kills = QueueOptions(delivery_limit=1)

    if transactional:

        @app.task("outage.effect", transactional=True, queue=one_return_kills)
        def effect_in_transaction(payload: Key, db: Any) -> None:
            outage.run(payload.key)
            db.execute(f"INSERT INTO {table} (key) VALUES (%s)", (payload.key,))

    else:

        @app.task("outage.effect", queue=one_return_kills)
        def effect(payload: Key) -> None:
            outage.run(payload.key)

    store = PostgresStore(own_postgres.dsn, schema=schema)
    try:
        if transactional:
            with psycopg.connect(own_postgres.dsn, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                conn.execute(f"CREATE TABLE {table} (key text NOT NULL)")
        keys = publish(broker, app, "outage.effect")
        with caplog.at_level(logging.INFO, logger="broker_jobs.worker.ledger_gate"):
            outcomes, reasons = drain_through_an_outage(
                broker, app, store, outage, own_postgres.stop, lambda: restart(own_postgres)
            )

        assert outcomes["succeeded"] == JOBS, outcomes
        assert outcomes["returned"] == 0
        assert outcomes["dead:crash-loop"] == 0
        assert dead_letter_count(connection, app, "outage.effect") == 0
        assert all(store.get(key).status is Status.SUCCEEDED for key in keys)  # type: ignore[union-attr]
        assert "the ledger" in reasons[0]
        assert "jobs are held" in reasons[0]
        gate_lines = [
            (r.levelno, r.getMessage()) for r in caplog.records if r.name.endswith("ledger_gate")
        ]
        warnings = [text for level, text in gate_lines if level == logging.WARNING]
        infos = [text for level, text in gate_lines if level == logging.INFO]
        assert len(warnings) == 1
        assert "Holding the deliveries" in warnings[0]
        assert len(infos) == 1
        assert "answers again after" in infos[0]
        if transactional:
            with psycopg.connect(own_postgres.dsn, autocommit=True) as conn:
                rows = conn.execute(f"SELECT key, count(*) FROM {table} GROUP BY key").fetchall()
            assert sorted(rows) == sorted((f"k{n}", 1) for n in range(JOBS))
        else:  # held, not handed back: nothing ran twice
            assert outage.runs == Counter({f"k{n}": 1 for n in range(JOBS)})
    finally:
        store.close()


def test_a_postgres_ledger_that_hangs_is_said_and_held_like_one_that_fails(
    broker: Broker,
    make_app: Callable[[], App],
    own_postgres: PostgresNode,
    connection: pika.BlockingConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table lock (a migration, VACUUM FULL) or a frozen server raises nothing: the
    worker's calls just wait. Unanswered for STALL_AFTER seconds, that is an outage
    too: said, /readyz 503; the jobs go on once the lock is gone."""
    monkeypatch.setattr(ledger_gate, "STALL_AFTER", 1.0)
    monkeypatch.setattr(ledger_gate, "STALL_CHECK_EVERY", 0.2)
    app = make_app()
    outage = Outage()

    @app.task("outage.hung", queue=QueueOptions(delivery_limit=1))
    def effect(payload: Key) -> None:
        outage.run(payload.key)

    schema = f"t_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(own_postgres.dsn, schema=schema)
    locker = psycopg.connect(own_postgres.dsn)  # a transaction held open: the lock stays
    try:
        keys = publish(broker, app, "outage.hung")
        outcomes, reasons = drain_through_an_outage(
            broker,
            app,
            store,
            outage,
            lambda: locker.execute(
                f'LOCK TABLE "{schema}".broker_jobs_records IN ACCESS EXCLUSIVE MODE'
            ),
            locker.rollback,
        )
        assert outcomes["succeeded"] == JOBS, outcomes
        assert dead_letter_count(connection, app, "outage.hung") == 0
        assert all(store.get(key).status is Status.SUCCEEDED for key in keys)  # type: ignore[union-attr]
        assert "no answer for" in reasons[0]
        assert outage.runs == Counter({f"k{n}": 1 for n in range(JOBS)})
    finally:
        locker.close()
        store.close()


def test_an_sqlite_ledger_locked_by_another_process_holds_the_jobs_and_loses_none(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    tmp_path: Path,
) -> None:
    """Another connection holds the file's write lock (a shell, a backup): every
    write of the worker gives up after its busy timeout, and is tried again."""
    app = make_app()
    outage = Outage()

    @app.task("outage.locked", queue=QueueOptions(delivery_limit=1))
    def effect(payload: Key) -> None:
        outage.run(payload.key)

    path = tmp_path / "jobs.db"
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    with SQLiteStore(path, busy_timeout=0.2) as store:
        keys = publish(broker, app, "outage.locked")
        outcomes, reasons = drain_through_an_outage(
            broker,
            app,
            store,
            outage,
            lambda: locker.execute("BEGIN EXCLUSIVE"),
            lambda: locker.in_transaction and locker.execute("ROLLBACK"),
        )
        assert outcomes["succeeded"] == JOBS, outcomes
        assert outcomes["returned"] == 0
        assert dead_letter_count(connection, app, "outage.locked") == 0
        assert all(store.get(key).status is Status.SUCCEEDED for key in keys)  # type: ignore[union-attr]
        assert "locked by another process" in reasons[0]
        assert outage.runs == Counter({f"k{n}": 1 for n in range(JOBS)})
    locker.close()


class ReadOnlyFile:
    """Opens the store's file as SQLite opens one it cannot write (a read-only mount,
    another owner's file): read-only, without a word (``mode=ro`` is the same open
    as SQLite's fallback), until :meth:`make_writable`. chmod would not do: the
    tests run as root in CI, who may write any file."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._open = sqlite_store._open
        self.writable = False
        monkeypatch.setattr(sqlite_store, "_open", self.open)

    def open(self, path: Path, timeout: float) -> sqlite3.Connection:
        if self.writable:
            return self._open(path, timeout)
        return sqlite3.connect(
            f"{Path(path).resolve().as_uri()}?mode=ro",
            uri=True,
            timeout=timeout,
            isolation_level=None,
            check_same_thread=False,
        )

    def make_writable(self) -> None:
        self.writable = True


def a_ledger(path: Path) -> Path:
    """An SQLite ledger with its tables (a read-only file is one made before)."""
    SQLiteStore(path).close()
    return path


def test_an_sqlite_store_opened_read_only_writes_once_the_file_is_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite opens a file it cannot write read-only, and such a connection stays
    read-only after the file is writable again: the store opens it again."""
    path = a_ledger(tmp_path / "jobs.db")
    read_only = ReadOnlyFile(monkeypatch)
    first, second = Job(task="ro.task"), Job(task="ro.task")
    with SQLiteStore(path) as store:  # opening only reads: it passes
        with pytest.raises(StoreUnavailableError, match="read-only for this process"):
            store.claim(first, "w1", 30)
        assert store.try_claim_many([(first, "w1")], 30) is None
        read_only.make_writable()
        assert store.claim(first, "w1", 30).outcome is ClaimOutcome.CLAIMED
        claims = store.try_claim_many([(second, "w1")], 30)  # its own connection, too
        assert claims is not None
        assert [claim.outcome for claim in claims] == [ClaimOutcome.CLAIMED]


def test_a_transactional_handlers_write_refused_by_a_read_only_sqlite_file_is_an_outage_that_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler's own statement meets the read-only connection: an outage (the
    worker runs the transaction again), and the next try writes once it can."""
    path = a_ledger(tmp_path / "jobs.db")
    job = Job(task="ro.task")
    with SQLiteStore(path) as store:
        store.claim(job, "w1", 30)

    def effects(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT)")
        db.execute("INSERT INTO effects VALUES (?)", (job.idempotency_key,))

    read_only = ReadOnlyFile(monkeypatch)
    with SQLiteStore(path) as store:
        with pytest.raises(sqlite3.OperationalError) as refused:
            store.succeed_with(job.idempotency_key, "w1", effects)
        assert store.is_outage(refused.value)
        read_only.make_writable()
        store.succeed_with(job.idempotency_key, "w1", effects)
        assert store.get(job.idempotency_key).status is Status.SUCCEEDED  # type: ignore[union-attr]


def test_a_worker_started_on_a_read_only_sqlite_ledger_goes_on_once_it_is_writable(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ledger file is read-only when the worker starts (a read-only bind mount):
    it holds its jobs and says why; made writable, they all run, once each."""
    app = make_app()
    runs: Counter[str] = Counter()

    @app.task("outage.read_only", queue=QueueOptions(delivery_limit=1))
    def effect(payload: Key) -> None:
        runs[payload.key] += 1

    path = a_ledger(tmp_path / "jobs.db")
    read_only = ReadOnlyFile(monkeypatch)
    with SQLiteStore(path) as store:
        worker = Worker(broker.url, app, store, WorkerSettings(burst=True, concurrency=4))
        outcomes: list[Counter[str]] = []
        thread = threading.Thread(
            target=lambda: outcomes.append(asyncio.run(worker.run())), name="worker under test"
        )
        keys = publish(broker, app, "outage.read_only")
        thread.start()
        try:
            reason = wait_until(
                lambda: held_for_the_ledger(worker),
                within=60,
                what="the worker to say it holds its jobs for the ledger",
            )
            read_only.make_writable()
            thread.join(60)
            drained = not thread.is_alive()
        finally:
            worker.stop()
            thread.join(60)
        assert drained, "the worker still held its jobs once the file was writable"
        assert "read-only for this process" in reason
        assert outcomes[0]["succeeded"] == JOBS, outcomes
        assert dead_letter_count(connection, app, "outage.read_only") == 0
        assert all(store.get(key).status is Status.SUCCEEDED for key in keys)  # type: ignore[union-attr]
        assert runs == Counter({f"k{n}": 1 for n in range(JOBS)})


def test_a_handlers_own_database_error_is_its_failure_not_an_outage(
    tmp_path: Path,
) -> None:
    """The stores tell an outage (a lock, a full disk, a lost connection) from a
    handler's wrong statement, which its retry policy decides as before."""
    with SQLiteStore(tmp_path / "jobs.db") as store:
        full = sqlite3.OperationalError("database or disk is full")
        full.sqlite_errorcode = sqlite3.SQLITE_FULL
        locked = sqlite3.OperationalError("database is locked")
        locked.sqlite_errorcode = sqlite3.SQLITE_BUSY
        wrong = sqlite3.IntegrityError("UNIQUE constraint failed: effects.key")
        wrong.sqlite_errorcode = sqlite3.SQLITE_CONSTRAINT
        assert store.is_outage(full)
        assert store.is_outage(locked)
        assert not store.is_outage(wrong)
        assert not store.is_outage(ValueError("x"))


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def a_gate(clock: Clock) -> tuple[ledger_gate.LedgerGate, CollectorRegistry]:
    registry = CollectorRegistry()
    observer = JobObserver("ns", "w1", WorkerMetrics(registry))
    return ledger_gate.LedgerGate("PostgresStore('db')", observer, clock=clock), registry


def gate_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == ledger_gate.__name__ and r.levelno >= logging.INFO
    ]


def test_a_ledger_that_flaps_is_one_outage_said_once_and_its_end_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A PostgreSQL that drops each connection as it comes answers for a moment
    between failures: one WARNING at once, one INFO once it has answered for
    STEADY_AFTER seconds; /readyz and ledger_up follow each answer meanwhile."""
    clock = Clock()
    gate, registry = a_gate(clock)

    def up() -> float | None:
        return registry.get_sample_value("broker_jobs_ledger_up", {"namespace": "ns"})

    caplog.set_level(logging.DEBUG, logger=ledger_gate.__name__)
    gate.failed(StoreUnavailableError("server closed the connection unexpectedly"))
    assert [level for level, _ in gate_lines(caplog)] == [logging.WARNING]  # at once
    for _ in range(35):  # 14 s: answers for 0.2 s, fails for 0.2 s
        clock.now += 0.2
        gate.answered()
        assert gate.describe() is None
        assert up() == 1
        clock.now += 0.2
        gate.failed(StoreUnavailableError("server closed the connection unexpectedly"))
        assert "has failed for" in (gate.describe() or "")
        assert up() == 0
    clock.now += 0.2
    gate.answered()
    clock.now += ledger_gate.STEADY_AFTER / 2
    gate.settle()
    gate.answered()
    assert len(gate_lines(caplog)) == 1  # not over yet: it answered for too short
    clock.now += ledger_gate.STEADY_AFTER / 2
    gate.settle()
    lines = gate_lines(caplog)
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO]
    assert "answers again after 14.2 s" in lines[1][1]
    assert "failed again 35 times" in lines[1][1]
    assert registry.get_sample_value(
        "broker_jobs_ledger_down_seconds_total", {"namespace": "ns"}
    ) == pytest.approx(36 * 0.2)


def test_an_outage_the_ledger_answered_is_said_over_when_the_worker_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A burst worker drains and ends within STEADY_AFTER of the answer: its last
    word on the ledger is that it answers, not that it failed."""
    clock = Clock()
    gate, _ = a_gate(clock)
    caplog.set_level(logging.INFO, logger=ledger_gate.__name__)
    gate.failed(StoreUnavailableError("connection refused"))
    clock.now += 3.0
    gate.answered()
    gate.close()
    lines = gate_lines(caplog)
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO]
    assert "answers again after 3.0 s" in lines[1][1]
    gate.close()  # once over, said no more
    assert len(gate_lines(caplog)) == 2


def test_a_postgres_that_refuses_writes_leaves_no_psycopg_pipeline_lines(
    postgres_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A standby after a failover (here: ``default_transaction_read_only``) fails
    each pipelined batch; psycopg said so again as each pipeline ended, at WARNING
    (a line a try: a second a worker). The store's error is raised as before; that
    line is DEBUG, and psycopg's line about another pipeline stays a WARNING."""
    PostgresStore(postgres_dsn, schema=pg_schema).close()  # its tables, made writable
    read_only = make_conninfo(postgres_dsn, options="-c default_transaction_read_only=on")
    jobs = [(Job(task="ro.task"), "w1") for _ in range(20)]
    caplog.set_level(logging.DEBUG, logger="psycopg")
    with PostgresStore(read_only, schema=pg_schema) as store:
        for _ in range(5):  # psycopg meets the error inside the block: nearly always
            with pytest.raises(StoreError, match="read-only transaction"):
                store.claim_many(jobs, 30)
            with pytest.raises(StoreError, match="read-only transaction"):
                store.succeed_many([(job.idempotency_key, worker) for job, worker in jobs])
    ended = [r for r in caplog.records if r.name == "psycopg" and "terminating" in r.message]
    assert ended, "psycopg said nothing of the pipelines: the test did not fail them"
    assert {r.levelno for r in ended} == {logging.DEBUG}
    logging.getLogger("psycopg").warning(postgres_logs.ENDED_IN_ERROR, "their pipeline", "x")
    assert caplog.records[-1].levelno == logging.WARNING


class LedgerDown(MemoryStore):
    """A ledger every call of the heartbeat and of the paused tasks' reader fails on,
    as a stopped server's would."""

    def record_process(self, record: ProcessRecord) -> None:
        raise StoreUnavailableError("connection refused")

    def pauses(self, namespace: str) -> dict[str, TaskPause]:
        raise StoreUnavailableError("connection refused")


def test_the_heartbeat_and_the_paused_tasks_leave_the_ledgers_outage_to_its_gate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One ledger outage is one WARNING of the worker's: the gate's. While it is in
    one, the heartbeat and the paused tasks' reader fail without a line (and end
    without one); a failure of theirs outside the gate's outage is said as before."""
    gate, _ = a_gate(Clock())
    store = LedgerDown()
    heartbeat = Heartbeat(
        store, process_record(ProcessKind.WORKER, "w1", "ns"), quiet=lambda: gate.in_outage
    )
    runner = cast(Runner, SimpleNamespace(paused=frozenset(), ledger=gate))
    controls = ControlWatch(
        store, "ns", {"q.t": "t"}, runner, worker_id="w1", every=1.0, on_stop=lambda _: None
    )
    caplog.set_level(logging.INFO, logger="broker_jobs")

    def warnings() -> list[str]:
        return [r.name for r in caplog.records if r.levelno >= logging.WARNING]

    gate.failed(StoreUnavailableError("connection refused"))
    for _ in range(3):
        assert not heartbeat.write(Pulse())
        asyncio.run(controls.read())
    assert warnings() == [ledger_gate.__name__]
    gate.answered()
    gate.close()  # the gate's outage is over; theirs goes on: said now
    heartbeat.write(Pulse())
    asyncio.run(controls.read())
    assert warnings() == [ledger_gate.__name__, heartbeat_module.__name__, controls_module.__name__]


# --- a commit whose answer was lost --------------------------------------------------------


class AnswerLostOnce(MemoryStore):
    """A ledger whose first call of ``method`` commits, then fails as a PostgreSQL
    connection dropped in the commit does: written, its answer lost."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method
        self.failed = 0

    def _answer(self, method: str, result: Any) -> Any:
        if method == self.method and not self.failed:
            self.failed += 1
            raise StoreUnavailableError("server closed the connection unexpectedly")
        return result

    def succeed_many_keeping(self, finished: Sequence[tuple[str, str, Output]]) -> list[str]:
        return cast(
            "list[str]",
            self._answer("succeed_many_keeping", super().succeed_many_keeping(finished)),
        )

    def retry(self, *args: Any, **kwargs: Any) -> None:
        self._answer("retry", super().retry(*args, **kwargs))

    def dead(self, *args: Any, **kwargs: Any) -> None:
        self._answer("dead", super().dead(*args, **kwargs))


class Step(BaseModel):
    n: int


def test_a_success_whose_commit_lost_its_answer_still_publishes_its_follow_ups(
    broker: Broker, make_app: Callable[[], App], caplog: pytest.LogCaptureFixture
) -> None:
    """The worker holds the success through the outage and records it again; that
    try finds it recorded under the delivery's own holder: recorded, not a lease
    taken over, so its next step is published and runs once."""
    app = make_app()
    runs: Counter[str] = Counter()

    @app.task("answer.parent", retry=RetryPolicy(max_attempts=1))
    def parent(payload: Step, job: JobContext) -> int:
        runs[job.idempotency_key] += 1
        job.then("answer.child", Step(n=payload.n + 1))
        return payload.n

    @app.task("answer.child", retry=RetryPolicy(max_attempts=1))
    def child(payload: Step, job: JobContext) -> None:
        runs[job.idempotency_key] += 1

    with Publisher(broker.url, app) as publisher:
        publisher.publish("answer.parent", Step(n=1), idempotency_key="p")
    store = AnswerLostOnce("succeed_many_keeping")
    with caplog.at_level(logging.WARNING, logger="broker_jobs.worker"):
        outcomes = run_burst_worker(broker, app, store)
    assert store.failed == 1
    assert runs == {"p": 1, "p>1": 1}
    assert outcomes["succeeded"] == 2
    assert store.result("p") == 1
    kept = store.output("p")
    assert kept is not None
    assert kept.sent_at is not None
    assert "taken over" not in caplog.text


@pytest.mark.parametrize(
    ("method", "attempts", "outcome"),
    [("retry", 2, "succeeded"), ("dead", 1, "dead:exhausted")],
)
def test_a_failure_whose_record_lost_its_answer_is_settled_once(
    broker: Broker,
    make_app: Callable[[], App],
    caplog: pytest.LogCaptureFixture,
    method: str,
    attempts: int,
    outcome: str,
) -> None:
    """A retry or a dead letter recorded, its answer lost: the held try finds the
    outcome under the delivery's own holder and acks the delivery (it was left
    unacked, held by the worker until its channel closed); the next attempt runs
    once, the dead letter is there once."""
    app = make_app()
    runs: Counter[int] = Counter()

    @app.task("answer.flaky", retry=RetryPolicy(max_attempts=attempts, base_delay=0.1))
    def flaky(payload: Step, job: JobContext) -> None:
        runs[job.attempt] += 1
        if job.attempt == 1:
            raise RuntimeError("first attempt fails")

    with Publisher(broker.url, app) as publisher:
        publisher.publish("answer.flaky", Step(n=1), idempotency_key="f")
    store = AnswerLostOnce(method)
    with caplog.at_level(logging.WARNING, logger="broker_jobs.worker"):
        outcomes = run_burst_worker(broker, app, store)
    assert store.failed == 1
    assert runs == {n: 1 for n in range(1, attempts + 1)}
    assert outcomes[outcome] == 1
    assert outcomes["left"] == 0
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        assert dead_letter_count(connection, app, "answer.flaky") == (method == "dead")
    assert "taken over" not in caplog.text
