"""Fixtures: one real RabbitMQ per session, a fresh namespace per test.

The broker is found in this order: an AMQP URL in ``BROKER_JOBS_TEST_AMQP_URL``; a
RabbitMQ container through testcontainers when a Docker engine answers; otherwise a
throwaway node started from the installed ``rabbitmq-server`` (or, with
``BROKER_JOBS_TEST_RABBITMQ_ROOT``, from the one in that root: RabbitMQ 4.0 in a Debian 13
tree made by ``scripts/rabbitmq-root``, run under chroot). Without any of them,
broker tests skip locally and fail in CI (``CI`` set), so CI cannot pass vacuously.
With ``BROKER_JOBS_TEST_RABBITMQ_4_ROOT`` set to such a tree, the broker tests of
the tests marked :data:`ALSO_ON_RABBITMQ_4` run on that RabbitMQ as well, in the same session (each
process starts a node of either release when a test first asks for it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Generic, TypeVar

import pika
import pika.exceptions
import pytest

from broker_jobs import App, Publisher
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.testing.postgres_node import PostgresNode
from broker_jobs.testing.rabbit_cluster import RabbitCluster
from broker_jobs.testing.rabbit_node import RabbitNode
from tests.support import AnyPublisher, AsyncFacade, Broker, docker_answers, unavailable

# The three stores under one parametrised fixture (``kit``, ``store``), for every test
# module that takes part with a store.
from tests.test_store import kit, make_store, pg_schema, store  # noqa: F401
from topology import Topology

URL_VARIABLE = "BROKER_JOBS_TEST_AMQP_URL"
POSTGRES_URL_VARIABLE = "BROKER_JOBS_TEST_POSTGRES_URL"
ROOT_VARIABLE = "BROKER_JOBS_TEST_RABBITMQ_ROOT"
T = TypeVar("T")


#: The marker of the broker tests that also run on RabbitMQ 4.0 when
#: ``BROKER_JOBS_TEST_RABBITMQ_4_ROOT`` names a root holding one (scripts/test sets it):
#: a subset that covers topology, the delay ladder, retries and dead letters, crash
#: loops, beat's election, recovery from broker faults and the cluster, each test
#: once on each release, side by side in one session. The rest run on the host's
#: RabbitMQ only: what they check does not differ between releases.
ALSO_ON_RABBITMQ_4 = "also_on_rabbitmq_4"
#: Marks a test of :data:`ALSO_ON_RABBITMQ_4` that runs on 4.0 with only some of its
#: parameters' values (``_a_variant_left_to_rabbitmq_3``).
ON_RABBITMQ_4_WITH = "on_rabbitmq_4_with"
RABBITMQ_4_ROOT_VARIABLE = "BROKER_JOBS_TEST_RABBITMQ_4_ROOT"


def rabbitmq_root() -> str | None:
    """The root of the RabbitMQ the throwaway nodes run from (None: the host's)."""
    return os.environ.get(ROOT_VARIABLE) or None


def rabbitmq_release_name(root: str | None) -> str:
    """``rabbitmq-<version>`` of the rabbitmq-server installed under ``root`` (the
    host's for None), for test ids."""
    found = sorted(Path(root or "/").glob("usr/lib/rabbitmq/lib/rabbitmq_server-*"))
    return "rabbitmq-" + (found[-1].name.partition("-")[2] if found else "unknown")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The tests marked :data:`ALSO_ON_RABBITMQ_4` run on both releases."""
    also = os.environ.get(RABBITMQ_4_ROOT_VARIABLE)
    if not also or metafunc.definition.get_closest_marker(ALSO_ON_RABBITMQ_4) is None:
        return
    if "rabbitmq_release" in metafunc.fixturenames:
        roots = [rabbitmq_root(), also]
        metafunc.parametrize(
            "rabbitmq_release", roots, ids=[rabbitmq_release_name(r) for r in roots], indirect=True
        )


@pytest.fixture
def rabbitmq_release(request: pytest.FixtureRequest) -> str | None:
    """The root of the RabbitMQ this test's broker runs from (None: the host's);
    parametrised by :func:`pytest_generate_tests`."""
    return getattr(request, "param", rabbitmq_root())


class PerRelease(Generic[T]):
    """Servers of the session, one per RabbitMQ root, made when first asked for (a
    failure to make one is kept and raised to each test that asks again, as a
    session fixture's is), removed at the session's end."""

    def __init__(self, make: Callable[[str | None], AbstractContextManager[T]]) -> None:
        self._make = make
        self._made: dict[str | None, T] = {}
        self._failed: dict[str | None, BaseException] = {}
        self._stack = contextlib.ExitStack()

    def get(self, root: str | None) -> T:
        if root in self._failed:
            raise self._failed[root]
        if root not in self._made:
            try:
                self._made[root] = self._stack.enter_context(self._make(root))
            except (Exception, pytest.skip.Exception, pytest.fail.Exception) as error:
                self._failed[root] = error
                raise
        return self._made[root]

    def close(self) -> None:
        self._stack.close()


@contextlib.contextmanager
def session_broker(tmp_path_factory: pytest.TempPathFactory, root: str | None) -> Iterator[Broker]:
    """The broker of the session's tests on the RabbitMQ of ``root``: for the session's
    own release, an AMQP URL or a testcontainers node when there is one; else a
    throwaway node."""
    if root == rabbitmq_root():
        if url := os.environ.get(URL_VARIABLE):
            yield Broker(url)
            return
        if docker_answers():
            from testcontainers.rabbitmq import RabbitMqContainer  # noqa: PLC0415

            with RabbitMqContainer("rabbitmq:3.13") as container:
                params = container.get_connection_params()
                yield Broker(
                    f"amqp://guest:guest@{params.host}:{params.port}/", origin="testcontainers"
                )
            return
    if not RabbitNode.available(root):
        unavailable(
            f"no RabbitMQ: set {URL_VARIABLE}, start Docker, or apt-get install rabbitmq-server"
            + (f" (none in {root}: run scripts/rabbitmq-root)" if root else "")
        )
    node = RabbitNode.create(None if root else tmp_path_factory.mktemp("rabbit"), root=root)
    try:
        node.start()
        origin = f"throwaway node of {root}" if root else "throwaway node"
        yield Broker(node.url, node, origin=origin)
    finally:
        node.cleanup()


@pytest.fixture(scope="session")
def rabbit_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PerRelease[Broker]]:
    """The session's brokers, one per RabbitMQ release its tests ask for."""
    nodes = PerRelease(functools.partial(session_broker, tmp_path_factory))
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def broker(rabbit_nodes: PerRelease[Broker], rabbitmq_release: str | None) -> Broker:
    """The session's broker on the test's RabbitMQ release (started by the first test
    that asks; shared by the rest)."""
    return rabbit_nodes.get(rabbitmq_release)


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace of its own for each test, so tests share the broker, not objects."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def connection(broker: Broker, request: pytest.FixtureRequest) -> Iterator[pika.BlockingConnection]:
    """A blocking connection named after the test, for inspecting the broker."""
    conn = broker.connection(f"test {request.node.name}")
    yield conn
    with contextlib.suppress(pika.exceptions.AMQPError):
        conn.close()


@pytest.fixture
def cleanup_topology(broker: Broker) -> Iterator[Callable[[Topology], Topology]]:
    """Register a topology to delete after the test; returns it unchanged."""
    registered: list[Topology] = []
    yield lambda topology: registered.append(topology) or topology  # type: ignore[func-returns-value]
    if not registered:
        return
    try:
        conn = broker.connection("test cleanup")
    except pika.exceptions.AMQPError:
        return  # the broker is down after a fault test; the node is thrown away anyway
    with contextlib.closing(conn):
        for topology in registered:
            for queue in topology.queues:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    conn.channel().queue_delete(queue.name)
            for exchange in topology.exchanges:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    conn.channel().exchange_delete(exchange.name)


@pytest.fixture
def make_app(
    namespace: str, cleanup_topology: Callable[[Topology], Topology]
) -> Iterator[Callable[[], App]]:
    """A new app in the test's namespace whose broker objects are deleted afterwards."""
    apps: list[App] = []

    def make() -> App:
        app = App(namespace=namespace)
        apps.append(app)
        return app

    yield make
    for app in apps:
        cleanup_topology(app.topology())


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SQLiteStore]:
    """An SQLite ledger in the test's directory, for tests of one store's worth (a
    module whose tests run with every store defines ``ledger`` of its own)."""
    with SQLiteStore(str(tmp_path / "ledger.db")) as opened:
        yield opened


