"""The worker's metrics, probes and outcome logs against a real broker: /metrics
scraped over HTTP while jobs run (both delivery paths), /readyz following the broker
link through a network cut, and the CLI worker's JSON lines, one per outcome, with
no password in any of them."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from broker_jobs import App, JobRequest, Publisher
from broker_jobs.observe import Health, ObservabilityServer
from broker_jobs.observe.worker_metrics import WorkerMetrics
from broker_jobs.retry import PermanentError, RetryPolicy
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.testing.tcp_proxy import TcpProxy
from broker_jobs.worker import Worker, WorkerSettings
from broker_jobs.worker.observer import JobObserver
from tests.support import Broker, wait_until
from tests.test_observe import get
from tests.test_worker_recovery import (
    WorkerProcess,
    WorkerThread,
    declared_app,
    worker_processes,  # noqa: F401 - the fixture
    write_app,
)
from topology import Topology

pytestmark = pytest.mark.broker

QUICK = RetryPolicy(max_attempts=3, base_delay=0.2, max_delay=0.2, jitter=False)
#: How long the quick handlers run: their durations' sum is checked against it.
RUN_FOR = 0.01
SLOW_FOR = 1.2


class Add(BaseModel):
    key: str
    fail_times: int = 0


# -- scraping ---------------------------------------------------------------------------


class Scrape:
    """One /metrics answer, parsed."""

    def __init__(self, port: int) -> None:
        status, text = get(port, "/metrics")
        assert status == 200
        self.samples = [
            sample for family in text_string_to_metric_families(text) for sample in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
        return sum(
            sample.value
            for sample in self.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )


def served(registry: CollectorRegistry, worker: Worker) -> ObservabilityServer:
    return ObservabilityServer(registry, Health(worker.readiness), port=0, host="127.0.0.1")


def ready(port: int) -> bool:
    return get(port, "/readyz")[0] == 200


# -- metrics of real jobs ------------------------------------------------------------------


@pytest.fixture
def app(make_app: Callable[[], App]) -> App:
    app = make_app()
    runs = Runs()

    @app.task("counter.add", retry=QUICK, time_limit=30)
    def add(payload: Add) -> None:
        time.sleep(RUN_FOR)
        if payload.fail_times and runs.record(payload.key) <= payload.fail_times:
            raise ConnectionError("flaky")

    @app.task("counter.reject", time_limit=30)
    def reject(payload: Add) -> None:
        raise PermanentError("this input can never work")

    @app.task("counter.async", time_limit=30)
    async def add_async(payload: Add) -> None:
        pass

    @app.task("counter.tx", transactional=True)
    def add_in_transaction(payload: Add, db: object) -> None:
        pass

    @app.task("counter.slow", time_limit=30)
    def slow(payload: Add) -> None:
        time.sleep(SLOW_FOR)

    return app


class Runs:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, key: str) -> int:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            return self.counts[key]


@pytest.fixture
def metered(broker: Broker, app: App, tmp_path: Path) -> Iterator[tuple[WorkerThread, int]]:
    """A worker with metrics (lease 1.5 s: renewed every 0.5 s), served on a free port;
    an SQLite ledger, which a transactional task needs."""
    registry = CollectorRegistry()
    store = SQLiteStore(tmp_path / "ledger.db")
    worker = Worker(
        broker.url, app, store, WorkerSettings(lease=1.5), metrics=WorkerMetrics(registry)
    )
    with served(registry, worker) as server:
        running = WorkerThread(worker)
        try:
            yield running, server.port
        finally:
            running.stop()
            store.close()


def test_metrics_count_what_ran_on_both_paths(
    broker: Broker, app: App, metered: tuple[WorkerThread, int]
) -> None:
    running, port = metered
    wait_until(lambda: ready(port), within=30, what="/readyz 200 once consuming")
    assert get(port, "/healthz")[0] == 200
    requests = [JobRequest("counter.add", {"key": f"k{n}"}) for n in range(5)]
    requests += [
        JobRequest("counter.add", {"key": "flaky", "fail_times": 1}),  # a retry, then a success
        JobRequest("counter.add", {"key": "once"}, idempotency_key="invoice-1"),
        JobRequest("counter.reject", {"key": "bad"}),  # dead: permanent
        *[JobRequest("counter.async", {"key": f"a{n}"}) for n in range(3)],
        JobRequest("counter.tx", {"key": "tx"}),  # the per-delivery path
        JobRequest("counter.slow", {"key": "slow"}),  # renews its lease
    ]
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many(requests)
        wait_until(
            lambda: running.worker.outcomes["succeeded"] == 12, within=30, what="12 successes"
        )
        publisher.publish("counter.add", {"key": "once"}, idempotency_key="invoice-1")
        wait_until(lambda: running.worker.outcomes["duplicate"] == 1, within=30, what="duplicate")
    outcomes = running.worker.outcomes
    assert (outcomes["retried"], outcomes["dead:permanent"]) == (1, 1)
    scrape = Scrape(port)
    jobs = "broker_jobs_jobs_total"
    namespace = app.namespace
    add = {"namespace": namespace, "task": "counter.add"}
    assert scrape.value(jobs, **add, outcome="succeeded") == 7
    assert scrape.value(jobs, **add, outcome="retried") == 1
    assert scrape.value(jobs, **add, outcome="duplicate") == 1
    assert scrape.value(jobs, task="counter.reject", outcome="dead") == 1
    assert scrape.value(jobs, task="counter.async", outcome="succeeded") == 3
    assert scrape.value(jobs, task="counter.tx", outcome="succeeded") == 1
    assert scrape.value(jobs, outcome="failed") == 0
    assert scrape.value(jobs) == 12 + 1 + 1 + 1, "a delivery counted twice, or not at all"
    dead = "broker_jobs_dead_letters_total"
    assert scrape.value(dead, task="counter.reject", reason="permanent") == 1
    assert scrape.value(dead) == 1
    # Handler runs: 5 + 2 (flaky) + 1 (the duplicate's original) of counter.add.
    duration, lag = "broker_jobs_job_duration_seconds", "broker_jobs_job_lag_seconds"
    expected_runs = {"counter.add": 8, "counter.reject": 1, "counter.async": 3, "counter.tx": 1}
    for task, count in {**expected_runs, "counter.slow": 1}.items():
        assert scrape.value(f"{duration}_count", task=task) == count, task
        assert scrape.value(f"{lag}_count", task=task) == count, task
    add_time = scrape.value(f"{duration}_sum", task="counter.add")
    assert 8 * RUN_FOR <= add_time < 8 * RUN_FOR + 1.0
    assert SLOW_FOR <= scrape.value(f"{duration}_sum", task="counter.slow") < SLOW_FOR + 1.0
    assert scrape.value(f"{duration}_bucket", task="counter.slow", le="+Inf") == 1
    assert scrape.value(f"{lag}_sum") > 0
    assert scrape.value("broker_jobs_jobs_in_flight") == 0
    assert scrape.value("broker_jobs_lease_renewals_total", task="counter.slow") >= 1
    assert scrape.value("broker_jobs_leases_lost_total") == 0
    assert scrape.value("broker_jobs_claims_busy_total") == 0
    assert scrape.value("broker_jobs_broker_connected") == 1
    assert scrape.value("broker_jobs_broker_reconnects_total") == 0
    for sample in scrape.samples:  # bounded labels: never a job id or key
        assert not {"invoice-1", "flaky", "k0"} & set(sample.labels.values()), sample


def test_readyz_is_503_while_the_broker_link_is_cut_and_200_once_it_heals(
    broker: Broker, app: App, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    with TcpProxy(f"{broker.url}?heartbeat=1") as proxy:
        worker = Worker(
            proxy.url,
            app,
            SQLiteStore(tmp_path / "ledger.db"),
            WorkerSettings(),
            metrics=WorkerMetrics(registry),
        )
        with served(registry, worker) as server:
            running = WorkerThread(worker)
            try:
                port = server.port
                assert get(port, "/healthz")[0] == 200
                wait_until(lambda: ready(port), within=30, what="/readyz 200 once consuming")
                assert Scrape(port).value("broker_jobs_broker_connected") == 1
                proxy.cut()
                wait_until(
                    lambda: get(port, "/readyz")[0] == 503,
                    within=30,
                    what="/readyz 503 once the cut is noticed (missed heartbeats)",
                )
                status, body = get(port, "/readyz")
                assert status == 503
                assert "waiting for the broker" in json.loads(body)["status"]
                assert "guest:guest" not in body
                assert get(port, "/healthz")[0] == 200, "the process lives on"
                down = Scrape(port)
                assert down.value("broker_jobs_broker_connected") == 0
                cut_at = time.monotonic()
                proxy.heal()
                wait_until(lambda: ready(port), within=60, what="/readyz 200 after the heal")
                up = Scrape(port)
            finally:
                running.stop()
    assert up.value("broker_jobs_broker_connected") == 1
    assert up.value("broker_jobs_broker_reconnects_total") == 1
    outage = up.value("broker_jobs_broker_disconnected_seconds_total")
    assert 0 < outage < time.monotonic() - cut_at + 60


# -- the CLI worker's logs -------------------------------------------------------------------

CLI_APP = """
from broker_jobs.retry import PermanentError, RetryPolicy

