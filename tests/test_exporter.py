"""``broker-jobs exporter`` against a real broker and an SQLite ledger (docs/metrics.md,
"Exporter"): known depths published with the Publisher and pika, ledger records set
up through the Store API, the figures scraped over HTTP; a broker that is away."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_jobs import App, Job, Publisher
from broker_jobs.observe.heartbeat import process_record
from broker_jobs.store import SQLiteStore, Status
from broker_jobs.store.depths import HOUR
from broker_jobs.store.processes import ProcessKind, ProcessState
from broker_jobs.testing.tcp_proxy import TcpProxy
from tests.beat_app import TASK, Tick, build_app
from tests.support import Broker, wait_until
from tests.test_beat_metrics import Samples, metrics_port, probe, sample, scrape
from topology import Topology, declare

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parent.parent
OTHER = "beat.other"  # a second task, with a consumer and nothing waiting
READY, DEAD = 3, 2  # jobs published to TASK's queue and to its dead-letter queue
LEASE = 300.0


def exporter_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from broker_jobs.cli import main; main()", "exporter", *args]


class Exporters:
    """Exporter subprocesses, each logging to a file of its own; killed at the end."""

    def __init__(self, tmp_path: Path, namespace: str) -> None:
        self.tmp_path, self.namespace = tmp_path, namespace
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> int:
        """Start one serving on a free port; returns the port."""
        with (self.tmp_path / f"{name}.log").open("ab") as log:
            self.running[name] = subprocess.Popen(
                exporter_command("--metrics-port", "0", *args),
                cwd=REPO,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return metrics_port(lambda: self.log(name))

    def once(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            exporter_command("--once", *args),
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def env(self) -> dict[str, str]:
        return {**os.environ, "BROKER_JOBS_TEST_NAMESPACE": self.namespace}

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()

    def stop(self, name: str) -> None:
        process = self.running[name]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, self.log(name)

    def kill_all(self) -> None:
        for process in self.running.values():
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def exporters(tmp_path: Path, namespace: str) -> Iterator[Exporters]:
    made = Exporters(tmp_path, namespace)
    yield made
    made.kill_all()


@pytest.fixture
def app(
    namespace: str,
    connection: pika.BlockingConnection,
    cleanup_topology: Callable[[Topology], Topology],
) -> App:
    """The beat tests' app (TASK) and a second task, declared on the broker."""
    app = build_app(namespace)
    app.declare(OTHER, Tick)
    declare(connection, cleanup_topology(app.topology()))
    return app


@pytest.fixture
def filled(
    broker: Broker, connection: pika.BlockingConnection, app: App
) -> pika.adapters.blocking_connection.BlockingChannel:
    """TASK: READY jobs waiting (no consumer), DEAD dead letters, one delayed job in
    the ladder, one unroutable job; OTHER: a consumer. Returns the consumer's channel."""
    with Publisher(broker.url, app) as publisher:
        for number in range(READY):
            publisher.publish(TASK, {"label": f"job-{number}"})
        publisher.publish(TASK, {"label": "later"}, delay=120)
    channel = connection.channel()
    channel.confirm_delivery()  # each publish returns once the broker has it
    for _ in range(DEAD):
        channel.basic_publish(app.names.dead_letter_exchange, TASK, b"{}", mandatory=True)
    channel.basic_publish(app.names.unroutable_exchange, "", b"{}", mandatory=True)
    consumer = connection.channel()
    consumer.basic_consume(app.names.task_queue(OTHER), lambda *_: None)
    return consumer


def job(key: str, task: str = TASK) -> Job:
    return Job(id=f"id-{key}", task=task, idempotency_key=key)


def fill_ledger(path: Path, namespace: str) -> None:
    """TASK: 2 queued (the older 2 min ago), 1 running, 1 succeeded, 1 dead; a worker
    of ``namespace`` silent for 10 minutes (lost); TASK paused."""
    now = datetime.now(UTC)
    with SQLiteStore(path) as store:
        store.record_published([job("q1")], now=now - timedelta(seconds=120))
        store.record_published([job("q2")], now=now - timedelta(seconds=10))
        store.claim(job("r1"), "w1", LEASE)
        store.claim(job("ok1"), "w1", LEASE)
        store.succeed("ok1", "w1")
        store.claim(job("de1"), "w1", LEASE)
        store.dead("de1", "w1", "exhausted")
        silent = process_record(ProcessKind.WORKER, "w1", namespace, tasks=[TASK])
        store.record_process(replace(silent, seen_at=now - timedelta(minutes=10)))
        store.pause(namespace, TASK, "ops@test")