@pytest.fixture(params=["sync", "async"])
def make_publisher(
    request: pytest.FixtureRequest, broker: Broker
) -> Iterator[Callable[..., AnyPublisher]]:
    """Build publishers of the parametrised kind; closed after the test."""
    created: list[AnyPublisher] = []

    def make(app: App | None = None, *, url: str | None = None, **options: Any) -> AnyPublisher:
        kind = Publisher if request.param == "sync" else AsyncFacade
        options.setdefault("connection_name", f"test {request.node.name}")
        publisher = kind(url or broker.url, app, **options)
        created.append(publisher)
        return publisher

    yield make
    for publisher in created:
        publisher.close()


#: Seconds a test on the 3-node cluster may take (its forming included).
CLUSTER_TIMEOUT = 480

#: What ``--quick`` leaves out: tests on a real RabbitMQ or PostgreSQL, the browser.
SERVER_FIXTURES = frozenset({"broker", "postgres_dsn", "rabbit_cluster", "connection"})
SERVER_MARKERS = ("broker", "fault", "cluster")
QUICK_LEAVES_OUT_MODULES = frozenset({"test_dashboard_browser", "test_node_contract"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="the edit-test loop: only tests that need no RabbitMQ, PostgreSQL or browser",
    )


def needs_a_server(item: pytest.Item) -> bool:
    """Whether ``item`` needs RabbitMQ, PostgreSQL, Chromium or Node.js to run."""
    if any(item.get_closest_marker(marker) for marker in SERVER_MARKERS):
        return True
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "postgres" in callspec.id.split("-"):
        return True  # the store kits' PostgreSQL parameter
    return item.module is not None and item.module.__name__.rpartition(".")[2] in (
        QUICK_LEAVES_OUT_MODULES
    )


# First: xdist's own hook (on each worker) reads the xdist_group marks added here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--quick`` leaves out what needs a server. Fault tests stop or kill the shared
    broker: run them after everything else."""
    for item in items:  # under xdist (-n), one process runs them: one cluster, not one each
        if item.get_closest_marker("cluster"):
            callspec = getattr(item, "callspec", None)
            root = callspec.params.get("rabbitmq_release") if callspec else None
            item.add_marker(pytest.mark.xdist_group(f"cluster-{rabbitmq_release_name(root)}"))
            if item.get_closest_marker("timeout") is None:
                # Forming a cluster and each rabbitmqctl (an Erlang VM) take minutes
                # on a loaded machine: 120 s ran out with two CPU burners beside.
                item.add_marker(pytest.mark.timeout(CLUSTER_TIMEOUT))
    if config.getoption("quick"):
        _deselect(config, items, needs_a_server)
    _deselect(config, items, _a_second_publisher_on_rabbitmq_4)
    _deselect(config, items, _a_variant_left_to_rabbitmq_3)
    # Long tests first, so that none starts last and ends the run alone (processes
    # take tests in this order); fault tests last: they stop the process's broker.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("fault") is not None,
            item.get_closest_marker("long") is None and item.get_closest_marker("cluster") is None,
        )
    )


def _deselect(
    config: pytest.Config, items: list[pytest.Item], left_out: Callable[[pytest.Item], bool]
) -> None:
    """Leave out the ``items`` that ``left_out`` names (reported as deselected)."""
    dropped = [item for item in items if left_out(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not left_out(item)]


def _a_second_publisher_on_rabbitmq_4(item: pytest.Item) -> bool:
    """On RabbitMQ 4.0 a test of both publishers (``make_publisher``: sync, async) runs
    with the async one only: the broker sees the same AMQP from both, and what differs
    between them is our code, which the host's release checks for both. Measured: the
    sync variants were 18 CPU-s of the 4.0 runs' 177 (README, "RabbitMQ versions tested")."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or callspec.params.get("make_publisher") != "sync":
        return False
    return _on_rabbitmq_4(callspec)


def _a_variant_left_to_rabbitmq_3(item: pytest.Item) -> bool:
    """On RabbitMQ 4.0 a test marked ``on_rabbitmq_4_with(name=value, ...)`` runs only
    with those values of its parameters: its other variants differ in what our code
    does, not in what the broker does, and the host's release checks them."""
    marker = item.get_closest_marker(ON_RABBITMQ_4_WITH)
    callspec = getattr(item, "callspec", None)
    if marker is None or callspec is None or not _on_rabbitmq_4(callspec):
        return False
    return any(callspec.params.get(name) != value for name, value in marker.kwargs.items())


def _on_rabbitmq_4(callspec: Any) -> bool:
    release = callspec.params.get("rabbitmq_release")
    return release is not None and release == os.environ.get(RABBITMQ_4_ROOT_VARIABLE)


@pytest.fixture(scope="session")
def postgres_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if url := os.environ.get(POSTGRES_URL_VARIABLE):
        yield url
        return

    if docker_answers():
        try:
            from testcontainers.community.postgres import PostgresContainer  # noqa: PLC0415
        except ImportError:
            from testcontainers.postgres import PostgresContainer  # noqa: PLC0415

        with PostgresContainer("postgres:16-alpine", driver=None) as container:
            yield container.get_connection_url()
        return
    if not PostgresNode.available():
        unavailable(
            f"no PostgreSQL: set {POSTGRES_URL_VARIABLE}, start Docker, or"
            " apt-get install postgresql"
        )
    node = PostgresNode.create(tmp_path_factory.mktemp("postgres"))
    try:
        started = time.monotonic()
        node.start()
        print(
            f"\nthrowaway PostgreSQL on port {node.port} booted in"
            f" {time.monotonic() - started:.2f} s"
        )
        yield node.dsn
    finally:
        node.cleanup()


@contextlib.contextmanager
def session_cluster(
    tmp_path_factory: pytest.TempPathFactory, root: str | None
) -> Iterator[RabbitCluster]:
    """A 3-node cluster of throwaway nodes on the RabbitMQ of ``root``."""
    if not RabbitCluster.available(root):
        unavailable("no RabbitMQ cluster: apt-get install rabbitmq-server")
    base = None if root else tmp_path_factory.mktemp("rabbit-cluster")
    cluster = RabbitCluster.create(base, size=3, root=root)
    try:
        cluster.start()
        print(f"\nthrowaway 3-node RabbitMQ cluster formed in {cluster.started_in:.1f} s")
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture(scope="session")
def rabbit_clusters(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PerRelease[RabbitCluster]]:
    clusters = PerRelease(functools.partial(session_cluster, tmp_path_factory))
    try:
        yield clusters
    finally:
        clusters.close()


@pytest.fixture
def rabbit_cluster(
    rabbit_clusters: PerRelease[RabbitCluster], rabbitmq_release: str | None
) -> RabbitCluster:
    """A 3-node RabbitMQ cluster of throwaway nodes, for tests marked ``cluster``.

    Started the first time a test asks for it (~15-30 s here), shared by the rest of
    the session, stopped and removed at its end. Its nodes have names, ports and data
    dirs of their own, apart from the session's single ``broker`` node. A test that
    kills or stops nodes brings them back before it ends (``rabbit_cluster.start()``
    starts the nodes that are down and waits until all are running in the cluster).
    """
    return rabbit_clusters.get(rabbitmq_release)
