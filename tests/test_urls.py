"""Broker URLs: validation, masking (credentials never leave the process), and
several nodes: parsing lists, and clients connecting to the first node that answers
and, after a loss, to the others first.

Failover needs no cluster: a URL of a closed port stands for a node that is down,
and a TCP relay to the test broker for a node whose connections the test cuts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pika
import pytest
from pydantic import BaseModel
from yarl import URL

from broker_jobs import App, BrokerConnectionError, ConfigurationError, mask_url
from broker_jobs.amqp.connecting import Connection, connect_first, connect_first_blocking
from broker_jobs.amqp.declaring import declare_at_start, existing_queues
from broker_jobs.errors import BrokerUnreachableError
from broker_jobs.publish.publisher import Publisher
from broker_jobs.urls import BrokerURL, BrokerURLs, mask_text
from scheduler.leadership import Leadership
from tests.support import AnyPublisher, AsyncFacade, Broker, drain

MakePublisher = Callable[..., AnyPublisher]


class Resize(BaseModel):
    url: str
    width: int


def test_mask_url_hides_only_the_password() -> None:
    assert mask_url("amqp://app:s3cr3t@rabbit:5672/prod") == "amqp://app:***@rabbit:5672/prod"
    assert mask_url("amqps://app:p%40ss@rabbit/") == "amqps://app:***@rabbit/"
    assert mask_url("amqp://rabbit/") == "amqp://rabbit/"


def test_mask_text_hides_passwords_inside_messages() -> None:
    text = "failed: amqp://u:pw@h:1/v and amqps://x:y@z/"
    assert mask_text(text) == "failed: amqp://u:***@h:1/v and amqps://x:***@z/"


def test_broker_url_parts_and_masked_repr() -> None:
    url = BrokerURL("amqp://app:s3cr3t@rabbit:5673/prod%2Fa")
    assert (url.host, url.port, url.vhost) == ("rabbit", 5673, "prod/a")
    assert BrokerURL("amqps://h/").port == 5671
    assert BrokerURL("amqp://h").vhost == "/"
    assert "s3cr3t" not in repr(url)
    assert "s3cr3t" not in str(url)


@pytest.mark.parametrize(
    "bad",
    [
        "http://u:secret@h/",
        "rabbit:5672",
        "amqp://u:secret@/vhost",
        "amqp://u:secret@h:port/",
        # not split as a URL with a host, each once shown whole
        "u:secret@h",
        "amqp//u:secret@h/",
        "amqp:/u:secret@h/",
        "amqp://u:top/secret@h/",
        "amqp://u:secret@[::1/",  # urlsplit raises: once a traceback
    ],
)
def test_bad_urls_are_refused_masked(bad: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        BrokerURL(bad)
    assert "secret" not in str(caught.value)


# -- several URLs: parsing -------------------------------------------------------------


def test_several_urls_from_commas_and_sequences_in_order() -> None:
    urls = BrokerURLs.parse("amqp://u:p@mq1/, amqps://u:p@mq2/ ,AMQP://u:p@mq3:5673/v")
    assert [(url.host, url.port) for url in urls] == [("mq1", 5672), ("mq2", 5671), ("mq3", 5673)]
    assert BrokerURLs.parse(["amqp://a/,amqp://b/", BrokerURL("amqp://c/")]) == BrokerURLs.parse(
        "amqp://a/,amqp://b/,amqp://c/"
    )
    assert BrokerURLs.parse(urls) is urls
    assert BrokerURLs.parse(",amqp://a/, ,").urls == (BrokerURL("amqp://a/"),)


def test_a_single_url_is_taken_whole_commas_and_all() -> None:
    (url,) = BrokerURLs.parse("amqp://u:p@h/a,b")
    assert url.vhost == "a,b"
    # A comma splits only before the next scheme: a password's comma stays in it
    # (and its pieces never reach an error unmasked); %2C is the safe spelling.
    (url,) = BrokerURLs.parse("amqp://u:se,cret@h/")
    assert url.masked == "amqp://u:***@h/"
    (url,) = BrokerURLs.parse("amqp://u:se%2Ccret@h/")
    assert url.masked == "amqp://u:***@h/"


def test_masked_lists_hide_every_password() -> None:
    urls = BrokerURLs.parse("amqp://u:hunter2@mq1/,amqp://u:swordfish@mq2/")
    for text in (str(urls), repr(urls), urls.masked):
        assert "hunter2" not in text
        assert "swordfish" not in text
    assert urls.masked == "amqp://u:***@mq1/, amqp://u:***@mq2/"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "no broker URL given"),
        (" , ", "no broker URL given"),
        ([], "no broker URL given"),
        ("amqp://u:secret@mq1,mq2/", "a host cannot contain a comma"),
        ("amqp://u:secret@mq1/,http://u:secret@mq2/", "holds another URL after its host"),
        ("amqp://u:secret@mq1/,xamqp://u:secret@mq2/", "holds another URL after its host"),
        ("amqp://u:secret@mq1/, amqp://u:secret@:1/", "names no host"),
        ([None], "must be a string, not NoneType"),
    ],
)
def test_empty_or_invalid_lists_are_refused_clearly(value: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        BrokerURLs.parse(value)  # type: ignore[arg-type]
    assert "secret" not in str(caught.value)


def test_the_order_after_a_loss_and_for_a_second_connection() -> None:
    a, b, c = urls = BrokerURLs.parse("amqp://a/,amqp://b/,amqp://c/")
    assert urls.after(None) == (a, b, c)
    assert urls.after(b) == (c, a, b)
    assert urls.starting_at(b).urls == (b, c, a)
    assert urls.starting_at(None) is urls
    assert urls.starting_at(BrokerURL("amqp://elsewhere/")) is urls


# -- several URLs: connecting ------------------------------------------------------------


def closed_port() -> int:
    """A port nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def on_port(url: str, port: int, password: str | None = None) -> str:
    """``url`` with its host and port replaced by 127.0.0.1:``port``."""
    parts = urlsplit(url)
    user = parts.username or "guest"
    secret = password if password is not None else parts.password or "guest"
    return urlunsplit(parts._replace(netloc=f"{user}:{secret}@127.0.0.1:{port}"))


