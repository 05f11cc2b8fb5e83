"""The worker through broker faults, injected for real: the node killed (kill -9) or
stopped and started again, the network cut for longer than the heartbeat, the
broker away at SIGTERM or for longer than --reconnect-timeout, the task queue
deleted, and (marked ``cluster``) the node of a 3-node cluster that the worker is
connected to killed. Workers are never restarted here: they recover by themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest
from pydantic import BaseModel

from broker_jobs import App, JobRequest, Publisher
from broker_jobs.retry import RetryPolicy
from broker_jobs.store.base import Status
from broker_jobs.store.memory import MemoryStore
from broker_jobs.testing.rabbit_cluster import RabbitCluster
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.testing.tcp_proxy import TcpProxy
from broker_jobs.worker import Worker, WorkerSettings
from broker_jobs.worker.stop_signals import SAME_STOP, Asked, StopSignals
from tests.support import Broker, wait_until
from tests.test_worker import EffectsDatabase
from topology import Topology

pytestmark = [pytest.mark.broker, pytest.mark.also_on_rabbitmq_4]  # every broker test: on 4.0 too


class Add(BaseModel):
    key: str


# -- workers as an operator runs them: the CLI, in processes of their own ------------------


class WorkerProcess:
    """``broker-jobs worker`` in a process of its own; its log is collected as it comes."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        command = [sys.executable, "-c", "from broker_jobs.cli import main; main()", "worker"]
        self.process = subprocess.Popen(
            [*command, *args], cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        self._log: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        with self.process.stderr:
            for line in self.process.stderr:
                self._log.append(line)

    @property
    def log(self) -> str:
        return "".join(self._log)

    def logged(self, text: str, *, within: float) -> None:
        wait_until(lambda: text in self.log, within=within, what=f"the worker logging {text!r}")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code (after the log is read to its end)."""
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
        self.process.wait()
        self._reader.join(5)


StartWorker = Callable[[list[str], Path], WorkerProcess]


@contextlib.contextmanager
def starting_worker_processes(
    after_kill: Callable[[WorkerProcess], None] | None = None,
) -> Iterator[StartWorker]:
    """Start ``broker-jobs worker`` processes (``args`` in ``cwd``); each is killed on
    leaving, then given to ``after_kill`` for what outlives it."""
    started: list[WorkerProcess] = []

    def start(args: list[str], cwd: Path) -> WorkerProcess:
        worker = WorkerProcess(args, cwd)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()
        if after_kill is not None:
            after_kill(worker)


@pytest.fixture
def worker_processes() -> Iterator[StartWorker]:
    with starting_worker_processes() as start:
        yield start


def write_app(tmp_path: Path, namespace: str, body: str) -> Path:
    """An app module ``recovery_app`` in ``tmp_path``, for worker processes."""
    header = f"""
        from pydantic import BaseModel
        from broker_jobs import App

        class Add(BaseModel):
            key: str

        app = App(namespace={namespace!r})
    """
    (tmp_path / "recovery_app.py").write_text(textwrap.dedent(header) + textwrap.dedent(body))
    return tmp_path


def declared_app(namespace: str, cleanup: Callable[[Topology], Topology]) -> App:
    """The same app as the worker processes run, for publishing and cleaning up."""
    app = App(namespace=namespace)
    app.declare("counter.add", Add)
    cleanup(app.topology())
    return app


def no_tracebacks(worker: WorkerProcess) -> None:
    assert "Traceback" not in worker.log, worker.log[-3000:]


# -- kill -9 and graceful stop of the node, two workers, effects exactly once ---------------


@pytest.mark.fault
@pytest.mark.parametrize("fault", ["kill -9", "rabbitmqctl stop"])
# On 4.0 the harsher fault only: a graceful stop differs from it in what the workers
# hear (connection.close, not a reset), which 3.10 checks as well.
@pytest.mark.on_rabbitmq_4_with(fault="kill -9")
@pytest.mark.long
def test_two_workers_drain_through_a_broker_restart_each_effect_exactly_once(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    worker_processes: Callable[[list[str], Path], WorkerProcess],
    request: pytest.FixtureRequest,
    fault: str,
) -> None:
    node = broker.controllable()
    database = EffectsDatabase("postgres", tmp_path, request)
    # Jobs after the first 300 wait for this file, which the test writes once the
    # node is down: the fault lands mid-drain however fast the machine drains.
    gate = tmp_path / "fault-injected"
    write_app(
        tmp_path,
        namespace,
        f"""
        import pathlib, time

        @app.task("counter.add", transactional=True)
        def add(payload: Add, db) -> None:
            while int(payload.key[1:]) >= 300 and not pathlib.Path({str(gate)!r}).exists():
                time.sleep(0.01)
            db.execute("INSERT INTO {database.table} (key) VALUES (%s)", (payload.key,))
        """,
    )
    app = declared_app(namespace, cleanup_topology)
    keys = [f"k{n}" for n in range(600)]
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest("counter.add", {"key": key}) for key in keys])
    args = ["--url", broker.url, "recovery_app:app", "--store", database.store_url]
    workers = [worker_processes([*args, "--concurrency", "4"], tmp_path) for _ in range(2)]

    def effects() -> int:
        return int(database.execute(f"SELECT COUNT(*) FROM {database.table}")[0][0])

    # Both consuming before the fault, or a slow starter meets a dead node instead of
    # losing a live one (CI saw the first worker run 200 jobs before the second began).
    for worker in workers:
        worker.logged("consuming", within=60)
    wait_until(lambda: effects() >= 200, within=60, what="200 jobs run before the fault")
    try:
        if fault == "kill -9":
            node.kill()
        else:
            node.stop()
        run_before_restart = effects()
    finally:
        gate.touch()
        node.start()
    assert run_before_restart < len(keys), "the workers finished before the fault"
    wait_until(lambda: effects() >= len(keys), within=180, what="every job run after the fault")
    for worker in workers:
        assert worker.alive, worker.log[-3000:]
        worker.logged("lost the broker", within=1)
        worker.logged("broker link back", within=1)
    rows = database.execute(f"SELECT key, COUNT(*) FROM {database.table} GROUP BY key")
    counts = {str(key): int(count) for key, count in rows}
    assert sorted(counts) == sorted(keys), "an effect is missing"
    assert set(counts.values()) == {1}, "an effect happened twice"
    with broker.connection("test recovery check") as connection:
        queue = app.names.task_queue("counter.add")
        wait_until(
            lambda: (
                connection.channel().queue_declare(queue, passive=True).method.message_count == 0
            ),
            within=30,
            what="the task queue empty",
        )
    for worker in workers:
        assert worker.stop() == 0, worker.log[-3000:]
        no_tracebacks(worker)


# -- in-process workers, for faults that leave the broker running -------------------------


class WorkerThread:
    """A :class:`Worker` on an event loop of its own thread (stopped like SIGTERM)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.outcomes: Counter[str] | None = None
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.outcomes = self._loop.run_until_complete(self.worker.run())
        except BaseException as error:  # the test looks at it
            self.error = error
        finally:
            self._loop.close()

    def stop(self, timeout: float = 60) -> Counter[str]:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.worker.stop)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error
        assert self.outcomes is not None
        return self.outcomes


