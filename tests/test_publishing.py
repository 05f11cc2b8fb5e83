"""Both publishers against a real broker: confirmed, mandatory, validated, reported.

Each test runs once with the sync (pika) and once with the async (aio-pika)
publisher, through the ``make_publisher`` fixture: same calls, same outcomes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from pydantic import BaseModel

from broker_jobs import (
    App,
    AsyncPublisher,
    BrokerConnectionError,
    BrokerJobsError,
    BrokerUnreachableError,
    JobError,
    JobRequest,
    MessageTooLargeError,
    PayloadEncodingError,
    PayloadValidationError,
    PublishBatchError,
    Publisher,
    TopologyMissingError,
    UnknownTaskError,
    UnroutableError,
)
from broker_jobs.store.base import Status, Store
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.store.urls import open_store
from tests.support import AnyPublisher, Broker, drain
from topology import declare

pytestmark = pytest.mark.broker

MakePublisher = Callable[..., AnyPublisher]


class Resize(BaseModel):
    url: str
    width: int


@pytest.fixture
def app(make_app: Callable[[], App]) -> App:
    app = make_app()
    app.declare("image.resize", Resize)
    return app


def test_a_typed_job_reaches_its_queue_intact(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    publisher = make_publisher(app)
    job = publisher.publish(
        "image.resize",
        Resize(url="https://example.com/a.png", width=128),
        idempotency_key="invoice-42-thumb",
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    assert drain(connection, app.names.task_queue("image.resize")) == [job]
    assert job.payload == {"url": "https://example.com/a.png", "width": 128}
    assert job.idempotency_key == "invoice-42-thumb"


def test_a_dict_payload_is_validated_and_coerced_by_the_model(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    job = make_publisher(app).publish("image.resize", {"url": "u", "width": "64"})
    assert job.payload == {"url": "u", "width": 64}
    assert drain(connection, app.names.task_queue("image.resize")) == [job]


def test_a_service_knowing_only_the_task_name_publishes_a_plain_dict(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology(ladder=False))  # declared by the operator or the worker's side
    untyped = make_publisher(namespace=app.namespace)
    job = untyped.publish("image.resize", {"anything": ["goes", 1]}, job_id="my-id")
    assert job.id == "my-id"
    assert drain(connection, app.names.task_queue("image.resize")) == [job]


def test_unknown_task_and_invalid_payloads_are_refused_before_sending(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology(ladder=False))
    publisher = make_publisher(app)
    with pytest.raises(UnknownTaskError, match=r"'image\.crop'.*image\.resize"):
        publisher.publish("image.crop", {"url": "u", "width": 1})
    with pytest.raises(PayloadValidationError, match="width"):
        publisher.publish("image.resize", {"url": "u", "width": "wide"})
    with pytest.raises(PayloadValidationError, match="url"):
        publisher.publish("image.resize", {"width": 3})
    assert drain(connection, app.names.task_queue("image.resize")) == []


class Loose(BaseModel):
    data: dict[str, Any]


def test_a_message_larger_than_the_broker_takes_and_unserialisable_models_fail_before_sending(
    make_publisher: MakePublisher, make_app: Callable[[], App]
) -> None:
    app = make_app()
    app.declare("blob.keep", Loose)
    with socket.socket() as probe:  # a port nothing listens on: nothing may connect
        probe.bind(("127.0.0.1", 0))
        nowhere = f"amqp://guest:guest@127.0.0.1:{probe.getsockname()[1]}/"
    publisher = make_publisher(app, url=nowhere, max_message_bytes=1000)
    with pytest.raises(MessageTooLargeError, match=r"2,0\d\d bytes, more than the 1,000"):
        publisher.publish("blob.keep", {"data": {"x": "y" * 2000}})
    with pytest.raises(PayloadEncodingError, match="JSON"):
        publisher.publish("blob.keep", {"data": {"b": b"\xff\xfe"}})  # not UTF-8
    with pytest.raises(PayloadEncodingError, match="JSON"):
        publisher.publish("blob.keep", {"data": {"o": object()}})
    assert isinstance(MessageTooLargeError("t", 2, 1), JobError)


@pytest.mark.parametrize(
    "payload",
    [{"when": datetime.now(UTC)}, {"tags": {"a", "b"}}, {"ratio": math.nan}, {"o": object()}],
)
def test_payloads_that_are_not_json_are_refused(
    make_publisher: MakePublisher, namespace: str, payload: dict[object, object]
) -> None:
    publisher = make_publisher(namespace=namespace)
    with pytest.raises(PayloadEncodingError, match="JSON"):
        publisher.publish("image.resize", payload)


def test_an_unroutable_task_is_an_error_naming_task_and_queue(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology(ladder=False))
    publisher = make_publisher(namespace=app.namespace)
    with pytest.raises(UnroutableError) as caught:
        publisher.publish("image.rotate", {"degrees": 90})
    message = str(caught.value)
    assert "'image.rotate'" in message
    assert f"'{app.namespace}.task.image.rotate'" in message
    # A level the task has no queue for (a publisher without the app cannot know):
    # the queue named is that level's, with what to do.
    with pytest.raises(UnroutableError) as caught:
        publisher.publish("image.resize", {"url": "u", "width": 1}, priority="high")
    message = str(caught.value)
    assert f"'{app.namespace}.task.image.resize@high'" in message
    assert "needs the task declared with priorities" in message
    # The connection stays usable: the next routable publish is confirmed.
    job = publisher.publish("image.resize", {"url": "u", "width": 1})
    assert drain(connection, app.names.task_queue("image.resize")) == [job]


def test_a_missing_exchange_with_declare_off_says_to_declare_the_topology(
    make_publisher: MakePublisher, namespace: str
) -> None:
    publisher = make_publisher(namespace=namespace, declare=False)
    for _ in range(2):  # and the publisher recovers for the next call
        with pytest.raises(TopologyMissingError, match=r"no exchange .*topology does not exist"):
            publisher.publish("image.resize", {})


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_broker_down_at_connect_names_host_and_port_and_hides_the_password(
    make_publisher: MakePublisher, namespace: str
) -> None:
    port = _closed_port()
    publisher = make_publisher(
        url=f"amqp://app:hunter2@127.0.0.1:{port}/", namespace=namespace, connect_timeout=3
    )
    with pytest.raises(BrokerConnectionError) as caught:
        publisher.publish("image.resize", {})
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert "hunter2" not in message
    assert "app:***@" in message
    assert "hunter2" not in repr(publisher.inner if hasattr(publisher, "inner") else publisher)


def test_publish_many_confirms_every_job_and_reports_each(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    seen: list[str] = []
    requests = [
        JobRequest("image.resize", {"url": f"u{i}", "width": i}, idempotency_key=f"k{i}")
        for i in range(2500)
    ]
    jobs = make_publisher(app).publish_many(requests, on_confirmed=lambda job: seen.append(job.id))
    assert len(jobs) == 2500
    assert sorted(seen) == sorted(job.id for job in jobs)
    stored = drain(connection, app.names.task_queue("image.resize"))
    assert sorted(job.idempotency_key for job in stored) == sorted(f"k{i}" for i in range(2500))


def test_publish_many_validates_everything_before_sending_anything(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology(ladder=False))
    publisher = make_publisher(app)
    good = JobRequest("image.resize", {"url": "u", "width": 1})
    with pytest.raises(PayloadValidationError):
        publisher.publish_many([good, JobRequest("image.resize", {"url": "u"})])
    with pytest.raises(JobError, match="same id"):
        publisher.publish_many(
            [
                JobRequest("image.resize", {"url": "u", "width": 1}, job_id="dup"),
                JobRequest("image.resize", {"url": "v", "width": 2}, job_id="dup"),
            ]
        )
    assert drain(connection, app.names.task_queue("image.resize")) == []


def test_publish_many_reports_unroutable_jobs_and_confirms_the_rest(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology(ladder=False))
    publisher = make_publisher(namespace=app.namespace)
    routable = JobRequest("image.resize", {"url": "u", "width": 1}, job_id="routable")
    lost = JobRequest("image.rotate", {"degrees": 90}, job_id="unroutable")
    with pytest.raises(PublishBatchError) as caught:
        publisher.publish_many([routable, lost])
    assert caught.value.confirmed == ["routable"]
    assert isinstance(caught.value.failed["unroutable"], UnroutableError)
    assert [job.id for job in drain(connection, app.names.task_queue("image.resize"))] == [
        "routable"
    ]


def test_one_sync_publisher_shared_by_threads(
    app: App, broker: Broker, connection: pika.BlockingConnection
) -> None:
    errors: list[BaseException] = []
    ids: list[str] = []
    with Publisher(broker.url, app, connection_name="test shared publisher") as publisher:

        def work(thread: int) -> None:
            try:
                for i in range(50):
                    job = publisher.publish("image.resize", {"url": f"{thread}", "width": i})
                    ids.append(job.id)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    stored = drain(connection, app.names.task_queue("image.resize"))
    assert sorted(job.id for job in stored) == sorted(ids)
    assert len(set(ids)) == 400


def test_a_message_goes_to_the_socket_as_one_buffer_at_once(broker: Broker, app: App) -> None:
    """Method, header and body frames go to the socket as one buffer, inside the
    publish call: one send(2) per publish instead of three, and no writability
    watcher turned on and off (``pika_link._OneWriteConnection``, which relies on
    pika's ``_output_marshaled_frames`` and its transport's internals: this fails if
    pika changes them)."""
    from broker_jobs.envelope import Job, encode  # noqa: PLC0415
    from broker_jobs.publish.pika_link import PikaLink  # noqa: PLC0415
    from broker_jobs.urls import BrokerURL  # noqa: PLC0415

    link = PikaLink(BrokerURL(broker.url), connect_timeout=10, connection_name="test")
    try:
        connection = link._connection
        transport = connection._transport  # type: ignore[attr-defined]
        watchers = transport._nbio._watchers[transport._sock.fileno()]
        frames_before, bytes_before = connection.frames_sent, connection.bytes_sent
        message = encode(Job(task="greet.hello", payload={"name": "x"}))
        link.publish("", "nowhere.at.all", message)
        assert connection.frames_sent == frames_before + 3
        assert connection.bytes_sent > bytes_before + len(message.body)
        assert not transport._tx_buffers  # sent, not buffered for the loop
        assert watchers.writer is None  # no writability watcher was needed
    finally:
        link.close()


def test_confirms_are_read_without_pikas_loop_and_its_timers_still_run(
    broker: Broker, namespace: str, connection: pika.BlockingConnection, monkeypatch: Any
) -> None:
    """A link waiting for confirms reads the socket itself and takes a buffer of
    ``basic.ack`` frames in one step (``_OneWriteConnection.read_directly``,
    ``take_acks``): pika's frame decoder never runs for them. This fails if pika's
    internals that it relies on change (the transport's socket and state, the loop's
    timer). The loop's timers (pika's heartbeat) still run while it waits."""
    import pika.frame  # noqa: PLC0415

    from broker_jobs.envelope import Job, encode  # noqa: PLC0415
    from broker_jobs.publish.pika_link import PikaLink  # noqa: PLC0415
    from broker_jobs.urls import BrokerURL  # noqa: PLC0415

    queue = f"{namespace}.direct-read"
    connection.channel().queue_declare(queue, durable=True)
    link = PikaLink(BrokerURL(broker.url), connect_timeout=10, connection_name="test")
    decoded: list[object] = []
    pika_decode = pika.frame.decode_frame
    monkeypatch.setattr(
        pika.frame, "decode_frame", lambda data: decoded.append(data) or pika_decode(data)
    )
    timer_ran = threading.Event()
    try:
        link._connection.ioloop.call_later(0, timer_ran.set)
        deliveries = [link.publish("", queue, encode(Job(task="greet.hello"))) for _ in range(5)]
        assert link.wait(lambda: all(d.settled for d in deliveries), 10.0)
        assert [d.acked for d in deliveries] == [True] * 5
        assert decoded == []  # every confirm was read directly
        assert timer_ran.is_set()
    finally:
        link.close()


def test_a_nack_of_the_broker_still_reaches_the_link(
    broker: Broker, namespace: str, connection: pika.BlockingConnection
) -> None:
    """A ``basic.nack`` (a full queue that rejects publishes) is not an ack: pika's
    decoder takes it, and the delivery is settled as nacked, not acked."""
    from broker_jobs.envelope import Job, encode  # noqa: PLC0415
    from broker_jobs.publish.pika_link import PikaLink  # noqa: PLC0415
    from broker_jobs.urls import BrokerURL  # noqa: PLC0415

    queue = f"{namespace}.full"
    arguments = {"x-max-length": 1, "x-overflow": "reject-publish"}
    connection.channel().queue_declare(queue, durable=True, arguments=arguments)
    link = PikaLink(BrokerURL(broker.url), connect_timeout=10, connection_name="test")
    try:
        deliveries = [link.publish("", queue, encode(Job(task="greet.hello"))) for _ in range(3)]
        assert link.wait(lambda: all(d.settled for d in deliveries), 10.0)
        assert [(d.acked, d.nacked) for d in deliveries] == [
            (True, False),
            (False, True),
            (False, True),
        ]
    finally:
        link.close()


def test_a_link_keeps_the_first_reason_it_closed_for(broker: Broker, namespace: str) -> None:
    """A publish to a missing exchange closes the channel (404), and the link then
    closes its connection: the connection's "normal shutdown", which may be read in
    the same turn as the 404, must not replace it (a publisher would report a lost
    connection instead of a missing topology)."""
    from pika.exceptions import ChannelClosedByBroker  # noqa: PLC0415

    from broker_jobs.envelope import Job, encode  # noqa: PLC0415
    from broker_jobs.publish.pika_link import PikaLink  # noqa: PLC0415
    from broker_jobs.urls import BrokerURL  # noqa: PLC0415

    link = PikaLink(BrokerURL(broker.url), connect_timeout=10, connection_name="test")
    try:
        delivery = link.publish(f"{namespace}.missing", "x", encode(Job(task="greet.hello")))
        assert not link.wait(lambda: delivery.settled, 10.0)
    finally:
        link.close()  # reads the connection's close-ok
    reason = link.closed_reason
    assert isinstance(reason, ChannelClosedByBroker)
    assert reason.reply_code == 404


def test_connect_opens_the_connection_before_any_publish_and_says_when_it_cannot(
    app: App, make_publisher: MakePublisher, connection: pika.BlockingConnection
) -> None:
    publisher = make_publisher(app)
    publisher.connect()  # declares the topology too, as the first publish would
    connection.channel().queue_declare(app.names.task_queue("image.resize"), passive=True)
    publisher.connect()  # open already: nothing happens
    publisher.publish("image.resize", Resize(url="u", width=1))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens there once closed
    unreachable = make_publisher(app, url=f"amqp://guest:secret@127.0.0.1:{port}/")
    with pytest.raises(BrokerUnreachableError) as caught:
        unreachable.connect()
    assert "secret" not in str(caught.value)


def test_a_cancelled_async_publish_still_completes_and_spares_the_others(
    broker: Broker, app: App, connection: pika.BlockingConnection
) -> None:
    """A caller that stops waiting (a request's timeout, a client gone) does not cancel
    the send under aiormq: cancelling a confirm's future as the broker returns the
    message broke the channel's reader, and every publish in flight timed out."""
    declare(connection, app.topology(ladder=False))
    lost = make_app_like(app, "image.lost")  # declared in the app, without a queue

    async def cancel_some() -> tuple[list[object], BaseException | None]:
        async with AsyncPublisher(broker.url, lost, declare=False, confirm_timeout=5) as publisher:
            first = asyncio.create_task(publisher.publish("image.resize", Resize(url="a", width=1)))
            await asyncio.sleep(0)  # it is connecting: cancel it there
            first.cancel()
            cancelled = None
            try:
                await first
            except asyncio.CancelledError as error:
                cancelled = error
            impatient = [
                asyncio.wait_for(publisher.publish("image.lost", {"url": "x", "width": n}), 0.002)
                for n in range(150)
            ]
            patient = [
                publisher.publish("image.resize", Resize(url="b", width=n)) for n in range(50)
            ]
            outcomes = await asyncio.gather(*impatient, *patient, return_exceptions=True)
            return outcomes[150:], cancelled

    kept, cancelled = asyncio.run(cancel_some())
    assert isinstance(cancelled, asyncio.CancelledError)
    assert all(not isinstance(outcome, BaseException) for outcome in kept), kept
    stored = drain(connection, app.names.task_queue("image.resize"))
    # The cancelled first publish went on to its end: stored, with the 50 others.
    assert sorted(job.payload["url"] for job in stored) == ["a"] + ["b"] * 50


def make_app_like(app: App, extra: str) -> App:
    """An app of ``app``'s namespace and tasks, plus ``extra`` (no queue declared)."""
    like = App(namespace=app.namespace)
    like.declare("image.resize", Resize)
    like.declare(extra, Resize)
    return like


def test_a_publish_whose_resend_finds_no_broker_says_its_outcome_is_unknown(
    app: App,
) -> None:
    """The first send went out and its connection broke before the confirm; the
    resend found no node: the job may be stored, and the caller must hear that."""

    class BrokenThenGone(Publisher):
        sends = 0

        def _send_one(self, prepared: Any) -> BrokerJobsError | None:
            self.sends += 1
            if self.sends == 1:
                return BrokerConnectionError("the connection broke: its outcome is unknown")
            return BrokerUnreachableError("no node answered")

    publisher = BrokenThenGone("amqp://guest:guest@127.0.0.1:1/", app, declare=False)
    with pytest.raises(BrokerConnectionError, match="outcome is unknown") as caught:
        publisher.publish("image.resize", Resize(url="u", width=1))
    assert not isinstance(caught.value, BrokerUnreachableError)
    assert isinstance(caught.value.__cause__, BrokerUnreachableError)
    assert publisher.sends == 2


def test_close_under_publishes_leaves_no_connection_and_only_the_librarys_errors(
    broker: Broker, app: App, connection: pika.BlockingConnection
) -> None:
    """close() while publishes connect or wait for confirms: each returns its job or
    raises a BrokerJobsError (aiormq's bare Exception of a closing connection once
    leaked), and no connection outlives close() (one opened by a publish under way
    did)."""
    declare(connection, app.topology(ladder=False))

    async def round_trip(pause: float, connect_first: bool) -> tuple[list[object], bool]:
        publisher = AsyncPublisher(broker.url, app, declare=False)
        if connect_first:
            await publisher.connect()
        sending = [
            asyncio.create_task(publisher.publish("image.resize", Resize(url="u", width=n)))
            for n in range(20)
        ]
        await asyncio.sleep(pause)
        await publisher.close()
        outcomes = await asyncio.gather(*sending, return_exceptions=True)
        left_open = publisher._connection is not None
        await publisher.close()
        return outcomes, left_open

    async def rounds() -> list[tuple[list[object], bool]]:
        return [
            await round_trip(pause / 1000, connect_first)
            for pause in range(0, 12, 2)
            for connect_first in (False, True)
        ]

    for outcomes, left_open in asyncio.run(rounds()):
        assert not left_open
        wrong = [
            o
            for o in outcomes
            if isinstance(o, BaseException) and not isinstance(o, BrokerJobsError)
        ]
        assert wrong == [], wrong


@pytest.mark.parametrize("ledger", [None, "sqlite", "postgres"])
def test_a_sync_publisher_used_in_a_forked_child_opens_its_own_connections(
    app: App,
    broker: Broker,
    connection: pika.BlockingConnection,
    ledger: str | None,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """A publisher connected before a fork (gunicorn's ``--preload``, a module-level
    publisher) must not use the parent's sockets from the child: the child's frames
    broke the parent's AMQP connection (its epoll is shared too), and with a
    PostgreSQL ledger the two processes read each other's replies (the parent hung).
    The child opens connections of its own; the parent's stay usable."""
    store: Store | None = None
    if ledger == "sqlite":
        store = SQLiteStore(tmp_path / "ledger.db")
    elif ledger == "postgres":
        store = open_store(request.getfixturevalue("postgres_dsn"))
    sides = ("before", "child 1", "child 2", "beside 1", "beside 2", "after")
    keys = {side: [f"fork-{uuid.uuid4().hex}-{n}" for n in range(6)] for side in sides}

    def publish(publisher: Publisher, side: str) -> list[str]:
        # Six each: psycopg prepares a statement after five runs, on its session.
        return [
            publisher.publish("image.resize", {"url": side, "width": n}, idempotency_key=key).id
            for n, key in enumerate(keys[side])
        ]

    def in_a_child(publisher: Publisher, side: str) -> int:
        """Publish from a forked child; its exit code (never returns into pytest)."""
        child = os.fork()
        if child == 0:
            code = 1
            try:
                publish(publisher, side)
                publisher.close()
                code = 0
            finally:
                os._exit(code)
        return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])

    with Publisher(broker.url, app, ledger=store, connection_name="test forked") as publisher:
        before = publish(publisher, "before")
        # Threads of the parent publish while it forks (a web server's): with a
        # PostgreSQL ledger the parent hung in 3 runs of 3 before the stores' hooks.
        beside = [
            threading.Thread(target=publish, args=(publisher, side), daemon=True)
            for side in ("beside 1", "beside 2")
        ]
        for thread in beside:
            thread.start()
        codes = [in_a_child(publisher, "child 1"), in_a_child(publisher, "child 2")]
        for thread in beside:
            thread.join(60)
        hung = [thread.name for thread in beside if thread.is_alive()]
        after = publish(publisher, "after")
    assert (codes, hung) == ([0, 0], [])
    stored = drain(connection, app.names.task_queue("image.resize"))
    expected = sorted(side for side in sides for _ in range(6))
    assert sorted(job.payload["url"] for job in stored) == expected
    assert {*before, *after} <= {job.id for job in stored}
    if store is not None:
        with store:
            records = [store.get(key) for side in sides for key in keys[side]]
        assert [r.status if r else None for r in records] == [Status.QUEUED] * len(expected)