def closed_port_url() -> str:
    with socket.socket() as probe_socket:  # a port nothing listens on
        probe_socket.bind(("127.0.0.1", 0))
        return f"amqp://guest:guest@127.0.0.1:{probe_socket.getsockname()[1]}/"


def by_task(samples: Samples, name: str, namespace: str, task: str, **labels: str) -> float | None:
    return sample(samples, name, namespace=namespace, task=task, **labels)


# -- figures ---------------------------------------------------------------------------


def test_the_exporter_serves_the_depths_and_the_ledger_it_polled(
    broker: Broker,
    app: App,
    filled: pika.adapters.blocking_connection.BlockingChannel,
    exporters: Exporters,
    namespace: str,
    tmp_path: Path,
) -> None:
    consumer = filled
    ledger = tmp_path / "ledger.db"
    fill_ledger(ledger, namespace)
    port = exporters.start(
        "exporter",
        "--url", broker.url, "--namespace", namespace, "--task", TASK, "--task", OTHER,
        "--store", f"sqlite:///{ledger}", "--interval", "0.2",
    )  # fmt: skip
    wait_until(lambda: probe(port, "/readyz")[0] == 200, within=20, what="the first poll")
    assert probe(port, "/readyz") == (200, {"ok": True, "status": "polling"})
    assert probe(port, "/healthz")[0] == 200
    figures = scrape(port)

    assert sample(figures, "broker_jobs_exporter_up") == 1
    ready = "broker_jobs_queue_ready_messages"
    consumers = "broker_jobs_queue_consumers"
    dead = "broker_jobs_dead_letter_messages"
    assert by_task(figures, ready, namespace, TASK) == READY
    assert by_task(figures, consumers, namespace, TASK) == 0
    assert by_task(figures, dead, namespace, TASK) == DEAD
    assert by_task(figures, ready, namespace, OTHER) == 0
    assert by_task(figures, consumers, namespace, OTHER) == 1
    assert by_task(figures, dead, namespace, OTHER) == 0
    assert sample(figures, "broker_jobs_delay_ladder_messages", namespace=namespace) == 1
    assert sample(figures, "broker_jobs_unroutable_messages", namespace=namespace) == 1

    counts = {
        status.value: by_task(figures, "broker_jobs_ledger_jobs", namespace, TASK, state=status)
        for status in Status
    }
    assert counts == {
        "queued": 2,
        "scheduled": 0,
        "running": 1,
        "succeeded": 1,
        "retrying": 0,
        "failed": 0,
        "dead": 1,
        "cancelled": 0,
    }
    oldest = by_task(figures, "broker_jobs_oldest_waiting_seconds", namespace, TASK)
    assert oldest is not None
    assert 120 <= oldest < 180
    assert by_task(figures, "broker_jobs_oldest_waiting_seconds", namespace, OTHER) == 0
    assert by_task(figures, "broker_jobs_task_paused", namespace, TASK) == 1
    assert by_task(figures, "broker_jobs_task_paused", namespace, OTHER) == 0
    processes = {
        (kind, state): sample(
            figures, "broker_jobs_processes", namespace=namespace, kind=kind, state=state
        )
        for kind in ("worker", "exporter")
        for state in ("alive", "lost")
    }
    assert processes == {
        ("worker", "alive"): 0,
        ("worker", "lost"): 1,
        ("exporter", "alive"): 1,  # its own heartbeat
        ("exporter", "lost"): 0,
    }

    # The next polls follow the broker: one more job is counted.
    with Publisher(broker.url, app) as publisher:
        publisher.publish(TASK, {"label": "one more"})
    wait_until(
        lambda: by_task(scrape(port), ready, namespace, TASK) == READY + 1,
        within=10,
        what="a later poll counting the new job",
    )
    consumer.close()
    wait_until(
        lambda: by_task(scrape(port), consumers, namespace, OTHER) == 0,
        within=10,
        what="the consumer gone",
    )
    exporters.stop("exporter")
    with SQLiteStore(ledger) as store:
        states = {p.kind: p.state for p in store.processes(namespace)}
        # Each poll's depths are sampled into the ledger for the history page.
        since = datetime.now(UTC) - timedelta(hours=2)
        hours = store.depth_history(namespace, step=HOUR, since=since)
    assert states == {
        ProcessKind.WORKER: ProcessState.RUNNING,
        ProcessKind.EXPORTER: ProcessState.STOPPED,
    }
    assert max(ready for _, ready in hours[TASK]) == READY + 1  # the hour's largest
    assert {ready for _, ready in hours[OTHER]} == {0}