class Effects:
    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self._lock = threading.Lock()

    def record(self, key: str) -> None:
        with self._lock:
            self.runs[key] += 1


def counting_app(make_app: Callable[[], App], effects: Effects) -> App:
    app = make_app()

    @app.task("counter.add", time_limit=30)
    def add(payload: Add) -> None:
        effects.record(payload.key)

    return app


def test_a_network_cut_longer_than_the_heartbeat_is_noticed_and_healed(
    broker: Broker, make_app: Callable[[], App], caplog: pytest.LogCaptureFixture
) -> None:
    effects = Effects()
    app = counting_app(make_app, effects)
    keys = [f"k{n}" for n in range(600)]
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest("counter.add", {"key": key}) for key in keys[:300]])
    with TcpProxy(f"{broker.url}?heartbeat=1") as proxy:
        settings = WorkerSettings(concurrency=4, lease=5)
        running = WorkerThread(Worker(proxy.url, app, MemoryStore(), settings))
        wait_until(lambda: len(effects.runs) >= 50, within=30, what="50 jobs run")
        proxy.cut()
        wait_until(
            lambda: running.worker.connected_to is None,
            within=30,
            what="the worker noticing the cut (missed heartbeats)",
        )
        with Publisher(broker.url, app) as publisher:  # while cut: not through the proxy
            publisher.publish_many([JobRequest("counter.add", {"key": key}) for key in keys[300:]])
        proxy.heal()
        wait_until(lambda: len(effects.runs) == len(keys), within=60, what="every job run")
        outcomes = running.stop()
    assert set(effects.runs) == set(keys)
    assert set(effects.runs.values()) == {1}, "a job ran twice"
    assert outcomes["succeeded"] == len(keys)
    # The cause is said in words, not as the driver's bare CancelledError.
    lost = [r.getMessage() for r in caplog.records if "lost the broker" in r.getMessage()]
    assert lost, caplog.text
    assert any("no frame from the broker" in line for line in lost), lost
    assert not any("CancelledError" in line for line in lost), lost


