"""Jobs known to the ledger from their publish on (``ledger=``), and cancelled jobs
acked by a real worker without running: queued, delayed and retrying ones."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from broker_jobs import App, Job, JobRequest
from broker_jobs.cli import main
from broker_jobs.publish.ledger import PublishedLedger
from broker_jobs.retry import RetryPolicy
from broker_jobs.store import MemoryStore, SQLiteStore, StoreError
from broker_jobs.store.base import Cancellation, CancelOutcome, Status
from tests.support import AnyPublisher, Broker, run_burst_worker
from tests.test_store import Kit
from tests.test_worker import Effects
from topology import declare

pytestmark = pytest.mark.broker


class Note(BaseModel):
    text: str


@pytest.fixture
def runs() -> Effects:
    return Effects()


@pytest.fixture
def app(make_app: Callable[[], App], runs: Effects) -> App:
    app = make_app()
    # A retry waits 1.5 s in the ladder: long enough for the test to cancel it.
    slow_retry = RetryPolicy(max_attempts=3, base_delay=1.5, max_delay=1.5, jitter=False)

    @app.task("notes.write", retry=slow_retry)
    def write(payload: Note) -> None:
        if runs.record(payload.text) == 1 and payload.text.startswith("flaky"):
            raise ConnectionError("the first run fails")

    return app


def test_a_publisher_given_the_ledger_records_queued_and_scheduled_jobs(
    app: App, kit: Kit, make_publisher: Callable[..., AnyPublisher]
) -> None:
    store = kit.store
    publisher = make_publisher(app, ledger=store)
    before = datetime.now(UTC)
    now_job = publisher.publish("notes.write", Note(text="now"))
    later = publisher.publish("notes.write", Note(text="later"), delay=3600)
    batch = publisher.publish_many(
        [JobRequest("notes.write", {"text": f"b{n}"}, idempotency_key=f"b{n}") for n in range(3)]
    )

    # Each job's payload is kept with the record its publish created.
    assert store.payload(now_job.idempotency_key) == {"text": "now"}
    assert store.payload(later.idempotency_key) == {"text": "later"}
    assert [store.payload(job.idempotency_key) for job in batch] == [
        {"text": f"b{n}"} for n in range(3)
    ]
    queued = store.get(now_job.idempotency_key)
    assert queued is not None
    assert (queued.status, queued.attempts, queued.task, queued.job_id, queued.due_at) == (
        Status.QUEUED,
        0,
        "notes.write",
        now_job.id,
        None,
    )
    assert queued.created_at >= before - timedelta(seconds=1)
    scheduled = store.get(later.idempotency_key)
    assert scheduled is not None
    assert scheduled.status is Status.SCHEDULED
    assert scheduled.due_at == later.due_at
    assert [store.get(f"b{n}").status for n in range(3)] == [Status.QUEUED] * 3  # type: ignore[union-attr]
    assert {job.idempotency_key for job in batch} == {"b0", "b1", "b2"}


def test_queued_jobs_run_once_and_their_records_finish_with_one_execution(
    broker: Broker, app: App, kit: Kit, runs: Effects, make_publisher: Callable[..., AnyPublisher]
) -> None:
    publisher = make_publisher(app, ledger=kit.store)
    jobs = publisher.publish_many([JobRequest("notes.write", {"text": f"q{n}"}) for n in range(5)])
    outcomes = run_burst_worker(broker, app, kit.store)
    assert outcomes["succeeded"] == 5
    assert runs.runs == Counter({f"q{n}": 1 for n in range(5)})
    for job in jobs:
        record = kit.store.get(job.idempotency_key)
        assert record is not None
        assert (record.status, record.attempts) == (Status.SUCCEEDED, 1)
        (execution,) = kit.store.executions(job.idempotency_key)
        assert execution.attempt == 1


def test_cancelled_queued_and_delayed_jobs_are_acked_without_running(
    broker: Broker, app: App, kit: Kit, runs: Effects, make_publisher: Callable[..., AnyPublisher]
) -> None:
    store = kit.store
    publisher = make_publisher(app, ledger=store)
    queued = publisher.publish("notes.write", Note(text="queued"))
    delayed = publisher.publish("notes.write", Note(text="delayed"), delay=1)
    publisher.publish("notes.write", Note(text="kept"))
    assert store.cancel(queued.id).outcome is CancelOutcome.CANCELLED  # by job id
    assert store.cancel(delayed.idempotency_key).outcome is CancelOutcome.CANCELLED

    outcomes = run_burst_worker(broker, app, store)  # burst: waits for the ladder too
    assert (outcomes["cancelled"], outcomes["succeeded"]) == (2, 1)
    assert runs.runs == Counter({"kept": 1})
    for job in (queued, delayed):
        record = store.get(job.idempotency_key)
        assert record is not None
        assert record.status is Status.CANCELLED
        assert store.executions(job.idempotency_key) == []


def test_a_retrying_job_cancelled_between_attempts_is_not_run_again(
    broker: Broker,
    app: App,
    kit: Kit,
    runs: Effects,
    make_publisher: Callable[..., AnyPublisher],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = kit.store
    job = make_publisher(app).publish("notes.write", Note(text="flaky"))
    # Cancelled the moment the worker has recorded the first attempt as retrying: its
    # next attempt then waits 1.5 s in the ladder, whatever the machine's load (a test
    # polling for the retrying record could miss it on a busy machine).
    cancellations: list[Cancellation] = []
    record_retry = store.retry

    def retry_then_cancel(*args: Any, **kwargs: Any) -> Any:
        recorded = record_retry(*args, **kwargs)
        cancellations.append(store.cancel(job.id))
        return recorded

    monkeypatch.setattr(store, "retry", retry_then_cancel)
    outcomes = run_burst_worker(broker, app, store)
    (cancellation,) = cancellations
    assert cancellation.outcome is CancelOutcome.CANCELLED
    assert (outcomes["retried"], outcomes["cancelled"], outcomes["succeeded"]) == (1, 1, 0)
    assert runs.runs == Counter({"flaky": 1})
    record = store.get(job.idempotency_key)
    assert record is not None
    assert record.status is Status.CANCELLED
    assert [e.outcome for e in store.executions(job.idempotency_key)] == ["retrying"]
    # Published without the ledger: the worker kept the payload with the failure.
    assert store.payload(job.idempotency_key) == {"text": "flaky"}


def test_a_running_job_is_not_cancelled(kit: Kit) -> None:
    from broker_jobs import Job  # noqa: PLC0415

    job = Job(task="notes.write", payload={"text": "busy"})
    kit.store.claim(job, "worker-1", lease=60)
    cancellation = kit.store.cancel(job.id)
    assert cancellation.outcome is CancelOutcome.RUNNING
    assert kit.store.get(job.idempotency_key).status is Status.RUNNING  # type: ignore[union-attr]


def test_publishing_a_finished_key_again_warns_that_it_will_not_run(
    broker: Broker,
    app: App,
    tmp_path: Path,
    make_publisher: Callable[..., AnyPublisher],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    try:
        publisher = make_publisher(app, ledger=store)
        first = publisher.publish("notes.write", Note(text="once"), idempotency_key="inv-9")
        assert run_burst_worker(broker, app, store)["succeeded"] == 1
        with caplog.at_level(logging.WARNING, logger="broker_jobs.publish.publisher"):
            again = publisher.publish("notes.write", Note(text="once"), idempotency_key="inv-9")
        (line,) = [r.getMessage() for r in caplog.records if "will not run" in r.getMessage()]
        assert again.id in line
        assert "'inv-9' is succeeded" in line
        assert first.id in line
        record = store.get("inv-9")
        assert record is not None
        assert (record.status, record.job_id) == (Status.SUCCEEDED, first.id)  # kept
    finally:
        store.close()


def test_a_job_a_worker_finished_before_its_record_is_no_duplicate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker may claim and finish a job before the publisher records it: the key's
    record then names the same job, which ran; only another job of a finished key
    will be skipped."""
    store = MemoryStore()
    ran = Job(id="id-1", task="notes.write", idempotency_key="inv-1", attempt=1)
    store.claim(ran, "host-1:1", 60)
    store.succeed("inv-1", "host-1:1")
    other = Job(id="id-2", task="notes.write", idempotency_key="inv-1", attempt=1)
    with caplog.at_level(logging.WARNING, logger="broker_jobs.publish.publisher"):
        PublishedLedger(store).record([ran])
        assert not caplog.records
        PublishedLedger(store).record([other])
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        "job id-2 will not run: its key 'inv-1' is succeeded in the ledger (job id-1)"
    )