def test_a_failed_connect_leaves_the_drivers_lines_out_of_the_users_log(
    app: App,
    make_publisher: MakePublisher,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the broker down, every publish fails to connect: pika logged ten lines an
    attempt (seven at ERROR) and aiormq one ERROR, into the publishing service's
    own log. The error names the node and why; the drivers' lines above DEBUG are
    dropped while our connect runs, and kept for a connect of the user's own."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens there once closed
    url = f"amqp://guest:secret@127.0.0.1:{port}/"
    publisher = make_publisher(app, url=url)
    # A user's logging as it comes: not a daemon's (configure_logging, which another
    # test of this process may have run, demotes the drivers' lines on its handler).
    monkeypatch.setattr(logging.getLogger(), "handlers", [caplog.handler])
    for name in ("", "pika", "aiormq"):
        caplog.set_level(logging.DEBUG, logger=name)
    for _ in range(3):
        with pytest.raises(BrokerUnreachableError, match="connection refused"):
            publisher.publish("image.resize", Resize(url="u", width=1))
    drivers = [r for r in caplog.records if r.name.startswith(("pika", "aiormq", "aio_pika"))]
    assert [r.getMessage() for r in drivers if r.levelno > logging.DEBUG] == []
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.URLParameters(url))  # the user's own connect
    assert any(r.name.startswith("pika") and r.levelno == logging.ERROR for r in caplog.records)