@pytest.fixture
def idle_app(
    namespace: str, tmp_path: Path, cleanup_topology: Callable[[Topology], Topology]
) -> App:
    """An app whose worker processes wait for jobs that never come."""
    write_app(tmp_path, namespace, '@app.task("counter.add")\ndef add(payload: Add) -> None: ...\n')
    return declared_app(namespace, cleanup_topology)


def consuming_worker(
    worker_processes: Callable[[list[str], Path], WorkerProcess],
    url: str,
    tmp_path: Path,
    *options: str,
) -> WorkerProcess:
    args = ["--url", url, "recovery_app:app", "--store", "memory://", *options]
    worker = worker_processes(args, tmp_path)
    worker.logged("consuming", within=30)
    return worker


def test_a_retry_published_when_the_link_drops_is_confirmed_on_the_next_connection(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    """The handler fails while the connection is gone: the next attempt is published
    on the new connection, the lost delivery's copy is a duplicate, the job runs
    twice in all (the failure and the retry) and is recorded succeeded."""
    runs: list[int] = []
    started, release = threading.Event(), threading.Event()
    app = make_app()
    quick = RetryPolicy(max_attempts=3, base_delay=0.2, max_delay=0.2, jitter=False)

    @app.task("counter.add", retry=quick, time_limit=30)
    def add(payload: Add) -> None:
        runs.append(len(runs) + 1)
        if len(runs) == 1:
            started.set()
            release.wait(30)
            raise ConnectionError("the first run fails")

    store = MemoryStore()
    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("counter.add", {"key": "flaky"})
    with TcpProxy(broker.url) as proxy:
        running = WorkerThread(Worker(proxy.url, app, store, WorkerSettings(lease=5)))
        assert started.wait(30), "the job did not start"
        proxy.drop()  # the worker's and its publisher's connections reset
        wait_until(
            lambda: running.worker.outcomes["link-lost"] >= 1, within=10, what="the loss noticed"
        )
        release.set()
        wait_until(lambda: len(runs) == 2, within=30, what="the retry run")
        wait_until(
            lambda: store.get(job.idempotency_key).status is Status.SUCCEEDED,  # type: ignore[union-attr]
            within=10,
            what="the retry recorded",
        )
        wait_until(
            lambda: running.worker.outcomes["duplicate"] >= 1,
            within=30,
            what="the lost delivery's copy answered as a duplicate",
        )
        outcomes = running.stop()
    assert runs == [1, 2], "the failed attempt ran again"
    assert outcomes["retried"] == 1
    assert outcomes["ack-lost"] == 1, "the failed delivery's ack was not tried on the new channel"


def test_sigterm_while_the_broker_is_away_stops_the_worker_at_once_with_exit_0(
    broker: Broker,
    idle_app: App,
    tmp_path: Path,
    worker_processes: Callable[[list[str], Path], WorkerProcess],
) -> None:
    with TcpProxy(broker.url) as proxy:
        worker = consuming_worker(worker_processes, proxy.url, tmp_path)
        proxy.stop()  # the broker is away: connections closed, nobody listening
        worker.logged("lost the broker", within=10)
        assert worker.alive
        assert worker.stop(timeout=10) == 0, worker.log[-3000:]
    no_tracebacks(worker)


def test_a_sigterm_delivered_twice_is_one_stop_and_the_running_job_finishes(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    worker_processes: Callable[[list[str], Path], WorkerProcess],
) -> None:
    """``timeout`` passes a SIGTERM on to its command, then to the command's process
    group: the worker got it twice, 7 ms apart (``timeout 15 broker-jobs worker``).
    One graceful stop (the running job finishes), not "second signal: exiting now".
    (Through ``timeout`` itself the two often arrive before the first is handled and
    the kernel merges them: sent here one after the other, as in the walk.)"""
    started, release = tmp_path / "started", tmp_path / "release"
    write_app(
        tmp_path,
        namespace,
        f"""
        import pathlib, time

        @app.task("counter.add", time_limit=60)
        def add(payload: Add) -> None:
            pathlib.Path({str(started)!r}).touch()
            while not pathlib.Path({str(release)!r}).exists():  # until the test says
                time.sleep(0.01)
        """,
    )
    app = declared_app(namespace, cleanup_topology)
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest("counter.add", {"key": k}) for k in ("a", "b")])
    args = ["--url", broker.url, "--concurrency", "1", "recovery_app:app"]
    worker = worker_processes(args, tmp_path)
    wait_until(started.exists, within=30, what="the first job started")
    worker.process.send_signal(signal.SIGTERM)
    worker.logged("stopping: finishing running jobs", within=10)
    worker.process.send_signal(signal.SIGTERM)  # the group's copy
    worker.logged("SIGTERM again at once", within=10)
    assert worker.alive
    release.touch()
    assert worker.process.wait(30) == 0, worker.log[-3000:]
    assert "second signal" not in worker.log, worker.log[-3000:]
    with broker.connection("test timeout") as connection:
        queue = app.names.task_queue("counter.add")
        depth = connection.channel().queue_declare(queue, passive=True).method.message_count
    assert depth == 1  # the first job was acked; the second never started