class BrokenLedger(SQLiteStore):
    broken = True

    def record_published(self, jobs, *, now=None):  # type: ignore[no-untyped-def]
        if self.broken:
            raise StoreError("the ledger's disk is full")
        return super().record_published(jobs, now=now)


def test_a_ledger_failing_after_the_confirm_loses_nothing(
    broker: Broker,
    app: App,
    tmp_path: Path,
    runs: Effects,
    make_publisher: Callable[..., AnyPublisher],
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = BrokenLedger(tmp_path / "broken.db")
    try:
        publisher = make_publisher(app, ledger=broken)
        with caplog.at_level(logging.WARNING, logger="broker_jobs.publish.publisher"):
            job = publisher.publish("notes.write", Note(text="safe"))
            publisher.publish("notes.write", Note(text="also safe"))
            broken.broken = False
            publisher.publish("notes.write", Note(text="recorded"))
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 2, said  # once when it fails, once when it records again
        assert said[0].startswith("1 confirmed job(s) not recorded in the ledger")
        assert "records published jobs again; 2 confirmed job(s) were not recorded" in said[1]
        assert broken.get(job.idempotency_key) is None
        assert run_burst_worker(broker, app, broken)["succeeded"] == 3  # they ran all the same
        assert runs.runs == Counter({"safe": 1, "also safe": 1, "recorded": 1})
    finally:
        broken.close()


def test_the_publish_command_records_the_job_in_the_ledger(
    broker: Broker, app: App, tmp_path: Path, connection: pika.BlockingConnection
) -> None:
    declare(connection, app.topology())  # without --app the command declares nothing
    ledger = tmp_path / "cli.db"
    result = CliRunner().invoke(
        main,
        [
            "publish",
            "--url",
            broker.url,
            "--namespace",
            app.namespace,
            "--ledger",
            f"sqlite:///{ledger}",
            "--delay",
            "600",
            "--json",
            "notes.write",
            '{"text": "from the shell"}',
        ],
    )
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    with SQLiteStore(ledger) as store:
        record = store.get(job["idempotency_key"])
        assert record is not None
        assert record.status is Status.SCHEDULED
        assert record.job_id == job["id"]
        assert record.due_at == datetime.fromisoformat(job["due_at"])
        assert store.payload(job["idempotency_key"]) == {"text": "from the shell"}