RUNS = {}

@app.task("counter.add", retry=RetryPolicy(max_attempts=3, base_delay=0.2, jitter=False),
          time_limit=30)
def add(payload: Add) -> None:
    RUNS[payload.key] = RUNS.get(payload.key, 0) + 1
    if payload.key == "flaky" and RUNS[payload.key] == 1:
        raise ConnectionError("amqp://bob:hunter2@elsewhere/ refused")
    if payload.key == "bad":
        raise PermanentError("postgresql://app:s3cret@db/x says no")
"""
SECRETS = ("guest:guest@", "hunter2", "s3cret")


@pytest.fixture
def cli_app(
    namespace: str, tmp_path: Path, cleanup_topology: Callable[[Topology], Topology]
) -> App:
    write_app(tmp_path, namespace, CLI_APP)
    return declared_app(namespace, cleanup_topology)


def json_lines(log: str) -> list[dict[str, Any]]:
    """Every line of the log, each a JSON object (or the test fails)."""
    return [json.loads(line) for line in log.splitlines() if line.strip()]


def outcome_lines(log: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The outcome lines by (job id, outcome)."""
    return {
        (line["job_id"], line["outcome"]): line for line in json_lines(log) if "outcome" in line
    }


def cli_worker(
    start: Callable[[list[str], Path], WorkerProcess], url: str, tmp_path: Path, *options: str
) -> WorkerProcess:
    args = ["--url", url, "recovery_app:app", "--store", "memory://", *options]
    return start(args, tmp_path)


