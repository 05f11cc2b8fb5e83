"""Time limits of sync handlers (docs/worker.md, *Time limits*): one attempt at a time.

A sync handler past its limit is interrupted and keeps its thread, lease and record
until it really returns, so its retry never runs beside it; the limit counts from the
handler's start, never while it waits for a thread; a handler that does not return
within the overrun grace makes the worker replace itself (HandlerStuckError, exit 70).

Each test runs on both delivery paths where they differ: a job due now takes the fast
path, a job published with a short delay the per-delivery path.
"""

from __future__ import annotations

import asyncio
import itertools
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from broker_jobs import App, Job, JobRequest, Publisher
from broker_jobs.errors import HandlerStuckError
from broker_jobs.ops.processes import process_views
from broker_jobs.retry import RetryPolicy
from broker_jobs.store.base import Status, StoreError
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.processes import Liveness
from broker_jobs.worker import Worker, WorkerSettings
from broker_jobs.worker.observer import JobObserver
from broker_jobs.worker.overrun import (
    EXIT_HANDLER_STUCK,
    LimitWatch,
    Overruns,
    RunGuard,
    TimeLimitInterrupt,
)
from broker_jobs.worker.supervisor import Verdict, judge_exit
from tests.support import Broker, app_from, run_burst_worker, worker_command
from topology import Topology

#: Publish delays that send a job down each path.
PATHS = {"fast path": None, "per-delivery path": 0.2}
ONE_RETRY = RetryPolicy(max_attempts=2, base_delay=0.1, max_delay=0.1, jitter=False)


class Key(BaseModel):
    key: str