@pytest.mark.usefixtures("filled")
def test_once_prints_the_metrics_of_the_app_without_a_ledger(
    broker: Broker, exporters: Exporters, namespace: str
) -> None:
    result = exporters.once("--url", broker.url, "--app", "tests.beat_app:app")
    assert result.returncode == 0, result.stderr
    figures = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(result.stdout)
        for s in family.samples
    }
    assert sample(figures, "broker_jobs_exporter_up") == 1
    # The module's app has TASK only.
    assert by_task(figures, "broker_jobs_queue_ready_messages", namespace, TASK) == READY
    assert by_task(figures, "broker_jobs_queue_ready_messages", namespace, OTHER) is None
    assert not any(name.startswith("broker_jobs_ledger") for name, _ in figures), "no --store"


# -- failures --------------------------------------------------------------------------


def test_an_unreachable_broker_is_up_0_not_ready_and_warned_of_once(
    exporters: Exporters, namespace: str
) -> None:
    port = exporters.start(
        "away",
        "--url", closed_port_url(), "--namespace", namespace, "--task", TASK,
        "--interval", "0.05", "--log-level", "debug",
    )  # fmt: skip
    wait_until(
        lambda: "poll 4 of a streak failed" in exporters.log("away"),
        within=20,
        what="four failed polls",
    )
    figures = scrape(port)
    assert sample(figures, "broker_jobs_exporter_up") == 0
    ours = [name for name, _ in figures if name.startswith("broker_jobs_")]
    assert ours == ["broker_jobs_exporter_up"], "no figures yet"
    assert sample(figures, "process_open_fds")  # the process's own metrics, as every daemon's
    code, body = probe(port, "/readyz")
    assert code == 503
    assert "cannot connect to the broker" in body["status"]
    assert "guest:guest" not in body["status"], "the password is masked"
    assert probe(port, "/healthz")[0] == 200
    log = exporters.log("away")
    assert log.count("WARNING broker_jobs.ops.exporter") == 1, log
    assert " ERROR " not in log, "pika's own errors are not logged per poll"
    exporters.stop("away")


@pytest.mark.usefixtures("filled")
def test_the_last_figures_stay_while_the_broker_is_away_and_polls_resume(
    broker: Broker, exporters: Exporters, namespace: str
) -> None:
    proxy = TcpProxy(broker.url).start()
    proxied_port = proxy.port
    try:
        port = exporters.start(
            "flaky",
            "--url", proxy.url, "--namespace", namespace, "--task", TASK, "--interval", "0.1",
        )  # fmt: skip
        wait_until(lambda: probe(port, "/readyz")[0] == 200, within=20, what="the first poll")
        proxy.drop()
        proxy.stop()  # nothing listens there now: every poll fails
        wait_until(
            lambda: sample(scrape(port), "broker_jobs_exporter_up") == 0,
            within=10,
            what="exporter_up 0",
        )
        away = scrape(port)
        ready = "broker_jobs_queue_ready_messages"
        assert by_task(away, ready, namespace, TASK) == READY, "the last figures"
        assert probe(port, "/readyz")[0] == 503
        proxy = TcpProxy(broker.url, port=proxied_port).start()
        wait_until(lambda: probe(port, "/readyz")[0] == 200, within=20, what="polling again")
        assert sample(scrape(port), "broker_jobs_exporter_up") == 1
        log = exporters.log("flaky")
        assert log.count("WARNING broker_jobs.ops.exporter") == 1, log
        assert "polling works again after" in log
        exporters.stop("flaky")
    finally:
        proxy.stop()


@pytest.mark.usefixtures("app")
def test_a_missing_sqlite_ledger_fails_the_poll_and_is_not_created(
    broker: Broker, exporters: Exporters, namespace: str, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-ledger.db"
    result = exporters.once(
        "--url", broker.url, "--namespace", namespace, "--task", TASK,
        "--store", f"sqlite:///{missing}",
    )  # fmt: skip
    assert result.returncode == 1
    assert "broker_jobs_exporter_up 0.0" in result.stdout
    assert "no ledger at" in result.stderr
    assert not missing.exists()


def test_a_bad_task_name_is_a_usage_error(exporters: Exporters) -> None:
    result = exporters.once("--namespace", "jobs", "--task", "no spaces allowed")
    assert result.returncode == 2
    assert "--task" in result.stderr
