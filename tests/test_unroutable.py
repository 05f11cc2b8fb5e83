"""Delayed jobs for a task that has no queue (issue 13, item 3).

A publisher following ``docs/wire-format.md`` can send a delayed job for a task
nobody declared: the ladder takes it (the publish is confirmed, nothing comes back)
and, at its end, ``<ns>.delay.out`` has no binding for it. Its alternate exchange
``<ns>.unroutable`` keeps it in the queue of that name instead of dropping it.
An existing ``<ns>.delay.out`` without the argument is a conflict that ``topology
apply`` reports and leaves alone (RabbitMQ cannot change exchange arguments).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pika
import pika.exceptions
import pytest
from click.testing import CliRunner, Result
from pika.exchange_type import ExchangeType
from pydantic import BaseModel

import broker_jobs
from broker_jobs import App, JobContext
from broker_jobs.cli import main
from broker_jobs.store.memory import MemoryStore
from broker_jobs.worker import Worker, WorkerSettings, rerouting
from tests.support import AnyPublisher, Broker, wait_until
from tests.test_worker_recovery import WorkerThread
from topology import Names, QueueType, Topology, namespace_topology
from topology.delay import delay_routing_key
from topology.file import load_file

pytestmark = pytest.mark.broker

DECLARED = "mail.send"
NOBODY = "nobody.home"
TOPIC = ExchangeType("topic")


class Mail(BaseModel):
    to: str


def topology(*args: str) -> Result:
    return CliRunner().invoke(main, ["topology", *args])


@pytest.fixture
def topology_file(
    tmp_path: Path, namespace: str, cleanup_topology: Callable[[Topology], Topology]
) -> str:
    """A TOML file declaring one task, ``mail.send``; its objects are deleted after."""
    path = tmp_path / "topology.toml"
    path.write_text(f'namespace = "{namespace}"\n\n[tasks."{DECLARED}"]\n')
    cleanup_topology(load_file(path).topology())
    return str(path)


def publish_delayed(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    namespace: str,
    task: str,
    delay: float,
) -> pika.BasicProperties:
    """Publish a delayed job with plain pika, as docs/wire-format.md says: exchange
    ``<ns>.delay.<kk>`` (kk = bit length of n minus one), routing key = the 25 binary
    digits of n = floor(delay - 0.2), each followed by a dot, then the task name."""
    now = datetime.now(UTC)
    n = math.floor(delay - 0.2)
    assert n >= 1
    exchange = f"{namespace}.delay.{n.bit_length() - 1:02d}"
    routing_key = "".join(digit + "." for digit in format(n, "025b")) + task
    properties = pika.BasicProperties(
        content_type="application/json",
        delivery_mode=2,
        message_id=str(uuid.uuid4()),
        type=task,
        timestamp=int(now.timestamp()),
        headers={
            "bj-wire-version": 1,
            "bj-idempotency-key": f"key-{uuid.uuid4().hex[:8]}",
            "bj-attempt": 1,
            "bj-created-at": now.isoformat().replace("+00:00", "Z"),
            "bj-due-at": (now + timedelta(seconds=delay)).isoformat().replace("+00:00", "Z"),
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        },
    )
    # Confirmed and not returned: the ladder's level takes it whatever the task.
    channel.basic_publish(
        exchange, routing_key, json.dumps({"task": task}).encode(), properties, mandatory=True
    )
    return properties


def depth(connection: pika.BlockingConnection, queue: str) -> int:
    count = connection.channel().queue_declare(queue, passive=True).method.message_count
    assert count is not None
    return count


def wait_for_depth(
    connection: pika.BlockingConnection, queue: str, count: int, within: float
) -> None:
    deadline = time.monotonic() + within
    while depth(connection, queue) < count:
        if time.monotonic() > deadline:
            pytest.fail(f"{queue} holds {depth(connection, queue)}, not {count}, after {within} s")
        connection.sleep(0.05)


def confirm_channel(
    connection: pika.BlockingConnection,
) -> pika.adapters.blocking_connection.BlockingChannel:
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def test_a_delayed_job_for_a_task_without_a_queue_waits_in_unroutable(
    broker: Broker, namespace: str, topology_file: str, connection: pika.BlockingConnection
) -> None:
    names = Names(namespace)
    assert topology("apply", "--url", broker.url, "--file", topology_file).exit_code == 0
    channel = confirm_channel(connection)
    sent = publish_delayed(channel, namespace, NOBODY, 1.5)
    routed = publish_delayed(channel, namespace, DECLARED, 1.5)

    wait_for_depth(connection, names.unroutable_queue, 1, within=10)
    wait_for_depth(connection, names.task_queue(DECLARED), 1, within=10)
    method, got, body = connection.channel().basic_get(names.unroutable_queue, auto_ack=True)
    assert method is not None
    assert got is not None
    assert body is not None
    assert (method.exchange, method.routing_key) == (
        names.delay_out_exchange,
        "0." * 24 + "1." + NOBODY,
    )
    assert json.loads(body) == {"task": NOBODY}
    for field in ("message_id", "type", "content_type", "delivery_mode", "timestamp"):
        assert getattr(got, field) == getattr(sent, field), field
    assert got.headers is not None
    assert {key: got.headers[key] for key in sent.headers or {}} == sent.headers
    # RabbitMQ's own headers record the way through the ladder.
    assert got.headers["x-death"][0]["queue"] == names.delay_queue(0)
    # The alternate exchange takes only what nothing else routes.
    method, got, _ = connection.channel().basic_get(names.task_queue(DECLARED), auto_ack=True)
    assert method is not None
    assert got is not None
    assert got.message_id == routed.message_id
    assert depth(connection, names.unroutable_queue) == 0


def test_a_delay_out_without_its_alternate_exchange_is_a_conflict_apply_leaves_alone(
    broker: Broker, namespace: str, topology_file: str, connection: pika.BlockingConnection
) -> None:
    names = Names(namespace)
    out = names.delay_out_exchange
    # As a deployment before the alternate exchange declared it.
    connection.channel().exchange_declare(out, TOPIC, durable=True)

    plan = topology("plan", "--url", broker.url, "--file", topology_file)
    assert plan.exit_code == 1, plan.output
    assert (
        f"! exchange {out} (topic): conflict: alternate-exchange:"
        f" wanted '{names.unroutable_exchange}', broker has not set"
    ) in plan.stdout
    assert (
        f"to fix: RabbitMQ cannot change an exchange's arguments in place: delete exchange '{out}'"
    ) in plan.stdout
    assert f"+ exchange {names.unroutable_exchange} (fanout): missing, to create" in plan.stdout
    assert f"+ queue {names.unroutable_queue} (quorum): missing, to create" in plan.stdout
    # level 0's way out and the task's delivery binding both end at delay.out
    assert "2 blocked by a conflict" in plan.stdout

    apply = topology("apply", "--url", broker.url, "--file", topology_file)
    assert apply.exit_code == 1, apply.output
    assert f"! exchange {out}: alternate-exchange: wanted" in apply.stderr
    assert "at once declare it again with `broker-jobs topology apply`" in apply.stderr
    assert "everything else was declared" in apply.stderr
    assert depth(connection, names.unroutable_queue) == 0  # created
    # Left as it was: declaring it without the argument is still accepted, with it not.
    connection.channel().exchange_declare(out, TOPIC, durable=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="alternate-exchange"):
        connection.channel().exchange_declare(
            out,
            TOPIC,
            durable=True,
            arguments={"alternate-exchange": names.unroutable_exchange},
        )

    verify = topology("verify", "--url", broker.url, "--file", topology_file)
    assert verify.exit_code == 1
    assert "0 missing, 1 conflicting" in verify.stderr

    # The way out: delete the exchange (it holds no messages) and apply again.
    connection.channel().exchange_delete(out)
    again = topology("apply", "--url", broker.url, "--file", topology_file)
    assert again.exit_code == 0, again.output
    assert f"+ exchange {out} (topic): created" in again.stdout
    assert topology("verify", "--url", broker.url, "--file", topology_file).exit_code == 0
    channel = confirm_channel(connection)
    publish_delayed(channel, namespace, NOBODY, 1.5)
    publish_delayed(channel, namespace, DECLARED, 1.5)  # its binding is back too
    wait_for_depth(connection, names.unroutable_queue, 1, within=10)
    wait_for_depth(connection, names.task_queue(DECLARED), 1, within=10)


def test_jobs_released_while_delay_out_is_replaced_arrive_once_it_is_back(
    broker: Broker, namespace: str, topology_file: str, connection: pika.BlockingConnection
) -> None:
    """The upgrade's gap: level 0's quorum queue dead-letters at least once, so a job
    it releases while delay.out is missing is retried (after the broker's
    dead_letter_worker_publisher_confirm_timeout: 5 s on the throwaway node, 180 s by
    default) and arrives once the exchange is back."""
    broker.controllable()  # the retry interval is this node's setting
    names = Names(namespace)
    assert topology("apply", "--url", broker.url, "--file", topology_file).exit_code == 0
    sent = publish_delayed(confirm_channel(connection), namespace, DECLARED, 1.5)
    connection.channel().exchange_delete(names.delay_out_exchange)
    connection.sleep(2.5)  # released by level 0 after 1 s, with nowhere to go
    assert depth(connection, names.task_queue(DECLARED)) == 0

    assert topology("apply", "--url", broker.url, "--file", topology_file).exit_code == 0
    wait_for_depth(connection, names.task_queue(DECLARED), 1, within=15)
    method, got, _ = connection.channel().basic_get(names.task_queue(DECLARED), auto_ack=True)
    assert method is not None
    assert got is not None
    assert got.message_id == sent.message_id
    assert depth(connection, names.unroutable_queue) == 0


def test_a_declaring_publisher_reports_an_old_delay_out_as_a_conflict(
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    make_publisher: Callable[..., AnyPublisher],
) -> None:
    """Everything that declares ``<ns>.delay.out`` must agree on its argument: a
    publisher with ``declare=True`` names the exchange and the way out."""
    app = make_app()
    app.declare(DECLARED, Mail)
    connection.channel().exchange_declare(app.names.delay_out_exchange, TOPIC, durable=True)
    publisher = make_publisher(app)
    with pytest.raises(broker_jobs.TopologyConflictError) as caught:
        publisher.publish(DECLARED, {"to": "a@example.com"})
    (conflict,) = caught.value.conflicts
    assert conflict.name == app.names.delay_out_exchange
    assert [(d.argument, d.wanted, d.existing) for d in conflict.differences] == [
        ("alternate-exchange", app.names.unroutable_exchange, None)
    ]


def test_the_unroutable_queue_follows_the_ladder_queue_type() -> None:
    names = Names("jobs")
    for queue_type in QueueType:
        built = namespace_topology(names, (), ladder_queue_type=queue_type)
        (queue,) = [q for q in built.queues if q.name == names.unroutable_queue]
        assert queue.arguments == {"x-queue-type": queue_type.value}
        (out,) = [e for e in built.exchanges if e.name == names.delay_out_exchange]
        assert out.arguments == {"alternate-exchange": names.unroutable_exchange}


# -- sent on once their task has a queue (broker_jobs.ops.unroutable) -------------------

LATER = "report.build"


class Released(BaseModel):
    task: str


def write_topology(path: Path, namespace: str, *tasks: str) -> Topology:
    path.write_text(f'namespace = "{namespace}"\n' + "".join(f'\n[tasks."{t}"]\n' for t in tasks))
    return load_file(path).topology()


@pytest.fixture
def ladder(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
) -> Names:
    """The namespace applied with one task, mail.send: report.build has no queue."""
    cleanup_topology(write_topology(tmp_path / "ladder.toml", namespace, DECLARED))
    applied = topology("apply", "--url", broker.url, "--file", str(tmp_path / "ladder.toml"))
    assert applied.exit_code == 0, applied.output
    return Names(namespace)


@dataclasses.dataclass
class Builds:
    """An app whose task report.build records the jobs it runs."""

    app: App
    ran: list[str] = dataclasses.field(default_factory=list)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        @self.app.task(LATER)
        def build(payload: Released, job: JobContext) -> None:
            self.ran.append(job.job_id)
            self.done.set()

    def worker(self, broker: Broker) -> WorkerThread:
        return WorkerThread(Worker(broker.url, self.app, MemoryStore(), WorkerSettings()))


def test_reroute_sends_on_the_jobs_whose_task_has_a_queue_now_and_keeps_the_rest_in_order(
    broker: Broker,
    namespace: str,
    ladder: Names,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    connection: pika.BlockingConnection,
) -> None:
    names = ladder
    path = tmp_path / "topology.toml"
    channel = confirm_channel(connection)
    first = publish_delayed(channel, namespace, NOBODY, 1.5)
    later = publish_delayed(channel, namespace, LATER, 1.5)
    second = publish_delayed(channel, namespace, NOBODY, 1.5)
    wait_for_depth(connection, names.unroutable_queue, 3, within=10)
    stray = pika.BasicProperties(message_id="stray", delivery_mode=2)
    channel.basic_publish(names.unroutable_exchange, "not.from.the.ladder", b"{}", stray)
    # The task is declared since (or its binding is back after a broker restart).
    cleanup_topology(write_topology(path, namespace, DECLARED, LATER))
    assert topology("apply", "--url", broker.url, "--file", str(path)).exit_code == 0

    reroute = ["jobs", "reroute", "--url", broker.url, "--namespace", namespace]
    result = CliRunner().invoke(main, [*reroute, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "queue": names.unroutable_queue,
        "moved": 1,
        "kept": 3,
        "moved_by_key": {LATER: 1},
        "kept_by_key": {"": 1, NOBODY: 2},
    }
    method, got, body = connection.channel().basic_get(names.task_queue(LATER), auto_ack=True)
    assert method is not None
    assert got is not None
    assert got.headers is not None
    assert body is not None
    assert json.loads(body) == {"task": LATER}
    for field in ("message_id", "type", "content_type", "delivery_mode", "timestamp"):
        assert getattr(got, field) == getattr(later, field), field
    # The job's own headers as sent, without the ladder's x-death (the task queue
    # adds its own x-delivery-count).
    assert "x-death" not in got.headers
    assert {k: v for k, v in got.headers.items() if not k.startswith("x-")} == later.headers

    again = CliRunner().invoke(main, reroute)
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines() == [
        f"sent on 0 jobs from {names.unroutable_queue} to their task queues",
        "kept 1 message that did not come out of the delay ladder (no task in its routing"
        " key): read or purge them with rabbitmqctl or the management UI",
        f"kept 2 jobs for {NOBODY}: no queue is bound for it; declare the task"
        " (broker-jobs topology apply) and run this again",
    ]
    kept = []
    while (found := connection.channel().basic_get(names.unroutable_queue, auto_ack=True))[0]:
        kept.append(found[1].message_id)
    assert kept == [first.message_id, second.message_id, "stray"]


def test_reroute_needs_a_namespace_and_finds_nothing_where_no_queue_is(broker: Broker) -> None:
    missing = CliRunner().invoke(main, ["jobs", "reroute", "--url", broker.url])
    assert missing.exit_code == 2
    assert "no namespace given: add --app MODULE:APP, or --namespace NS" in missing.output
    fresh = f"t{uuid.uuid4().hex[:10]}"  # nothing declared: nothing to send on
    result = CliRunner().invoke(
        main, ["jobs", "reroute", "--url", broker.url, "--namespace", fresh, "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["moved"] == 0
    said = CliRunner().invoke(main, ["jobs", "reroute", "--url", broker.url, "--namespace", fresh])
    assert said.stdout == f"nothing waits in {fresh}.unroutable\n"


def test_a_worker_sends_on_the_delayed_jobs_it_finds_unroutable_when_it_connects(
    broker: Broker,
    namespace: str,
    ladder: Names,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As after a broker restart that released a job before its queue's binding was
    back: the job waits in ``<ns>.unroutable`` while its task has a queue."""
    names = ladder
    sent = publish_delayed(confirm_channel(connection), namespace, LATER, 1.5)
    wait_for_depth(connection, names.unroutable_queue, 1, within=10)
    builds = Builds(make_app())
    caplog.set_level(logging.INFO, logger="broker_jobs.worker.rerouting")
    running = builds.worker(broker)
    try:
        assert builds.done.wait(30), "the job in the unroutable queue never ran"
    finally:
        outcomes = running.stop()
    assert builds.ran == [sent.message_id]
    assert outcomes["succeeded"] == 1
    assert depth(connection, names.unroutable_queue) == 0
    said = [r.getMessage() for r in caplog.records if r.name.endswith("rerouting")]
    assert [line.split(":")[0] for line in said] == [
        f"sent on 1 delayed job from {names.unroutable_queue} to their task queues ({LATER}"
    ]


