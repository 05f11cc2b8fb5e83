"""Declaring the namespace's objects on a real broker: idempotent, never changing
or deleting anything, and explicit about conflicts."""

from __future__ import annotations

from collections.abc import Callable

import pika
import pytest
from pika.exchange_type import ExchangeType
from pydantic import BaseModel

import broker_jobs
from broker_jobs import App, QueueOptions, QueueType
from tests.support import AnyPublisher, drain_at_least, untyped_queue_type
from topology import TopologyConflictError, declare
from topology.errors import show_value

pytestmark = [pytest.mark.broker, pytest.mark.also_on_rabbitmq_4]  # every broker test: on 4.0 too


class Empty(BaseModel):
    pass


def persistent() -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, content_type="application/json")


@pytest.fixture
def app(make_app: Callable[[], App]) -> App:
    app = make_app()
    app.declare("mail.send", Empty)
    return app


def test_declaring_twice_changes_nothing(app: App, connection: pika.BlockingConnection) -> None:
    first = declare(connection, app.topology(ladder=False))
    channel = connection.channel()
    channel.confirm_delivery()  # the depth below must count it: wait for the broker's ack
    channel.basic_publish(app.names.work_exchange, "mail.send", b"{}", persistent())
    second = declare(connection, app.topology(ladder=False))
    assert first == second
    assert first.queues == [
        app.names.dead_letter_queue("mail.send"),
        app.names.task_queue("mail.send"),
    ]
    assert first.bindings == 3  # work, dead-letter and delayed delivery
    depth = channel.queue_declare(app.names.task_queue("mail.send"), passive=True)
    assert depth.method.message_count == 1


def test_a_classic_queue_where_quorum_is_wanted_is_reported_not_touched(
    app: App, connection: pika.BlockingConnection
) -> None:
    queue = app.names.task_queue("mail.send")
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.basic_publish("", queue, b'{"kept": true}', persistent())

    with pytest.raises(TopologyConflictError) as caught:
        declare(connection, app.topology(ladder=False))

    (conflict,) = caught.value.conflicts
    assert (conflict.kind, conflict.name) == ("queue", queue)
    differing = {difference.argument: difference for difference in conflict.differences}
    # The broker compares quorum-only arguments (delivery limit, dead-letter strategy)
    # only between quorum queues, so the type difference stands for them.
    assert set(differing) == {
        "x-queue-type",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-overflow",
    }
    assert differing["x-queue-type"].wanted == "quorum"
    assert differing["x-dead-letter-exchange"].wanted == app.names.dead_letter_exchange
    assert differing["x-dead-letter-exchange"].existing is None
    message = str(caught.value)
    assert queue in message
    untyped = show_value(untyped_queue_type(connection))
    assert f"x-queue-type: wanted 'quorum', broker has {untyped}" in message
    assert "cannot change a queue's type in place" in message
    # Everything else was declared, and the existing queue still holds its message.
    depth = connection.channel().queue_declare(queue, passive=True)
    assert depth.method.message_count == 1
    connection.channel().queue_declare(app.names.dead_letter_queue("mail.send"), passive=True)


def test_a_different_delivery_limit_is_the_only_difference_reported(
    make_app: Callable[[], App], connection: pika.BlockingConnection
) -> None:
    old = make_app()
    old.declare("mail.send", Empty, queue=QueueOptions(delivery_limit=5))
    declare(connection, old.topology(ladder=False))
    new = App(namespace=old.namespace)
    new.declare("mail.send", Empty)
    with pytest.raises(TopologyConflictError) as caught:
        declare(connection, new.topology(ladder=False))
    (conflict,) = caught.value.conflicts
    assert [(d.argument, d.wanted, d.existing) for d in conflict.differences] == [
        ("x-delivery-limit", 10, 5)
    ]
    assert "arguments cannot change once declared" in conflict.remedy


def test_an_exchange_of_another_type_is_a_conflict(
    app: App, connection: pika.BlockingConnection
) -> None:
    connection.channel().exchange_declare(app.names.work_exchange, "direct", durable=True)
    with pytest.raises(TopologyConflictError) as caught:
        declare(connection, app.topology(ladder=False))
    (conflict,) = caught.value.conflicts
    assert (conflict.kind, conflict.name) == ("exchange", app.names.work_exchange)
    assert [(d.argument, d.wanted, d.existing) for d in conflict.differences] == [
        ("type", "topic", "direct")
    ]