def test_the_cli_worker_logs_one_json_line_per_outcome_and_serves_its_metrics(
    broker: Broker,
    cli_app: App,
    tmp_path: Path,
    worker_processes: Callable[[list[str], Path], WorkerProcess],  # noqa: F811
) -> None:
    assert "guest:guest@" in broker.url, "the test wants a URL with a password"
    worker = cli_worker(
        worker_processes, broker.url, tmp_path, "--log-format", "json", "--metrics-port", "0",
        "--log-successes", "each",
    )  # fmt: skip
    worker.logged("consuming", within=30)
    port = int(re.findall(r"on port (\d+)", worker.log)[0])
    with Publisher(broker.url, cli_app) as publisher:
        ok, flaky, bad, first = publisher.publish_many(
            [
                JobRequest("counter.add", {"key": key}, idempotency_key=f"key-{key}")
                for key in ("ok", "flaky", "bad", "once")
            ]
        )
        wait_until(
            lambda: (first.id, "succeeded") in outcome_lines(worker.log), within=30, what="once"
        )
        again = publisher.publish("counter.add", {"key": "once"}, idempotency_key="key-once")
    wait_until(
        lambda: (
            {(flaky.id, "succeeded"), (again.id, "duplicate")} <= set(outcome_lines(worker.log))
        ),
        within=30,
        what="the retry's success and the duplicate logged",
    )
    assert ready(port)
    wait_until(  # counted once acked, just after the line
        lambda: Scrape(port).value("broker_jobs_jobs_total", outcome="succeeded") == 3,
        within=10,
        what="3 successes counted",
    )
    assert worker.stop() == 0
    lines = outcome_lines(worker.log)
    succeeded = lines[(ok.id, "succeeded")]
    assert succeeded["level"] == "INFO"
    assert (succeeded["key"], succeeded["task"], succeeded["attempt"]) == (
        "key-ok",
        "counter.add",
        1,
    )
    assert succeeded["duration_s"] >= 0
    assert succeeded["worker"]
    assert ok.id in succeeded["message"]
    retried = lines[(flaky.id, "retried")]
    assert retried["level"] == "WARNING"
    assert (retried["error_type"], retried["attempt"]) == ("ConnectionError", 1)
    assert "refused" in retried["error"]
    assert retried["next_due"]
    assert lines[(flaky.id, "succeeded")]["attempt"] == 2
    dead = lines[(bad.id, "dead")]
    assert (dead["level"], dead["reason"], dead["error_type"]) == (
        "ERROR",
        "permanent",
        "PermanentError",
    )
    assert "says no" in dead["error"]
    assert dead["key"] == "key-bad"
    duplicate = lines[(again.id, "duplicate")]
    assert (duplicate["level"], duplicate["key"], duplicate["ledger_status"]) == (
        "INFO",
        "key-once",
        "succeeded",
    )
    assert len(lines) == 6, "one line per outcome"
    for secret in SECRETS:
        assert secret not in worker.log
    assert "guest:***@" in worker.log  # the URL was logged, masked


