"""Delayed jobs: the due time, the route through the ladder, and arrival on a real
broker (both publishers), intact and never early by more than the hold bound."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pika
import pytest
from pydantic import BaseModel

from broker_jobs import App, Job, JobRequest, TopologyMissingError, UnroutableError, decode
from broker_jobs.due import InvalidDelayError, due_time, route_for, seconds_until_due
from tests.support import AnyPublisher, drain, drain_at_least, wire_from_pika
from topology import Names, declare, ladder_topology
from topology.delay import (
    DELAY_LEVELS,
    EARLY_MARGIN,
    MAX_DELAY,
    MAX_HOLD,
    delay_routing_key,
    ladder_units,
    released_key,
)
from topology.lanes import Lane
from topology.names import Priority

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class Ping(BaseModel):
    n: int


# -- due times and routes (no broker) --------------------------------------------------


def test_delay_and_eta_become_a_due_time() -> None:
    assert due_time(NOW, 30, None) == NOW + timedelta(seconds=30)
    assert due_time(NOW, timedelta(minutes=5), None) == NOW + timedelta(minutes=5)
    assert due_time(NOW, 0, None) is None
    assert due_time(NOW, None, None) is None
    eta = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
    assert due_time(NOW, None, eta) == eta
    past = NOW - timedelta(hours=1)
    assert due_time(NOW, None, past) == past  # due now
    assert due_time(NOW, 365 * 86400, None) == NOW + timedelta(days=365)


@pytest.mark.parametrize(
    ("delay", "eta", "message"),
    [
        (-1, None, "must not be negative"),
        (MAX_DELAY + 1, None, "beyond"),
        (float("nan"), None, "seconds or a timedelta"),
        ("10", None, "seconds or a timedelta"),
        (None, datetime(2027, 1, 1), "timezone-aware"),
        (None, NOW + timedelta(days=400), "beyond"),
        (5, NOW, "either delay or eta"),
    ],
)
def test_absurd_delays_are_clear_errors(delay: object, eta: datetime | None, message: str) -> None:
    with pytest.raises(InvalidDelayError, match=message):
        due_time(NOW, delay, eta)  # type: ignore[arg-type]


def test_routing_keys_spell_the_whole_seconds_in_binary() -> None:
    key = delay_routing_key(13, "image.resize")
    digits, task = key.split(".")[:DELAY_LEVELS], ".".join(key.split(".")[DELAY_LEVELS:])
    assert "".join(digits).lstrip("0") == "1101"
    assert task == "image.resize"
    assert ladder_units(0.5) == 0
    assert ladder_units(1.0 + EARLY_MARGIN) == 1
    assert ladder_units(365 * 86400) == 365 * 86400 - 1
    with pytest.raises(ValueError, match="levels"):
        delay_routing_key(2**DELAY_LEVELS, "t")


def test_a_released_job_goes_on_by_its_task_and_lane() -> None:
    """What <ns>.delay.out routes by, and what a job of <ns>.unroutable is sent on with."""
    assert released_key(delay_routing_key(13, "image.resize")) == "image.resize"
    high_shard = delay_routing_key(1, "image.resize", Lane(Priority.HIGH, 3))
    assert released_key(high_shard) == "image.resize@high:3"
    for not_a_ladder_key in (
        "image.resize",  # the work exchange's
        "0." * 24 + "image.resize",  # a digit short
        "0." * 24 + "2.image.resize",  # not a binary digit
        "01." + "0." * 24 + "x",  # nor is 01
        "0." * DELAY_LEVELS,  # no task
        "0." * DELAY_LEVELS + "not a task",
    ):
        assert released_key(not_a_ladder_key) is None, not_a_ladder_key


def test_short_delays_go_straight_to_the_task_queue_and_long_ones_through_the_ladder() -> None:
    names = Names("jobs")
    soon = Job(task="t", due_at=NOW + timedelta(seconds=1))
    later = Job(task="t", due_at=NOW + timedelta(seconds=13.5))
    assert route_for(names, soon, NOW).exchange == "jobs.work"
    assert not route_for(names, soon, NOW).via_ladder
    route = route_for(names, later, NOW)
    # 13 s leave 12 whole units (binary 1100): the job enters at level 3.
    assert (route.exchange, route.via_ladder) == ("jobs.delay.03", True)
    assert route.routing_key == delay_routing_key(13, "t")
    assert seconds_until_due(later, NOW) == 13.5
    assert seconds_until_due(later, NOW + timedelta(seconds=20)) == 0


def test_the_ladder_is_a_fixed_set_of_objects() -> None:
    ladder = ladder_topology(Names("jobs"))
    # 25 levels, then the exchange and queue of unroutable jobs and their binding
    assert (len(ladder.exchanges), len(ladder.queues), len(ladder.bindings)) == (26, 26, 51)
    levels = ladder.queues[:DELAY_LEVELS]
    ttls = [queue.arguments["x-message-ttl"] for queue in levels]
    assert ttls == [1000 * 2**level for level in range(DELAY_LEVELS)]
    assert all(q.arguments["x-dead-letter-strategy"] == "at-least-once" for q in levels)
    assert ladder.queues[-1].name == "jobs.unroutable"
    assert ladder.queues[-1].arguments == {"x-queue-type": "quorum"}  # no TTL, no dead letters


# -- on a real broker -------------------------------------------------------------------

MakePublisher = Callable[..., AnyPublisher]


@pytest.fixture
def app(make_app: Callable[[], App]) -> App:
    app = make_app()
    app.declare("ping", Ping)
    return app


def received(
    connection: pika.BlockingConnection, app: App, count: int, within: float
) -> list[tuple[Job, datetime]]:
    """Jobs as they arrive in the task queue, with their arrival times."""
    channel = connection.channel()
    arrivals: list[tuple[Job, datetime]] = []
    queue = app.names.task_queue("ping")

    def on_message(
        chan: object, method: object, properties: pika.BasicProperties, body: bytes
    ) -> None:
        arrivals.append((decode(wire_from_pika(properties, body)), datetime.now(UTC)))
        channel.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

    channel.basic_consume(queue, on_message)
    deadline = datetime.now(UTC) + timedelta(seconds=within)
    while len(arrivals) < count and datetime.now(UTC) < deadline:
        connection.process_data_events(time_limit=0.1)
    channel.close()
    return arrivals


@pytest.mark.also_on_rabbitmq_4
@pytest.mark.broker
def test_delayed_jobs_arrive_intact_and_not_early(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    publisher = make_publisher(app)
    jobs = [
        publisher.publish("ping", {"n": 1}, delay=0.4, idempotency_key="k-short"),
        publisher.publish(
            "ping", {"n": 2}, delay=2.5, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"
        ),
        publisher.publish("ping", {"n": 3}, eta=datetime.now(UTC) + timedelta(seconds=3.4)),
        publisher.publish("ping", {"n": 4}),
    ]
    arrivals = received(connection, app, len(jobs), within=15)
    assert sorted(job.id for job, _ in arrivals) == sorted(job.id for job in jobs)
    by_id = {job.id: (job, at) for job, at in arrivals}
    for published in jobs:
        arrived, at = by_id[published.id]
        assert arrived == published  # id, key, attempt, due time and trace context intact
        if published.due_at is not None:
            assert (published.due_at - at).total_seconds() <= MAX_HOLD


@pytest.mark.broker
def test_a_delayed_batch_arrives_complete(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    requests = [JobRequest("ping", {"n": n}, delay=1.5 + (n % 3)) for n in range(60)]
    jobs = make_publisher(app).publish_many(requests)
    arrived = drain_at_least(connection, app.names.task_queue("ping"), len(jobs), within=15)
    assert sorted(job.id for job in arrived) == sorted(job.id for job in jobs)


@pytest.mark.also_on_rabbitmq_4
@pytest.mark.broker
def test_a_job_delayed_again_after_the_ladder_arrives_again(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    """A retry re-enters the ladder it has already passed. Copied x-death headers
    would make RabbitMQ drop it as a dead-letter cycle (celery#9867); jobs are
    re-encoded from the envelope, so it arrives."""
    publisher = make_publisher(app)
    first = publisher.publish("ping", {"n": 1}, delay=1.5)
    (arrived,) = drain_at_least(connection, app.names.task_queue("ping"), 1, within=10)
    assert arrived.id == first.id
    retry = publisher.publish(
        "ping",
        arrived.payload,
        job_id=arrived.id,
        idempotency_key=arrived.idempotency_key,
        delay=1.5,
    )
    (again,) = drain_at_least(connection, app.names.task_queue("ping"), 1, within=10)
    assert again == retry


@pytest.mark.also_on_rabbitmq_4
@pytest.mark.broker
def test_a_delayed_job_for_a_task_without_a_queue_is_refused_at_once(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology())
    untyped = make_publisher(namespace=app.namespace)
    with pytest.raises(UnroutableError, match=r"'ping\.missing'"):
        untyped.publish("ping.missing", {}, delay=30)
    assert untyped.publish("ping", {"n": 1}, delay=30).due_at is not None


@pytest.mark.broker
def test_without_declaring_a_missing_ladder_is_a_clear_error(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology(ladder=False))
    publisher = make_publisher(app, declare=False)
    publisher.publish("ping", {"n": 1}, delay=0.5)  # no ladder needed
    with pytest.raises(TopologyMissingError, match=r"delay\.05"):
        publisher.publish("ping", {"n": 2}, delay=60)
    assert len(drain(connection, app.names.task_queue("ping"))) == 1