class Runs:
    """Each handler run's (key, start, end), and how many ran at once at most."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[tuple[str, float, float]] = []
        self._running = 0
        self.most_at_once = 0

    def started(self) -> float:
        with self._lock:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        return time.monotonic()

    def ended(self, key: str, start: float) -> None:
        with self._lock:
            self._running -= 1
            self.spans.append((key, start, time.monotonic()))

    def of(self, key: str) -> list[tuple[float, float]]:
        return sorted((start, end) for name, start, end in self.spans if name == key)


def no_overlap(spans: list[tuple[float, float]]) -> bool:
    return all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans))


@pytest.mark.parametrize("delay", PATHS.values(), ids=PATHS.keys())
def test_a_sync_handler_past_its_limit_is_not_retried_until_it_returns(
    broker: Broker, make_app: Callable[[], App], delay: float | None
) -> None:
    """The issue's case: time.sleep (C code) runs on past the limit; the interrupt
    lands when it returns; only then is the attempt failed and the next one sent."""
    app = make_app()
    runs = Runs()

    @app.task("slow.sleep", time_limit=0.3, retry=ONE_RETRY)
    def slow(payload: Key) -> None:
        start = runs.started()
        try:
            if not runs.spans:
                time.sleep(1.2)  # the first run only: far past the limit
        finally:
            runs.ended(payload.key, start)

    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("slow.sleep", {"key": "k"}, delay=delay)
    store = MemoryStore()
    outcomes = run_burst_worker(broker, app, store)

    assert outcomes == Counter({"retried": 1, "succeeded": 1})
    spans = runs.of("k")
    assert len(spans) == 2
    assert no_overlap(spans), spans
    assert spans[0][1] - spans[0][0] >= 1.2  # it really ran on: the retry waited for it
    record = store.get(job.idempotency_key)
    assert record is not None
    assert (record.status, record.attempts) == (Status.SUCCEEDED, 2)
    assert "TimeLimitExceeded: ran longer than 0.3 s" in (record.last_error or "")


@pytest.mark.parametrize("delay", PATHS.values(), ids=PATHS.keys())
def test_a_spinning_handler_is_interrupted_at_its_limit_and_cannot_swallow_it(
    broker: Broker, make_app: Callable[[], App], delay: float | None
) -> None:
    app = make_app()
    started, finished, swallowed = [], [], []

    @app.task("slow.spin", time_limit=0.3, retry=ONE_RETRY)
    def spin(payload: Key) -> None:
        started.append(payload.key)
        if len(started) > 1:
            return
        try:
            deadline = time.monotonic() + 20  # bounded: a broken interrupt fails the test
            while time.monotonic() < deadline:
                pass
            finished.append("spun to the end")
        except Exception as error:  # what handlers do: the interrupt passes through
            swallowed.append(error)

    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("slow.spin", {"key": "k"}, delay=delay)
    store = MemoryStore()
    outcomes = run_burst_worker(broker, app, store)

    assert finished == []  # interrupted before its 20 s deadline, not run to it
    assert swallowed == []
    assert started == ["k", "k"]
    assert outcomes == Counter({"retried": 1, "succeeded": 1})
    record = store.get(job.idempotency_key)
    assert record is not None
    assert "TimeLimitExceeded" in (record.last_error or "")


@pytest.mark.parametrize("delay", PATHS.values(), ids=PATHS.keys())
def test_the_limit_counts_from_the_handlers_start_not_while_it_waits_for_a_thread(
    broker: Broker, make_app: Callable[[], App], delay: float | None
) -> None:
    """One handler thread, taken for 1 s by a long job: the quick jobs behind it wait
    for it, and each is judged by its own 10 ms against its 0.5 s limit."""
    app = make_app()
    runs = Runs()

    @app.task("long.job", time_limit=10)
    def long_job(payload: Key) -> None:
        start = runs.started()
        time.sleep(1.0)
        runs.ended(payload.key, start)

    @app.task("quick.job", time_limit=0.5, retry=RetryPolicy(max_attempts=1))
    def quick_job(payload: Key) -> None:
        start = runs.started()
        time.sleep(0.01)
        runs.ended(payload.key, start)

    with Publisher(broker.url, app) as publisher:
        publisher.publish("long.job", {"key": "long"})  # the fast path: takes the thread
        publisher.publish_many(
            [JobRequest("quick.job", {"key": f"q{n}"}, delay=delay) for n in range(3)]
        )
    outcomes = run_burst_worker(broker, app, MemoryStore(), concurrency=1)

    assert outcomes == Counter({"succeeded": 4})
    assert runs.most_at_once == 1


def test_handlers_past_their_limit_keep_their_slots(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    """Concurrency 2, both paths: however many runs overrun, no more than two
    handlers ever run at once, and no key runs twice at once."""
    app = make_app()
    runs = Runs()

    @app.task("slow.many", time_limit=0.2, retry=ONE_RETRY)
    def slow(payload: Key) -> None:
        start = runs.started()
        try:
            if len(runs.of(payload.key)) == 0:
                time.sleep(0.6)
        finally:
            runs.ended(payload.key, start)

    with Publisher(broker.url, app) as publisher:
        publisher.publish_many(
            [
                JobRequest("slow.many", {"key": f"k{n}"}, delay=0.2 if n % 2 else None)
                for n in range(6)
            ]
        )
    outcomes = run_burst_worker(broker, app, MemoryStore(), concurrency=2)

    assert outcomes == Counter({"retried": 6, "succeeded": 6})
    assert runs.most_at_once <= 2
    assert all(no_overlap(runs.of(f"k{n}")) for n in range(6))


@pytest.mark.parametrize("delay", PATHS.values(), ids=PATHS.keys())
def test_a_handler_stuck_past_the_grace_replaces_the_worker_after_the_others_settle(
    broker: Broker, make_app: Callable[[], App], delay: float | None
) -> None:
    """The stuck handler waits in C code (a lock) and never sees its interrupt: the
    worker lets the healthy job running beside it finish, records the stuck attempt
    as failed by its time limit (its retry due no sooner than the worker's --grace
    and 5 s: by then the process is gone, whatever it still waits for), and raises
    HandlerStuckError for its process to exit with code 70."""
    app = make_app()
    release = threading.Event()
    healthy_done = threading.Event()

    @app.task("stuck.job", time_limit=0.3, retry=ONE_RETRY)
    def stuck(payload: Key) -> None:
        release.wait(60)

    @app.task("healthy.job", time_limit=30)
    def healthy(payload: Key) -> None:
        time.sleep(1.5)
        healthy_done.set()

    with Publisher(broker.url, app) as publisher:
        stuck_job = publisher.publish("stuck.job", {"key": "s"}, delay=delay)
        healthy_job = publisher.publish("healthy.job", {"key": "h"})
    store = MemoryStore()
    settings = WorkerSettings(concurrency=2, overrun_grace=0.5, grace=2)
    worker = Worker(broker.url, app, store, settings)
    started = datetime.now(UTC)
    try:
        with pytest.raises(HandlerStuckError) as raised:
            asyncio.run(worker.run())
    finally:
        release.set()  # the process would exit here, its stuck thread with it

    assert stuck_job.id in str(raised.value)
    assert raised.value.exit_code == EXIT_HANDLER_STUCK == 70
    assert healthy_done.is_set()
    healthy_record = store.get(healthy_job.idempotency_key)
    assert healthy_record is not None
    assert healthy_record.status is Status.SUCCEEDED
    record = store.get(stuck_job.idempotency_key)
    assert record is not None
    assert record.status is Status.RETRYING
    assert "did not stop within 0.5 s of being interrupted" in (record.last_error or "")
    assert record.due_at is not None
    # Due the worker's --grace (2 s: how long it may still live, the stuck thread with
    # it) and 5 s after the attempt ended, itself after the start, the time limit and
    # the overrun grace (the record's own time is stamped after the due was computed).
    assert record.due_at >= started + timedelta(seconds=0.3 + 0.5 + 2 + 5)
    # `broker-jobs workers` shows why it stopped: a restarter must start another.
    (view,) = process_views(store)
    assert view.liveness is Liveness.STOPPED
    assert view.document()["ended"] == f"exit 70: {str(raised.value).splitlines()[0]}"
    assert raised.value.unrecorded == ()
    assert "was recorded as failed by the time limit" in str(raised.value)
    # The next attempt runs (not as a crash loop): a new worker takes it once due.
    outcomes = run_burst_worker(broker, app, store, overrun_grace=0.5)
    assert outcomes["succeeded"] == 1
    final = store.get(stuck_job.idempotency_key)
    assert final is not None
    assert (final.status, final.attempts) == (Status.SUCCEEDED, 2)


def test_jobs_waiting_behind_a_stuck_handler_go_back_to_the_queue_at_once(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    """One handler thread, stuck: the jobs claimed behind it will never start here.
    The replaced worker gives their claims back and returns their deliveries, so
    another worker runs them at once (they waited for this process and their leases
    to lapse: a minute and more)."""
    app = make_app()
    release = threading.Event()

    @app.task("stuck.job", time_limit=0.3, retry=ONE_RETRY)
    def stuck(payload: Key) -> None:
        if payload.key == "s":
            release.wait(60)

    with Publisher(broker.url, app) as publisher:
        first = publisher.publish("stuck.job", {"key": "s"})
        behind = [publisher.publish("stuck.job", {"key": f"b{n}"}) for n in range(3)]
    store = MemoryStore()
    settings = WorkerSettings(concurrency=1, overrun_grace=0.5, grace=1, lease=600)
    try:
        with pytest.raises(HandlerStuckError):
            asyncio.run(Worker(broker.url, app, store, settings).run())
    finally:
        release.set()
    for job in behind:  # claimed behind it, given back: no lease of 600 s to wait out
        record = store.get(job.idempotency_key)
        assert record is None or record.released, record
    outcomes = run_burst_worker(broker, app, store, concurrency=3, lease=600)
    assert outcomes["succeeded"] == 4  # the three, and the stuck job's retry once due
    assert store.get(first.idempotency_key).attempts == 2  # type: ignore[union-attr]


def test_the_worker_command_exits_70_on_a_stuck_handler_and_its_supervisor_restarts_it(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
) -> None:
    (tmp_path / "stuck_app.py").write_text(
        textwrap.dedent(f"""
            import threading
            from pydantic import BaseModel
            from broker_jobs import App, RetryPolicy

            class Key(BaseModel):
                key: str

            app = App(namespace={namespace!r})

            @app.task("stuck.cli", time_limit=0.3, retry=RetryPolicy(max_attempts=1))
            def stuck(payload: Key) -> None:
                threading.Event().wait(120)  # C code: the interrupt never lands
        """)
    )
    stuck_app = app_from(tmp_path, "stuck_app")
    cleanup_topology(stuck_app.topology())
    with Publisher(broker.url, stuck_app) as publisher:
        publisher.publish("stuck.cli", {"key": "s"})
    store = tmp_path / "ledger.db"
    done = worker_command(
        broker, tmp_path, "stuck_app:app", "--store", f"sqlite:///{store}", "--overrun-grace", "0.5"
    )
    assert done.returncode == 70, done.stderr
    assert "stuck past their time limit" in done.stderr
    assert judge_exit(70, ran_for=30, stopping=False, burst=True) is Verdict.RESTART


def test_a_limit_armed_late_counts_from_the_handlers_start() -> None:
    """The fast path arms a handler's limit when the loop gets to it (one call for all
    the threads' reports and limits): the deadline is the handler's start plus the
    limit, however late the arming. A 30 s limit armed 31 s after its start fires at
    once; counted from the arming it would not fire within the 10 s waited here."""

    async def scenario() -> bool:
        overruns = Overruns(grace=60, observer=JobObserver("jobs", "w1"))
        guard = RunGuard()
        watch = LimitWatch(30, Job(task="t.spin"), overruns, guard)
        interrupted, done = threading.Event(), threading.Event()

        def spin() -> None:
            try:
                while not done.is_set():
                    time.sleep(0.001)
            except TimeLimitInterrupt:
                interrupted.set()

        loop = asyncio.get_running_loop()
        running = loop.run_in_executor(None, guard.call, spin)
        watch.arm(time.monotonic() - 31)
        ended = await loop.run_in_executor(None, interrupted.wait, 10)
        done.set()  # not interrupted: the handler returns
        watch.outcome(None)
        await running
        return ended

    assert asyncio.run(scenario())


class LedgerDownForRetries(MemoryStore):
    """A ledger that fails every retry record once ``down`` is set (an outage as the
    worker sees it)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = threading.Event()

    def retry(self, *args: Any, **kwargs: Any) -> None:
        if self.down.is_set():
            raise StoreError("the ledger is down (test)")
        super().retry(*args, **kwargs)


def test_a_stuck_attempt_the_ledger_could_not_record_is_not_said_recorded(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    """The worker replaced for a stuck handler said its attempt "was recorded as failed
    by the time limit" even when the ledger was down all the while: nothing was
    recorded, and the job ran again only once its lease lapsed. The exit now says
    which attempts were recorded and which were not."""
    app = make_app()
    release = threading.Event()
    store = LedgerDownForRetries()

    @app.task("stuck.job", time_limit=0.3, retry=ONE_RETRY)
    def stuck(payload: Key) -> None:
        store.down.set()
        release.wait(60)

    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("stuck.job", {"key": "s"})
    worker = Worker(broker.url, app, store, WorkerSettings(overrun_grace=0.3, grace=1))
    try:
        with pytest.raises(HandlerStuckError) as raised:
            asyncio.run(worker.run())
    finally:
        release.set()
    assert raised.value.unrecorded == (job.id,)
    assert "could not be recorded" in str(raised.value)
    assert "was recorded as failed" not in str(raised.value)