def test_log_level_warning_drops_the_info_lines(
    broker: Broker,
    cli_app: App,
    tmp_path: Path,
    worker_processes: Callable[[list[str], Path], WorkerProcess],  # noqa: F811
) -> None:
    with Publisher(broker.url, cli_app) as publisher:
        ok, flaky = publisher.publish_many(
            [JobRequest("counter.add", {"key": key}) for key in ("ok", "flaky")]
        )
    worker = cli_worker(
        worker_processes,
        broker.url,
        tmp_path,
        "--burst",
        "--log-format",
        "json",
        "--log-level",
        "warning",
    )
    assert worker.process.wait(60) == 0  # drained
    worker.stop()  # (reads the log to its end)
    lines = json_lines(worker.log)
    assert lines, "the retry's WARNING is logged"
    assert {line["level"] for line in lines} <= {"WARNING", "ERROR", "CRITICAL"}
    assert set(outcome_lines(worker.log)) == {(flaky.id, "retried")}
    assert ok.id not in worker.log


def summaries(log: str) -> list[dict[str, Any]]:
    return [line for line in json_lines(log) if line.get("summary") == "succeeded"]


def test_by_default_successes_are_counted_in_a_summary_line_and_failures_each_have_theirs(
    broker: Broker,
    cli_app: App,
    tmp_path: Path,
    worker_processes: Callable[[list[str], Path], WorkerProcess],  # noqa: F811
) -> None:
    worker = cli_worker(worker_processes, broker.url, tmp_path, "--log-format", "json")
    worker.logged("consuming", within=30)
    with Publisher(broker.url, cli_app) as publisher:
        jobs = publisher.publish_many(
            [JobRequest("counter.add", {"key": key}) for key in ("ok-1", "ok-2", "bad")]
        )
    wait_until(
        lambda: (
            sum(line["succeeded"] for line in summaries(worker.log)) == 2
            and (jobs[2].id, "dead") in outcome_lines(worker.log)
        ),
        within=30,
        what="two successes counted in summaries and the dead letter's line",
    )
    assert worker.stop() == 0
    lines = summaries(worker.log)
    assert all(line["level"] == "INFO" and line["worker"] for line in lines)
    assert sum(line["by_task"]["counter.add"] for line in lines) == 2
    assert "succeeded in the last" in lines[0]["message"]
    assert {outcome for _, outcome in outcome_lines(worker.log)} == {"dead"}  # no job's own


def test_every_settlement_the_runner_returns_is_counted_a_rescue_too() -> None:
    registry = CollectorRegistry()
    observer = JobObserver("ns", "w1", WorkerMetrics(registry), ["t"])
    for outcome in ("rescued", "rerouted", "dead:crash-loop", "left"):
        observer.settled("t", outcome)
    labels = {"namespace": "ns", "task": "t"}
    value = registry.get_sample_value
    assert value("broker_jobs_jobs_total", {**labels, "outcome": "rescued"}) == 1
    assert value("broker_jobs_jobs_total", {**labels, "outcome": "rerouted"}) == 1
    assert value("broker_jobs_jobs_total", {**labels, "outcome": "dead"}) == 1