def test_a_connection_the_broker_dropped_is_said_once_without_the_drivers_lines(
    broker: Broker,
    app: App,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection reset under an idle publisher (a broker restart, a heartbeat
    missed while idle): its next publish reconnects and succeeds, and the user's log
    has our one WARNING, not pika's ~30 lines and two tracebacks at ERROR (a tester
    counted 64 lines for two idle spells). pika's lines are dropped while our link
    turns its loop or closes (amqp/driver_logs.py)."""
    from broker_jobs.testing.tcp_proxy import TcpProxy  # noqa: PLC0415

    monkeypatch.setattr(logging.getLogger(), "handlers", [caplog.handler])
    for name in ("", "pika"):
        caplog.set_level(logging.DEBUG, logger=name)
    with TcpProxy(broker.url) as proxy:
        publisher = Publisher(proxy.url, app)  # the sync one: pika's
        publisher.publish("image.resize", Resize(url="before", width=1))
        caplog.clear()
        proxy.drop()  # an RST to the publisher's socket
        job = publisher.publish("image.resize", Resize(url="after", width=1))
        publisher.close()
    drivers = [r for r in caplog.records if r.name.startswith("pika")]
    assert [r.getMessage() for r in drivers if r.levelno > logging.DEBUG] == []
    ours = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("broker_jobs") and r.levelno >= logging.WARNING
    ]
    assert [line for line in ours if "reconnecting" in line] == [ours[0]], ours
    assert "Connection reset by peer" in ours[0] or "closed" in ours[0]
    assert job.payload == {"url": "after", "width": 1}