class Relay:
    """A TCP relay to the test broker: a second "node" the test can cut off (every
    relayed connection dropped at once) and bring back on the same port."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self.accepted = 0
        self.port = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self.listen()

    def url(self, url: str) -> str:
        return on_port(url, self.port)

    def listen(self) -> None:
        self._stopping.clear()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._spawn(self._accept, self._listener)

    def cut(self) -> None:
        """Close the listener and every relayed connection; wait for the threads."""
        self._stopping.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()
        for sock in sockets:
            sock.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target)
            except OSError:  # the broker is down: so is this "node"
                client.close()
                continue
            client.settimeout(None)
            with self._lock:
                self.accepted += 1
                self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def relay(broker: Broker) -> Iterator[Relay]:
    made = Relay(broker.url)
    yield made
    made.cut()


def test_no_node_answering_names_every_node_masked() -> None:
    first, second = closed_port(), closed_port()
    urls = [
        f"amqp://app:hunter2@127.0.0.1:{first}/",
        f"amqp://app:hunter2@127.0.0.1:{second}/",
    ]
    errors = []
    with pytest.raises(BrokerConnectionError) as caught:
        connect_first_blocking(urls, timeout=3, connection_name="test")
    errors.append(str(caught.value))
    with pytest.raises(BrokerConnectionError) as caught:
        asyncio.run(connect_first(urls, timeout=3, connection_name="test"))
    errors.append(str(caught.value))
    for message in errors:
        assert message.startswith(f"cannot connect to the broker at 127.0.0.1:{first} (")
        assert f"; 127.0.0.1:{second} (amqp://app:***@127.0.0.1:{second}/): " in message
        assert "hunter2" not in message


@pytest.mark.parametrize(
    ("connection_class", "warns"), [(aio_pika.Connection, True), (Connection, False)]
)
def test_an_unclosed_connection_collected_in_another_thread_warns_nothing(
    connection_class: type[aio_pika.Connection], warns: bool
) -> None:
    """aio-pika's own connection is the control: its ``__del__`` makes a close
    coroutine that no loop in the collecting thread awaits (what users saw after a
    broker restart); the connection every client here uses does not."""

    async def unclosed() -> aio_pika.Connection:
        return connection_class(URL(f"amqp://guest:guest@127.0.0.1:{closed_port()}/"))

    loop = asyncio.new_event_loop()
    try:
        held = [loop.run_until_complete(unclosed())]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            collector = threading.Thread(target=held.clear)  # the last reference goes there
            collector.start()
            collector.join()
            gc.collect()  # the unawaited coroutine, if one was made, warns when it is freed
    finally:
        loop.close()
    unawaited = [str(w.message) for w in caught if "was never awaited" in str(w.message)]
    assert bool(unawaited) is warns, unawaited


@pytest.mark.broker
def test_blocking_and_async_connects_skip_a_node_that_does_not_answer(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    down = on_port(broker.url, closed_port(), password="hunter2")
    connection, node = connect_first_blocking(
        [down, broker.url], timeout=3, connection_name="test blocking failover"
    )
    connection.close()
    assert node == BrokerURL(broker.url)

    async def connect() -> BrokerURL:
        connection, node = await connect_first(
            f"{down},{broker.url}", timeout=3, connection_name="test async failover"
        )
        await connection.close()
        return node

    assert asyncio.run(connect()) == BrokerURL(broker.url)
    skipped = [r.getMessage() for r in caplog.records if "no answer from" in r.getMessage()]
    assert len(skipped) == 2
    assert all("hunter2" not in line and ":***@" in line for line in skipped)


@pytest.mark.broker
def test_declaring_goes_to_the_first_node_that_answers(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    app = make_app()
    app.declare("image.resize", Resize)
    urls = BrokerURLs.parse([on_port(broker.url, closed_port()), broker.url])
    asyncio.run(declare_at_start(urls, app.topology(), "test declare"))
    queue = app.names.task_queue("image.resize")
    assert existing_queues(urls, [queue, "no-such-queue"], connection_name="test") == [queue]


@pytest.mark.broker
def test_publishers_skip_a_node_that_does_not_answer(
    broker: Broker, make_app: Callable[[], App], make_publisher: MakePublisher
) -> None:
    app = make_app()
    app.declare("image.resize", Resize)
    down = on_port(broker.url, closed_port())
    publisher = make_publisher(app, url=[down, broker.url])
    first = publisher.publish("image.resize", Resize(url="a", width=1))
    # A delayed job: the delay ladder is declared and its task's queue checked, on
    # the node the publisher is connected to.
    later = publisher.publish("image.resize", Resize(url="b", width=2), delay=30)
    assert later.due_at is not None
    with contextlib.closing(broker.connection("test check")) as connection:
        assert drain(connection, app.names.task_queue("image.resize")) == [first]


@pytest.mark.broker
def test_after_a_lost_connection_publishers_try_the_other_node_first(
    broker: Broker, make_app: Callable[[], App], make_publisher: MakePublisher, relay: Relay
) -> None:
    app = make_app()
    app.declare("image.resize", Resize)
    publisher = make_publisher(app, url=f"{relay.url(broker.url)},{broker.url}")
    before = publisher.publish("image.resize", Resize(url="a", width=1))
    assert relay.accepted >= 1, "the first publish goes through the first node"
    relay.cut()  # the node is lost...
    relay.listen()  # ...and back at once: the next connection still tries the other first
    accepted = relay.accepted
    after = publisher.publish("image.resize", Resize(url="b", width=2))
    assert relay.accepted == accepted
    with contextlib.closing(broker.connection("test check")) as connection:
        stored = drain(connection, app.names.task_queue("image.resize"))
    assert {job.id for job in stored} == {before.id, after.id}


@pytest.mark.broker
def test_a_beat_session_goes_to_the_other_node_after_a_loss(
    broker: Broker, namespace: str, relay: Relay, connection: pika.BlockingConnection
) -> None:
    first, second = BrokerURL(relay.url(broker.url)), BrokerURL(broker.url)

    async def run() -> None:
        leadership = Leadership([first.url, second.url], namespace, "test-failover", heartbeat=2)
        await leadership.start()
        try:
            assert await leadership.wait_until_leader(10)
            assert leadership.node == first
            relay.cut()
            relay.listen()
            accepted = relay.accepted
            deadline = time.monotonic() + 10
            while not (leadership.node == second and leadership.is_leader()):
                assert time.monotonic() < deadline, "no new session on the other node"
                await asyncio.sleep(0.02)  # polling: the session ends in the background
            assert relay.accepted == accepted
        finally:
            await leadership.stop()
            connection.channel().queue_delete(leadership.queue)
            connection.channel().exchange_delete(leadership.queue)

    asyncio.run(run())


@pytest.mark.broker
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_connection_errors_tell_a_refused_port_a_refused_login_and_a_missing_vhost(
    broker: Broker, kind: str
) -> None:
    """One line each, the cause an operator fixes, no password; no retry for them."""
    good = BrokerURL(broker.url)
    host = f"{good.host}:{good.port}"
    cases = {
        "amqp://guest:guest@127.0.0.1:1/": "connection refused: nothing listens there",
        f"amqp://guest:wrong-pw@{host}/": "login refused for user 'guest' (ACCESS_REFUSED)",
        f"amqp://guest:guest@{host}/no-such-vhost": "the broker refused the vhost 'no-such-vhost'",
    }

    def publish_once(url: str) -> None:
        publisher: AnyPublisher = (Publisher if kind == "sync" else AsyncFacade)(
            url, None, namespace="t", declare=False
        )
        try:
            publisher.publish("a.b", {})
        finally:
            publisher.close()

    for url, expected in cases.items():
        with pytest.raises(BrokerUnreachableError) as raised:
            publish_once(url)
        assert expected in str(raised.value), str(raised.value)
        assert "wrong-pw" not in str(raised.value)


def test_masks_hold_on_long_passwords_and_long_lines_without_any() -> None:
    """Masking runs on every log line, with text from messages in it (keys, errors):
    its patterns are bounded and anchored, so a long line costs linear time
    (``python -m bench.masking``), and a long password is masked still."""
    from broker_jobs.store.values import mask_dsn  # noqa: PLC0415

    secret = "p" * 1000
    assert secret not in mask_url(f"amqp://u:{secret}@h/")
    assert secret not in mask_text(f"error at amqp://u:{secret}@h/ now")
    assert secret not in mask_dsn(f"postgresql://u:{secret}@h/db")
    assert secret not in mask_url(f"u:{secret}@h")  # the loose form
    for line in ("a" * 40_000, "a:" * 20_000, "amqp://u:" * 5_000, "x://a:" * 8_000):
        assert mask_text(line) == line
        assert mask_dsn(line) == line


@pytest.mark.parametrize(
    "url",
    [
        "amqp://u:s3cr3t/pw@h/",  # an unescaped / in the password
        "amqp://u:s3cr#et@h/",
        "amqp://u:s3cr",  # the part before a space of BROKER_JOBS_URL's password
        "amqp://u:pw@h/, sec:s3cr3t@h2/",  # the second URL of a list without its scheme
    ],
)
def test_a_url_that_does_not_parse_says_why_without_any_of_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        BrokerURLs.parse(url)
    assert "s3cr" not in str(caught.value)
    assert "%" in str(caught.value) or "amqp://" in str(caught.value)


def test_masks_cover_lists_any_case_and_libpq_passphrases() -> None:
    from broker_jobs.store.values import mask_dsn  # noqa: PLC0415

    assert mask_url("amqp://u:p1@h1/,amqp://u:p2@h2/") == "amqp://u:***@h1/,amqp://u:***@h2/"
    assert mask_text("lost AMQP://user:pw@host/ now") == "lost AMQP://user:***@host/ now"
    assert "s3cret" not in mask_dsn("postgresql://u:p@h/db?sslpassword=s3cret")
    assert "s3cret" not in mask_dsn("host=h sslpassword=s3cret")
    with pytest.raises(ConfigurationError) as caught:
        BrokerURLs.parse("amqp://user:s3c ret@[::1/")
    assert "s3c" not in str(caught.value)
