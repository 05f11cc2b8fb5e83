"""Faults injected for real into the session's broker node: restart, kill -9 in the
middle of a batch, and a broker that stops confirming (a memory alarm).

These tests run last (see conftest) and leave the node running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import aio_pika
import pika
import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from starlette.testclient import TestClient

from broker_jobs import (
    App,
    AsyncPublisher,
    ConfirmTimeoutError,
    Job,
    JobContext,
    JobRequest,
    PublishBatchError,
    Publisher,
    PublisherBusyError,
    RetryPolicy,
)
from broker_jobs.dashboard import DashboardSettings, create_app
from broker_jobs.errors import BrokerConnectionError, BrokerJobsError
from broker_jobs.ops.dead_letters import DeadLetterQueues
from broker_jobs.ops.exporter import Exporter
from broker_jobs.ops.publishing_check import Publishing
from broker_jobs.ops.status import collect
from broker_jobs.ops.unroutable import reroute
from broker_jobs.publish.prepare import JobFactory
from broker_jobs.store.memory import MemoryStore
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.urls import BrokerURLs
from broker_jobs.worker import Worker, WorkerSettings, publish_outage
from scheduler import load_schedules
from scheduler.emitter import Emitter
from tests.support import AnyPublisher, Broker, drain_at_least, wait_until
from topology import declare
from topology.delay import DELAY_LEVELS, delay_routing_key

pytestmark = [pytest.mark.broker, pytest.mark.fault]

MakePublisher = Callable[..., AnyPublisher]


class Order(BaseModel):
    number: int


@pytest.fixture
def node(broker: Broker) -> Iterator[RabbitNode]:
    node = broker.controllable()
    yield node
    if not node.running:  # a failed test must not take the broker from the next one
        node.start()


@pytest.fixture
def app(make_app: Callable[[], App]) -> App:
    app = make_app()
    app.declare("order.ship", Order)
    return app


@contextlib.contextmanager
def memory_alarm(node: RabbitNode, *, now: bool = True) -> Iterator[Callable[[], None]]:
    """A memory alarm: the broker reads nothing more from publishing connections, so
    no confirm can come. Raised now, or when the block calls what this yields; cleared
    after the block whatever happened in it."""

    def raise_alarm() -> None:
        node.ctl("set_vm_memory_high_watermark", "0")

    if now:
        raise_alarm()
    try:
        yield raise_alarm
    finally:
        node.ctl("set_vm_memory_high_watermark", "0.4")


def stored_jobs(broker: Broker, app: App, at_least: int, within: float = 5.0) -> list[Job]:
    """The jobs in the task queue after a restart. A quorum queue reads short for up
    to ~2 s while its log replays, so poll its depth (bounded) before draining."""
    with broker.connection("test fault check") as connection:
        queue = app.names.task_queue("order.ship")
        return drain_at_least(connection, queue, at_least, within)


def where_jobs_wait(broker: Broker, app: App) -> str:
    """The depths of the namespace's ladder levels and unroutable queue (those
    holding anything), for the message of a failed assertion."""
    names = app.names
    queues = [*(names.delay_queue(level) for level in range(DELAY_LEVELS)), names.unroutable_queue]
    with broker.connection("test fault check") as connection:
        channel = connection.channel()
        depths = {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}
    held = {queue: depth for queue, depth in depths.items() if depth}
    return f"holding them: {held}" if held else "no ladder level nor the unroutable queue holds any"


@pytest.mark.also_on_rabbitmq_4
def test_the_next_publish_after_a_broker_restart_succeeds_and_nothing_is_lost(
    broker: Broker, node: RabbitNode, app: App, make_publisher: MakePublisher
) -> None:
    publisher = make_publisher(app)
    before = [publisher.publish("order.ship", {"number": n}) for n in range(50)]
    node.restart()
    after = publisher.publish("order.ship", {"number": 50})
    stored = stored_jobs(broker, app, at_least=51)
    assert sorted(job.id for job in stored) == sorted(job.id for job in [*before, after])


def test_a_broker_killed_mid_batch_leaves_every_confirmed_job_stored(
    broker: Broker, node: RabbitNode, app: App, make_publisher: MakePublisher
) -> None:
    with broker.connection("test fault setup") as connection:
        declare(connection, app.topology(ladder=False))
    # RabbitMQ 3.10 writes its registry of quorum queues to disk every 500 ms: a queue
    # declared just before a kill -9 comes back empty (fixed upstream in ra#443). No
    # event tells us the write happened, so wait it out once.
    time.sleep(1.0)
    confirmed_seen: list[str] = []

    def kill_after_some(job: Job) -> None:
        confirmed_seen.append(job.id)
        if len(confirmed_seen) == 500:
            node.kill()

    requests = [JobRequest("order.ship", {"number": n}) for n in range(20_000)]
    publisher = make_publisher(app, confirm_timeout=5)
    with pytest.raises(PublishBatchError) as caught:
        publisher.publish_many(requests, on_confirmed=kill_after_some)
    confirmed = caught.value.confirmed
    assert len(confirmed) >= 500
    assert sorted(confirmed) == sorted(confirmed_seen)
    assert len(confirmed) + len(caught.value.failed) == len(requests)

    node.start()
    stored = [job.id for job in stored_jobs(broker, app, at_least=len(confirmed))]
    assert len(stored) == len(set(stored)), "a job was stored twice"
    assert set(confirmed) <= set(stored), "a confirmed job was lost"
    assert set(stored) <= set(caught.value.failed) | set(confirmed)


@pytest.mark.also_on_rabbitmq_4
def test_a_broker_that_stops_confirming_gives_a_timeout_not_a_hang(
    broker: Broker, node: RabbitNode, app: App, make_publisher: MakePublisher
) -> None:
    publisher = make_publisher(app, confirm_timeout=1)
    publisher.publish("order.ship", {"number": 1})  # connected and declared
    # A memory alarm blocks every publishing connection: the broker reads nothing
    # more from it, so no confirm can come, as with a quorum queue without majority.
    with memory_alarm(node):
        with pytest.raises(ConfirmTimeoutError, match=r"outcome is unknown.*memory or disk alarm"):
            publisher.publish("order.ship", {"number": 2})
        # A batch larger than the confirm window stalls at the window, and says so.
        requests = [JobRequest("order.ship", {"number": n}) for n in range(1500)]
        with pytest.raises(PublishBatchError) as caught:
            publisher.publish_many(requests)
        assert caught.value.confirmed == []
        errors = list(caught.value.failed.values())
        assert len(errors) == 1500
        # (Whether a batch's fresh connection heard connection.blocked before its
        # timeout is a race: its hint is not checked here, the single publish's is.)
        assert any(isinstance(error, ConfirmTimeoutError) for error in errors)
        assert all("not sent" in str(error) for error in errors[-400:])
    job = publisher.publish("order.ship", {"number": 3})
    assert job.id in {stored.id for stored in stored_jobs(broker, app, at_least=2)}


def test_a_fire_whose_connection_closes_before_its_confirm_is_a_broken_link(
    broker: Broker, node: RabbitNode, app: App, make_publisher: MakePublisher
) -> None:
    """A leader standing down closes its connection under a fire's unconfirmed
    publish (aiormq cancels the confirm's future): the emit says the link broke, and
    the beat stands down and joins again, instead of dying of a CancelledError."""
    make_publisher(app).publish("order.ship", {"number": 0})  # the topology declared
    app.schedule("ship", "order.ship", every=60, payload={"number": 1})
    (schedule,) = load_schedules(app)

    async def emit_while_the_connection_closes() -> BaseException | None:
        connection = await aio_pika.connect(broker.url)
        channel = await connection.channel(publisher_confirms=True)
        emitter = Emitter(JobFactory(app, None), confirm_timeout=60)
        emitting = asyncio.create_task(emitter.emit(channel, schedule, datetime.now(UTC)))
        for _ in range(20):  # loop turns: the publish goes out, its confirm cannot come
            await asyncio.sleep(0)
        await connection.close()
        try:
            await emitting
        except Exception as error:
            return error
        return None

    with memory_alarm(node):
        error = asyncio.run(emit_while_the_connection_closes())
    assert isinstance(error, BrokerConnectionError), error


def test_a_publish_whose_connection_is_closed_under_it_fails_as_a_broken_link(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    """A publish waits for a confirm that cannot come (a memory alarm) when its
    publisher's connection is closed (another task's publish dropped it, or a
    shutdown): aiormq cancels the confirm's future. The publish fails with the
    library's error, not a CancelledError, which would end the task making it (a
    worker's retry, say) as if it had been cancelled."""

    async def closed_under_a_publish() -> BaseException | Job:
        async with AsyncPublisher(broker.url, app, confirm_timeout=2) as publisher:
            await publisher.publish("order.ship", {"number": 0})  # connected, declared
            raise_alarm()
            waiting = asyncio.create_task(publisher.publish("order.ship", {"number": 1}))
            for _ in range(20):  # loop turns: the publish goes out, its confirm cannot come
                await asyncio.sleep(0)
            await publisher.close()
            (outcome,) = await asyncio.gather(waiting, return_exceptions=True)
            return outcome

    with memory_alarm(node, now=False) as raise_alarm:
        outcome = asyncio.run(closed_under_a_publish())
    assert isinstance(outcome, BrokerJobsError), outcome


