"""The testing kit (broker_jobs.testing.JobsKit): jobs published through the
production API and run in the test's process, with no broker and no real sleeping."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from broker_jobs import (
    App,
    FollowUpError,
    JobContext,
    JobRequest,
    PayloadValidationError,
    PermanentError,
    RetryPolicy,
    UnroutableError,
)
from broker_jobs.clock import utc_now
from broker_jobs.errors import ConfigurationError, HandlerStuckError
from broker_jobs.store.base import Status
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.testing import JobsKit, KitError, MemoryPublisher
from broker_jobs.worker import Worker, WorkerSettings
from broker_jobs.worker.overrun import TimeLimitInterrupt

pytest_plugins = ["pytester"]


class Add(BaseModel):
    key: str


def counting_app(fail_first: int = 0, *, retry: RetryPolicy | None = None) -> tuple[App, list[str]]:
    """An app whose handler records each run and fails its first ``fail_first`` runs."""
    app = App(namespace="kit")
    runs: list[str] = []

    @app.task("counter.add", retry=retry or RetryPolicy(max_attempts=3, base_delay=30))
    def add(payload: Add) -> dict[str, str]:
        runs.append(payload.key)
        if len(runs) <= fail_first:
            raise RuntimeError(f"run {len(runs)} fails")
        return {"added": payload.key}

    return app, runs


def test_a_published_job_runs_when_the_test_says_and_its_result_is_kept() -> None:
    app, runs = counting_app()
    with JobsKit(app) as kit:
        job = kit.publisher().publish("counter.add", Add(key="a"))
        assert runs == []  # nothing runs by itself
        assert [queued.id for queued in kit.queued("counter.add")] == [job.id]
        assert kit.run() == 1
        record = kit.record(job)
        assert record is not None
        assert record.status is Status.SUCCEEDED
        assert kit.result(job) == {"added": "a"}
        assert kit.outcomes == {"succeeded": 1}
        assert kit.pending() == 0


def test_a_failing_job_is_retried_after_its_backoff_on_the_test_clock() -> None:
    app, runs = counting_app(fail_first=1, retry=RetryPolicy(max_attempts=3, schedule=[600]))
    with JobsKit(app) as kit:
        started = kit.now
        job = kit.publisher().publish("counter.add", Add(key="a"))
        kit.run()
        record = kit.record(job)
        assert record is not None
        assert record.status is Status.RETRYING
        assert kit.advance(minutes=9) == 0  # not due yet
        assert kit.advance(minutes=2) == 1
        record = kit.record(job)
        assert record is not None
        assert (record.status, record.attempts) == (Status.SUCCEEDED, 2)
        assert runs == ["a", "a"]
        assert kit.now == started + timedelta(minutes=11)


def test_exhausted_and_permanent_failures_are_dead_lettered_with_their_reasons() -> None:
    app = App(namespace="kit")

    policy = RetryPolicy(max_attempts=3, base_delay=5, retry_on=(RuntimeError,))

    @app.task("counter.add", retry=policy)
    def add(payload: Add) -> None:
        if payload.key == "permanent":
            raise PermanentError("bad input")
        if payload.key == "not-retried":
            raise ValueError("a bug, not an outage")
        raise RuntimeError("always")

    with JobsKit(app) as kit:
        publisher = kit.publisher()
        flaky = publisher.publish("counter.add", Add(key="flaky"))
        permanent = publisher.publish("counter.add", Add(key="permanent"))
        not_retried = publisher.publish("counter.add", Add(key="not-retried"))
        kit.run_all()
        dead = {letter.job_id: letter for letter in kit.dead_letters("counter.add")}
        assert (dead[flaky.id].reason, dead[flaky.id].attempts) == ("exhausted", 3)
        # Left out of retry_on: permanent for this task, not out of attempts (so a
        # replay of --reason exhausted after an outage does not take it).
        assert (dead[not_retried.id].reason, dead[not_retried.id].attempts) == ("permanent", 1)
        assert dead[permanent.id].reason == "permanent"
        assert dead[permanent.id].error == "PermanentError: bad input"
        for job in (flaky, permanent):
            record = kit.record(job)
            assert record is not None
            assert record.status is Status.DEAD


def test_a_delayed_job_runs_when_the_clock_reaches_its_due_time_not_before() -> None:
    app, runs = counting_app()
    with JobsKit(app) as kit:
        due = kit.now + timedelta(days=3, seconds=7.5)
        kit.publisher().publish("counter.add", Add(key="later"), eta=due)
        kit.run_until(due - timedelta(seconds=1))
        assert runs == []
        kit.run_until(due)
        assert runs == ["later"]


def test_one_key_published_twice_runs_once() -> None:
    app, runs = counting_app()
    with JobsKit(app) as kit:
        publisher = kit.publisher()
        publisher.publish("counter.add", Add(key="a"), idempotency_key="order-1")
        publisher.publish("counter.add", Add(key="a"), idempotency_key="order-1")
        kit.run()
        assert runs == ["a"]
        assert kit.outcomes == {"succeeded": 1, "duplicate": 1}


def test_publish_errors_are_the_production_ones() -> None:
    app, _ = counting_app()
    with JobsKit(app) as kit:
        with pytest.raises(PayloadValidationError):
            kit.publisher().publish("counter.add", {"nokey": 1})
        # A task name the kit's app has no queue for, published by name.
        with (
            pytest.raises(UnroutableError),
            MemoryPublisher(kit.broker, namespace="kit") as by_name,
        ):
            by_name.publish("counter.remove", {"key": "k"})
        assert kit.pending() == 0


def test_the_async_publisher_publishes_to_the_kit_too() -> None:
    app, runs = counting_app()
    with JobsKit(app) as kit:

        async def publish() -> None:
            publisher = kit.async_publisher()
            await publisher.publish_many([JobRequest("counter.add", {"key": "x"})])
            await publisher.close()

        asyncio.run(publish())
        kit.run()
        assert runs == ["x"]


def test_a_handler_sees_its_job_and_starts_a_next_step() -> None:
    app = App(namespace="kit")
    seen: list[tuple[str, int]] = []

    @app.task("first")
    def first(payload: Add, job: JobContext) -> None:
        seen.append((job.task, job.attempt))
        job.then("second", Add(key=payload.key + "!"))

    @app.task("second")
    def second(payload: Add) -> str:
        seen.append(("second:" + payload.key, 1))
        return payload.key

    with JobsKit(app) as kit:
        kit.publisher().publish("first", Add(key="k"))
        kit.run()
        assert seen == [("first", 1), ("second:k!", 1)]


def test_a_handler_called_directly_with_the_kits_context_has_its_next_steps_checked() -> None:
    app = App(namespace="kit")
    app.declare("second", Add)

    @app.task("first")
    def first(payload: Add, job: JobContext) -> None:
        job.then(payload.key, {"key": "next"})

    @app.task("limited", retry=RetryPolicy(max_attempts=3), time_limit=7)
    def limited(payload: Add) -> None:
        return None

    with JobsKit(app) as kit:
        context = kit.context("first", idempotency_key="order-7", attempt=2)
        first(Add(key="second"), context)
        (asked,) = context.follow_ups
        assert (asked.task, asked.payload, asked.idempotency_key) == (
            "second",
            {"key": "next"},
            "order-7>1",
        )
        with pytest.raises(FollowUpError, match="unknown task 'nope'"):
            first(Add(key="nope"), kit.context("first"))
        with pytest.raises(FollowUpError, match="second"):
            kit.context("first").then("second", {"wrong": 1})
        # As a worker gives it: the task's attempts and time limit (a handler that
        # branches on is_last_attempt or time_left() takes the same branch).
        context = kit.context("limited", attempt=2)
        assert (context.max_attempts, context.is_last_attempt, context.time_limit) == (3, False, 7)
        assert 0 < (context.time_left() or 0) <= 7
        assert kit.context("limited", max_attempts=2, attempt=2).is_last_attempt
    # JobContext.for_test has no app to check against: it keeps what was asked.
    unchecked = JobContext.for_test("first")
    first(Add(key="nope"), unchecked)
    assert [job.task for job in unchecked.follow_ups] == ["nope"]


def test_cron_fires_for_a_time_range_run_with_their_deterministic_keys() -> None:
    app = App(namespace="kit")
    fired: list[datetime] = []

    @app.task("report")
    def report(payload: Add) -> None:
        del payload
        fired.append(utc_now())

    app.schedule("hourly-report", "report", cron="0 * * * *", payload={"key": "r"})
    with JobsKit(app, start=datetime(2030, 1, 1, 0, 30, tzinfo=UTC)) as kit:
        jobs = kit.run_schedules(timedelta(hours=3))
        assert [job.idempotency_key for job in jobs] == [
            "beat:hourly-report:2030-01-01T01:00:00Z",
            "beat:hourly-report:2030-01-01T02:00:00Z",
            "beat:hourly-report:2030-01-01T03:00:00Z",
        ]
        assert [moment.hour for moment in fired] == [1, 2, 3]


def test_run_all_refuses_jobs_that_never_end() -> None:
    app = App(namespace="kit")

    @app.task("again")
    def again(payload: Add, job: JobContext) -> None:
        job.then("again", payload, delay=3600)

    with JobsKit(app) as kit:
        kit.publisher().publish("again", Add(key="k"))
        with pytest.raises(KitError, match="still wait"):
            kit.run_all(limit=timedelta(days=1))


def test_the_kit_gives_the_system_clock_back_when_closed() -> None:
    app, _ = counting_app()
    with JobsKit(app, start=datetime(2030, 6, 1, tzinfo=UTC)):
        assert utc_now() == datetime(2030, 6, 1, tzinfo=UTC)
    assert abs((utc_now() - datetime.now(UTC)).total_seconds()) < 60


def test_the_pytest_fixtures_reach_a_users_test_suite(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        from pydantic import BaseModel
        from broker_jobs import App

        class Add(BaseModel):
            key: str

        app = App(namespace="user")

        @app.task("counter.add")
        def add(payload: Add) -> str:
            return payload.key

        @pytest.fixture
        def broker_jobs_app():
            return app
        """
    )
    pytester.makepyfile(
        """
        def test_it(jobs_kit):
            job = jobs_kit.publisher().publish("counter.add", {"key": "k"})
            jobs_kit.run()
            assert jobs_kit.result(job) == "k"
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=1)


def test_a_transactional_task_needs_a_ledger_with_transactions(tmp_path: Path) -> None:
    """The memory store has no transactions: a transactional handler got db=None and
    failed every attempt. A worker refuses the task at its start, and the kit when
    it would run one of its jobs, saying which ledger to use; the kit's other tasks
    still run on the memory store, and with SQLite the transactional one runs."""
    app = App(namespace="kit")

    @app.task("rows.add", transactional=True)
    def add_row(payload: Add, db: Any) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY)")
        db.execute("INSERT INTO rows VALUES (?)", (payload.key,))

    @app.task("plain")
    def plain(payload: Add) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"rows\.add.*SQLite or PostgreSQL"):
        Worker("amqp://localhost/", app, MemoryStore(), WorkerSettings())
    with JobsKit(app) as kit:
        kit.publisher().publish("plain", Add(key="p"))
        kit.run()
        assert kit.outcomes["succeeded"] == 1
        kit.publisher().publish("rows.add", Add(key="r"))
        with pytest.raises(ConfigurationError, match=r"JobsKit\(app, store=SQLiteStore"):
            kit.run()
    with SQLiteStore(tmp_path / "ledger.db") as store, JobsKit(app, store=store) as kit:
        job = kit.publisher().publish("rows.add", Add(key="r"))
        kit.run()
        record = kit.record(job)
        assert record is not None
        assert record.status is Status.SUCCEEDED


def test_a_handler_that_ignores_its_time_limit_replaces_the_kits_worker_as_a_workers() -> None:
    """A sync handler that swallows its interrupt past the overrun grace makes a worker
    exit with code 70 and its attempt count as failed by its time limit. The kit did
    neither: it waited for the handler (forever, for one that never returns) and
    recorded its late success. Now kit.run() raises HandlerStuckError and the kit
    goes on with a new worker, which runs the retry."""
    app = App(namespace="kit")
    release = threading.Event()
    attempts: list[int] = []

    @app.task("stubborn", time_limit=0.2, retry=RetryPolicy(max_attempts=2))
    def stubborn(payload: Add, job: JobContext) -> str:
        attempts.append(job.attempt)
        if job.attempt == 1:
            while not release.is_set():  # a handler that catches its interrupt
                try:
                    release.wait(30)
                except TimeLimitInterrupt:
                    continue
        return f"attempt {job.attempt}"

    with JobsKit(app, overrun_grace=0.3) as kit:
        try:
            job = kit.publisher().publish("stubborn", Add(key="s"))
            with pytest.raises(HandlerStuckError, match=job.id):
                kit.run()
            record = kit.record(job)
            assert record is not None
            assert record.status is Status.RETRYING
            assert "did not stop within 0.3 s" in (record.last_error or "")
            kit.run_all()  # the new worker runs the retry when it falls due
        finally:
            release.set()
        assert attempts == [1, 2]
        assert kit.result(job) == "attempt 2"
        assert kit.outcomes["succeeded"] == 1


def test_an_async_handler_that_blocks_the_loop_past_its_limit_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ``async def`` handler that blocks (``time.sleep``) cannot be cancelled at its
    limit: the loop never gets the turn that would cancel it. Its return stands (as a
    sync handler's return after its limit does), but a WARNING now says why the limit
    did not act and what to do; before, nothing did, and the job read as an ordinary
    success (``run_async_handler``, both delivery paths and the kit)."""
    import time  # noqa: PLC0415

    app = App(namespace="kit")

    @app.task("blocky", time_limit=0.05, retry=RetryPolicy(max_attempts=1))
    async def blocky(payload: Add) -> str:
        time.sleep(0.2)  # the mistake: a blocking call inside async def
        return "done"

    @app.task("polite", time_limit=5)
    async def polite(payload: Add) -> str:
        await asyncio.sleep(0)
        return "ok"

    with caplog.at_level("WARNING", logger="broker_jobs.worker.execution"), JobsKit(app) as kit:
        blocked = kit.publisher().publish("blocky", Add(key="b"))
        kit.publisher().publish("polite", Add(key="p"))
        kit.run()
        assert kit.result(blocked) == "done"
    (line,) = [r.getMessage() for r in caplog.records if "could not be cancelled" in r.getMessage()]
    assert blocked.id in line
    assert "past its 0.05 s time limit" in line
    assert "asyncio.to_thread" in line