def test_a_worker_without_a_broker_for_its_reconnect_timeout_exits_75(
    broker: Broker,
    idle_app: App,
    tmp_path: Path,
    worker_processes: Callable[[list[str], Path], WorkerProcess],
) -> None:
    with TcpProxy(broker.url) as proxy:
        worker = consuming_worker(worker_processes, proxy.url, tmp_path, "--reconnect-timeout", "1")
        proxy.stop()
        code = worker.process.wait(20)
    worker.stop()
    assert code == 75, worker.log[-3000:]
    assert "--reconnect-timeout 1" in worker.log
    no_tracebacks(worker)


def test_a_worker_whose_queue_is_deleted_says_so_and_exits_69(
    broker: Broker,
    idle_app: App,
    tmp_path: Path,
    worker_processes: Callable[[list[str], Path], WorkerProcess],
    connection: pika.BlockingConnection,
) -> None:
    worker = consuming_worker(worker_processes, broker.url, tmp_path)
    connection.channel().queue_delete(idle_app.names.task_queue("counter.add"))
    code = worker.process.wait(20)
    worker.stop()
    assert code == 69, worker.log[-3000:]
    assert "cancelled the consumer" in worker.log
    no_tracebacks(worker)


# -- a cluster: the worker's node dies, the worker moves on --------------------------------


@pytest.mark.cluster
def test_a_worker_moves_to_a_live_node_when_its_node_is_killed(
    rabbit_cluster: RabbitCluster,
) -> None:
    effects = Effects()
    app = App(namespace=f"t{uuid.uuid4().hex[:10]}")

    @app.task("counter.add", time_limit=30)
    def add(payload: Add) -> None:
        effects.record(payload.key)

    keys = [f"k{n}" for n in range(1000)]
    urls = rabbit_cluster.urls
    with Publisher(urls, app) as publisher:
        publisher.publish_many([JobRequest("counter.add", {"key": key}) for key in keys])
    running = WorkerThread(Worker(urls, app, MemoryStore(), WorkerSettings(concurrency=4, lease=5)))
    first = wait_until(lambda: running.worker.connected_to, within=60, what="the worker consuming")
    wait_until(lambda: len(effects.runs) >= 100, within=60, what="100 jobs run")
    victim: RabbitNode = next(node for node in rabbit_cluster.nodes if node.url == first.url)
    try:
        victim.kill()
        wait_until(
            lambda: (url := running.worker.connected_to) is not None and url != first,
            within=60,
            what="the worker consuming from another node",
        )
        assert len(effects.runs) < len(keys), "drained before the kill; nothing tested"
        wait_until(lambda: len(effects.runs) == len(keys), within=120, what="every job run")
        running.stop()
    finally:
        rabbit_cluster.start()  # the killed node rejoins, for the tests after this one
    assert set(effects.runs.values()) == {1}, "a job ran twice"


def test_what_each_stop_signal_asks() -> None:
    """A SIGTERM again within SAME_STOP is the same request; later, or a SIGINT (a
    person pressing Ctrl-C again), exits at once."""
    twice = StopSignals()
    assert twice.take(signal.SIGTERM, 100.0) is Asked.STOP
    assert twice.take(signal.SIGTERM, 100.007) is Asked.AGAIN
    assert twice.take(signal.SIGTERM, 100.0 + SAME_STOP) is Asked.EXIT
    ctrl_c = StopSignals()
    assert ctrl_c.take(signal.SIGINT, 5.0) is Asked.STOP
    assert ctrl_c.take(signal.SIGINT, 5.2) is Asked.EXIT
    mixed = StopSignals()
    assert mixed.take(signal.SIGTERM, 5.0) is Asked.STOP
    assert mixed.take(signal.SIGINT, 5.1) is Asked.EXIT