def test_threads_sharing_a_publisher_the_broker_blocks_wait_at_most_their_timeout(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    """A thread queued behind others' publishes to a blocked broker gives up after
    its confirm_timeout, saying nothing was sent, instead of waiting for each of theirs."""
    with Publisher(broker.url, app, confirm_timeout=1) as publisher:
        publisher.publish("order.ship", {"number": 0})  # connected and declared
        outcomes: list[BaseException | Job] = []
        with memory_alarm(node):

            def publish(number: int) -> None:
                try:
                    outcomes.append(publisher.publish("order.ship", {"number": number}))
                except BrokerJobsError as error:
                    outcomes.append(error)

            threads = [threading.Thread(target=publish, args=(n,)) for n in range(1, 5)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    kinds = Counter(type(outcome).__name__ for outcome in outcomes)
    assert set(kinds) <= {"ConfirmTimeoutError", "PublisherBusyError"}, outcomes
    assert kinds["PublisherBusyError"] >= 1, outcomes  # (4 threads, 1 s each: they queue)
    busy = next(o for o in outcomes if isinstance(o, PublisherBusyError))
    assert "was not sent" in str(busy)


def test_publishes_in_flight_when_an_async_publisher_closes_open_no_connection(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    """close() under publishes waiting for confirms: each fails with the library's
    error, and none opens a new connection for itself (a closed publisher would hold
    it); the publisher opens one again only for a publish made after close()."""

    class Counting(AsyncPublisher):
        connects = 0

        async def _connect(self) -> Any:
            self.connects += 1
            return await super()._connect()

    async def close_under_publishes() -> tuple[list[BaseException | Job], int]:
        publisher = Counting(broker.url, app, confirm_timeout=5)
        await publisher.publish("order.ship", {"number": 0})  # connected, declared
        raise_alarm()
        waiting = [
            asyncio.create_task(publisher.publish("order.ship", {"number": n}))
            for n in range(1, 20)
        ]
        for _ in range(20):  # loop turns: they go out, their confirms cannot come
            await asyncio.sleep(0)
        await publisher.close()
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        await publisher.close()
        return outcomes, publisher.connects

    with memory_alarm(node, now=False) as raise_alarm:
        outcomes, connects = asyncio.run(close_under_publishes())
    assert all(isinstance(outcome, BrokerJobsError) for outcome in outcomes), outcomes
    assert connects == 1  # none reconnected after close()


def test_publishes_timing_out_together_fail_with_the_librarys_errors_only(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    """Publishes whose timeouts and reconnects overlap on a blocked broker fail with
    the library's errors only. (A failure on an old connection closed the new one
    another publish was opening, whose aiormq ``Exception`` a worker took for its own
    processing error; seen with a worker under an alarm, this does not reproduce it
    reliably: it checks the errors a caller sees.)"""

    async def time_out_together() -> list[BaseException | Job]:
        async with AsyncPublisher(broker.url, app, confirm_timeout=1) as publisher:
            await publisher.publish("order.ship", {"number": 0})  # connected, declared
            raise_alarm()

            async def publish_after(number: int) -> Job:
                await asyncio.sleep(number * 0.05)  # their timeouts and reconnects overlap
                return await publisher.publish("order.ship", {"number": number})

            return await asyncio.gather(
                *(publish_after(n) for n in range(1, 40)), return_exceptions=True
            )

    with memory_alarm(node, now=False) as raise_alarm:
        outcomes = asyncio.run(time_out_together())
    strangers = [o for o in outcomes if not isinstance(o, BrokerJobsError | Job)]
    assert not strangers, strangers


@pytest.mark.also_on_rabbitmq_4
def test_a_connection_closed_by_the_broker_is_replaced_on_the_next_publish(
    broker: Broker,
    node: RabbitNode,
    app: App,
    make_publisher: MakePublisher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publisher = make_publisher(app, connection_name="victim publisher")
    first = publisher.publish("order.ship", {"number": 1})
    node.ctl("close_all_connections", "test: cut the connection")
    second = publisher.publish("order.ship", {"number": 2})
    stored = stored_jobs(broker, app, at_least=2)
    assert sorted(job.id for job in stored) == sorted([first.id, second.id])
    # Reconnects are logged, and no log line (ours or the drivers') holds the password.
    assert "reconnecting" in caplog.text
    assert "guest:guest@" not in caplog.text


@pytest.mark.also_on_rabbitmq_4
@pytest.mark.long  # the longest fault test: first of them, so it never ends the run alone
def test_delayed_jobs_survive_a_broker_restart_in_the_middle_of_their_delays(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    # Delays of 1-12 s around a restart of several seconds (7 s on a quiet 2-core
    # machine, printed): some jobs fall due while the broker is down, others are still
    # in the ladder when it is back.
    requests = [JobRequest("order.ship", {"number": n}, delay=1 + n % 12) for n in range(200)]
    with Publisher(broker.url, app, connection_name="test delayed restart") as publisher:
        jobs = publisher.publish_many(requests)
    restarting = time.monotonic()
    node.restart()
    print(f"\nthe restart took {time.monotonic() - restarting:.1f} s")
    # The broker may release a job before its queue's binding is back (seen on a
    # loaded 4.0.5): it waits in <ns>.unroutable, and a worker sends it on when it
    # connects again and at each look while connected (broker_jobs.worker.rerouting).
    rerouted = Counter(reroute(broker.url, app.names).moved)
    wanted = {job.id for job in jobs}
    arrived: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while set(arrived) < wanted and time.monotonic() < deadline:
        # At-least-once between the ladder's levels: a restart may hand a job on
        # twice (docs/wire-format.md); the worker's claim runs it once.
        arrived.update(job.id for job in stored_jobs(broker, app, at_least=len(wanted)))
        rerouted.update(reroute(broker.url, app.names).moved)
    print(f"sent on from {app.names.unroutable_queue}: {rerouted.total()}")
    missing = len(wanted - set(arrived))
    assert not missing, f"{missing} delayed jobs missing; {where_jobs_wait(broker, app)}"
    twice = [job_id for job_id, count in arrived.items() if count > 1]
    assert len(twice) <= len(wanted) // 20, f"{len(twice)} of {len(wanted)} arrived twice"


@pytest.mark.also_on_rabbitmq_4  # whose quorum queues drop a message at its 20th delivery
def test_a_pass_over_the_unroutable_queue_takes_no_job_while_the_broker_confirms_nothing(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    """Each job a pass takes and cannot send on goes back to the queue and counts as a
    delivery (a quorum queue of RabbitMQ 4.0 drops it at its 20th): while the broker
    confirms nothing (a memory alarm), a pass takes none, whatever the number of
    workers' looks."""
    names = app.names
    with broker.connection("test unroutable alarm") as connection:
        declare(connection, app.topology())
        channel = connection.channel()
        key = delay_routing_key(0, "order.ship")  # as a restart can leave it there
        channel.basic_publish(names.unroutable_exchange, key, b"{}", pika.BasicProperties())
        unroutable = names.unroutable_queue
        wait_until(
            lambda: channel.queue_declare(unroutable, passive=True).method.message_count,
            within=10,
            what="the job in the unroutable queue",
        )
    with memory_alarm(node), pytest.raises(BrokerConnectionError, match="no message was taken"):
        reroute(broker.url, names, confirm_timeout=1)
    with broker.connection("test unroutable alarm") as connection:
        method, properties, _ = connection.channel().basic_get(names.unroutable_queue)
    assert method is not None
    assert properties is not None
    assert (properties.headers or {}).get("x-delivery-count", 0) == 0  # never taken
    assert reroute(broker.url, names).moved == {"order.ship": 1}  # once publishing works


@pytest.mark.also_on_rabbitmq_4  # whose quorum queues drop a message at its 20th delivery
def test_reading_dead_letters_takes_none_while_the_broker_confirms_nothing(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    """A dead-letter pass moves each letter to the back (a copy, then an ack); a letter
    taken while the broker confirms nothing goes back to the queue as a delivery, so an
    operator listing the dead letters through a memory alarm would drop one at the
    queue's delivery limit. Listed three times under the alarm, none is taken."""
    names = app.names
    dead = names.dead_letter_queue("order.ship")
    with broker.connection("test dlq alarm") as connection:
        declare(connection, app.topology())
        channel = connection.channel()
        channel.confirm_delivery()
        for number in range(2):
            channel.basic_publish("", dead, b'{"number": %d}' % number, pika.BasicProperties())
    with memory_alarm(node):
        for _ in range(3):
            with (
                DeadLetterQueues(broker.url, names, ["order.ship"], confirm_timeout=1) as dlq,
                pytest.raises(BrokerConnectionError, match="no message was taken"),
            ):
                dlq.list()
    with broker.connection("test dlq alarm") as connection:
        channel = connection.channel()
        counts = []
        for _ in range(2):
            method, properties, _ = channel.basic_get(dead)
            assert method is not None
            assert properties is not None
            counts.append((properties.headers or {}).get("x-delivery-count", 0))
        channel.close()  # both back, at the front, in their order
    assert counts == [0, 0]  # never taken
    with DeadLetterQueues(broker.url, names, ["order.ship"]) as dlq:
        assert len(dlq.list()) == 2  # once publishing works


@pytest.mark.also_on_rabbitmq_4
def test_status_says_the_broker_blocks_publishing_and_why(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    """Passive declares read the queues as usual under a memory alarm; the report says
    the broker confirms no publish, with the reason of its ``connection.blocked``."""
    with broker.connection("test status alarm") as connection:
        declare(connection, app.topology())
    tasks = ["order.ship"]
    healthy = collect(broker.url, app.names, tasks, MemoryStore(), ask_publishing=True)
    assert healthy.publishing == Publishing(accepted=True)
    with memory_alarm(node):
        report = collect(broker.url, app.names, tasks, MemoryStore(), ask_publishing=True)
    assert report.tasks[0].queue.exists  # the queues read as before
    assert report.publishing == Publishing(accepted=False, blocked_reason="low on memory")
    assert report.document()["publishing"]["accepted"] is False


def test_the_dashboard_shows_a_banner_while_the_broker_blocks_publishing(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    """Its pages never wait for the check (~4 s under an alarm): the overview starts it
    in the background, and the pages after it finished show what it found."""
    with broker.connection("test dashboard alarm") as connection:
        declare(connection, app.topology())
    settings = DashboardSettings(
        store=MemoryStore(),
        urls=BrokerURLs.parse(broker.url),
        names=app.names,
        tasks=("order.ship",),
        app=app,
        allowed_hosts=("testserver",),  # TestClient's Host
    )
    with memory_alarm(node), TestClient(create_app(settings)) as client:
        assert 'id="publishing-blocked"' not in client.get("/").text  # not known yet
        wait_until(lambda: settings.publishing.checked_at, within=30, what="the check")
        page = client.get("/jobs").text  # any page
        assert 'id="publishing-blocked"' in page
        assert "The broker blocks publishing (low on memory)" in page
        document = client.get("/api/overview").json()
    assert document["publishing"]["accepted"] is False
    assert document["publishing"]["blocked_reason"] == "low on memory"


@pytest.mark.also_on_rabbitmq_4
def test_the_exporter_serves_whether_the_broker_blocks_publishing(
    broker: Broker, node: RabbitNode, app: App
) -> None:
    """``broker_jobs_broker_publishing_blocked`` 1 through a memory alarm, 0 before and
    after it."""
    with broker.connection("test exporter alarm") as connection:
        declare(connection, app.topology())
    registry = CollectorRegistry()
    exporter = Exporter(broker.url, app.names, ["order.ship"], registry)
    labels = {"namespace": app.namespace}

    def blocked() -> float | None:
        assert exporter.poll()
        return registry.get_sample_value("broker_jobs_broker_publishing_blocked", labels)

    try:
        assert blocked() == 0
        with memory_alarm(node):
            assert blocked() == 1
            assert blocked() == 1  # still blocked: said without another probe
        wait_until(lambda: blocked() == 0, within=30, what="the gauge back at 0")
    finally:
        exporter.close()


def test_a_worker_whose_publishes_the_broker_blocks_holds_them_says_so_once_and_loses_none(
    broker: Broker,
    node: RabbitNode,
    make_app: Callable[[], App],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A memory alarm blocks the worker's publisher (its retries): each retry is made
    again until confirmed, the delivery held meanwhile. One WARNING and one INFO say
    so (a line per try was ~1,200 lines over a 45 s alarm), and every job runs each
    attempt once: none returned, left or dead-lettered."""
    app = make_app()
    runs: Counter[tuple[str, int]] = Counter()
    lock = threading.Lock()
    alarm_on = threading.Event()

    @app.task("blocked.step", retry=RetryPolicy(max_attempts=2, base_delay=0.1))
    def step(payload: Order, job: JobContext) -> None:
        with lock:
            runs[job.idempotency_key, job.attempt] += 1
            started = sum(runs.values())
        if started > 5:  # the rest fail once the broker blocks publishing
            assert alarm_on.wait(60), "the test never raised the alarm"
        if job.attempt == 1:
            raise RuntimeError("the first attempt fails")

    keys = [f"b{n}" for n in range(40)]
    with Publisher(broker.url, app) as publisher:
        requests = [
            JobRequest("blocked.step", {"number": n}, idempotency_key=key)
            for n, key in enumerate(keys)
        ]
        publisher.publish_many(requests)
    said = threading.Event()

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.WARNING:
                said.set()

    settings = WorkerSettings(burst=True, concurrency=4, heartbeat_every=0.5)
    store = MemoryStore()
    worker = Worker(broker.url, app, store, settings)
    outcomes: list[Counter[str]] = []
    thread = threading.Thread(target=lambda: outcomes.append(asyncio.run(worker.run())))
    outage_log = logging.getLogger(publish_outage.__name__)
    handler = Said()
    outage_log.addHandler(handler)
    caplog.set_level(logging.INFO, logger=publish_outage.__name__)
    thread.start()
    try:
        with memory_alarm(node, now=False) as raise_alarm:
            raise_alarm()
            alarm_on.set()
            assert said.wait(60), "the worker never said its publishes fail"
            ready, reason = worker.readiness()  # held until the alarm clears
            assert not ready
            assert "confirmed none of this worker's publishes" in reason
            held = wait_until(  # and its heartbeat says so (`broker-jobs workers`)
                lambda: next((p.held for p in store.processes(app.namespace) if p.held), None),
                within=30,
                what="a heartbeat saying why the worker holds its deliveries",
            )
            assert "confirmed none of this worker's publishes" in held
    finally:
        alarm_on.set()
        outage_log.removeHandler(handler)
        thread.join(120)
    assert not thread.is_alive()
    [counts] = outcomes
    assert (counts["retried"], counts["succeeded"]) == (40, 40), counts
    assert not {"returned", "left"} & set(counts), counts
    assert not [outcome for outcome in counts if outcome.startswith("dead")], counts
    assert runs == {(key, attempt): 1 for key in keys for attempt in (1, 2)}
    said_lines = [
        record.levelname for record in caplog.records if record.name == publish_outage.__name__
    ]
    assert said_lines == ["WARNING", "INFO"]