def test_a_connected_worker_looks_again_and_sends_on_what_arrived_since(
    broker: Broker,
    ladder: Names,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node of a cluster can restart under a worker that keeps its connection: the
    worker's looks (every 60 s; here 0.2) find the job all the same."""
    monkeypatch.setattr(rerouting, "LOOK_EVERY", 0.2)
    names = ladder
    builds = Builds(make_app())
    running = builds.worker(broker)
    try:
        wait_until(lambda: running.worker.connected_to, within=30, what="the worker connected")
        # What the ladder's end puts there when the binding is missing.
        properties = pika.BasicProperties(
            message_id="misrouted",
            type=LATER,
            content_type="application/json",
            delivery_mode=2,
            headers={"bj-wire-version": 1},
        )
        connection.channel().basic_publish(
            names.unroutable_exchange, delay_routing_key(0, LATER), b'{"task": "x"}', properties
        )
        assert builds.done.wait(30), "the worker never sent the job on"
    finally:
        outcomes = running.stop()
    assert builds.ran == ["misrouted"]
    assert outcomes["succeeded"] == 1
    assert depth(connection, names.unroutable_queue) == 0


def test_a_stopping_worker_lets_a_look_it_cancelled_finish_its_cleanup(
    broker: Broker, ladder: Names, make_app: Callable[[], App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look cancelled by the worker's stop may still be closing its channel (a
    broker round trip). The worker waits for it, briefly, before its loop ends: left
    pending, the task was destroyed with an ERROR at the process's exit (seen under
    load: "Task was destroyed but it is pending!")."""
    monkeypatch.setattr(rerouting, "LOOK_EVERY", 0.05)
    looking, cleaned_up = threading.Event(), threading.Event()

    async def depth_with_a_slow_cleanup(self: rerouting.Rerouting, _connection: object) -> int:
        if asyncio.current_task() is self._pass:  # the connection's pass: nothing waits
            return 0
        try:
            looking.set()
            await asyncio.sleep(3600)  # cancelled by the worker's stop
        finally:
            await asyncio.sleep(0.5)  # as a channel's close waits for the broker
            cleaned_up.set()
        return 0

    monkeypatch.setattr(rerouting.Rerouting, "_depth", depth_with_a_slow_cleanup)
    running = Builds(make_app()).worker(broker)
    try:
        assert looking.wait(30), "the worker never looked"
    finally:
        running.stop()
    assert cleaned_up.is_set(), "the worker's loop ended with the look still cleaning up"