def test_every_difference_of_an_exchange_is_reported_alternate_exchange_included(
    app: App, connection: pika.BlockingConnection
) -> None:
    """RabbitMQ names one difference per refusal, the type first; the alternate
    exchange (fixed at creation, like a queue's arguments) is compared too."""
    out = app.names.delay_out_exchange
    channel = connection.channel()
    channel.exchange_declare(out, ExchangeType("direct"), durable=True)
    with pytest.raises(TopologyConflictError) as caught:
        declare(connection, app.topology(ladder=False))
    (conflict,) = caught.value.conflicts
    assert (conflict.kind, conflict.name) == ("exchange", out)
    assert [(d.argument, d.wanted, d.existing) for d in conflict.differences] == [
        ("type", "topic", "direct"),
        ("alternate-exchange", app.names.unroutable_exchange, None),
    ]
    assert "cannot change an exchange's arguments in place" in conflict.remedy

    connection.channel().exchange_delete(out)
    other = {"alternate-exchange": "elsewhere"}
    connection.channel().exchange_declare(out, ExchangeType("topic"), durable=True, arguments=other)
    with pytest.raises(TopologyConflictError) as caught:
        declare(connection, app.topology(ladder=False))
    assert [(d.argument, d.wanted, d.existing) for d in caught.value.conflicts[0].differences] == [
        ("alternate-exchange", app.names.unroutable_exchange, "elsewhere")
    ]


def test_publishers_report_conflicts_as_broker_jobs_errors(
    app: App, connection: pika.BlockingConnection, make_publisher: Callable[..., AnyPublisher]
) -> None:
    connection.channel().queue_declare(app.names.task_queue("mail.send"), durable=True)
    publisher = make_publisher(app)
    with pytest.raises(broker_jobs.TopologyConflictError) as caught:
        publisher.publish("mail.send", {})
    assert caught.value.conflicts[0].name == app.names.task_queue("mail.send")


def test_classic_queues_are_selectable(
    make_app: Callable[[], App], connection: pika.BlockingConnection
) -> None:
    app = make_app()
    app.declare("report.build", Empty, queue=QueueOptions(queue_type=QueueType.CLASSIC))
    declare(connection, app.topology(ladder=False))
    quorum = App(namespace=app.namespace)
    quorum.declare("report.build", Empty)
    with pytest.raises(TopologyConflictError, match="wanted 'quorum', broker has 'classic'"):
        declare(connection, quorum.topology(ladder=False))


def test_a_rejected_job_lands_in_the_dead_letter_queue(
    app: App, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology(ladder=False))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        app.names.work_exchange,
        "mail.send",
        b"{}",
        pika.BasicProperties(
            delivery_mode=2, content_type="application/json", message_id="j1", type="mail.send"
        ),
        mandatory=True,
    )
    method, _, _ = channel.basic_get(app.names.task_queue("mail.send"))
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=False)
    dead = drain_at_least(connection, app.names.dead_letter_queue("mail.send"), 1)
    assert [job.id for job in dead] == ["j1"]


def test_a_job_redelivered_past_the_delivery_limit_is_dead_lettered(
    make_app: Callable[[], App], connection: pika.BlockingConnection
) -> None:
    app = make_app()
    app.declare("crash.loop", Empty, queue=QueueOptions(delivery_limit=1))
    declare(connection, app.topology(ladder=False))
    channel = connection.channel()
    channel.confirm_delivery()
    properties = pika.BasicProperties(
        delivery_mode=2, content_type="application/json", message_id="j2", type="crash.loop"
    )
    channel.basic_publish(app.names.work_exchange, "crash.loop", b"{}", properties)
    queue = app.names.task_queue("crash.loop")
    deliveries = 0
    while True:  # each requeue stands for a worker that died holding the job
        method, _, _ = channel.basic_get(queue)
        if method is None:
            break
        deliveries += 1
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert deliveries == 2  # the first delivery plus one redelivery
    dead = drain_at_least(connection, app.names.dead_letter_queue("crash.loop"), 1)
    assert [job.id for job in dead] == ["j2"]
