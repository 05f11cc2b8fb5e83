"""A handler's result, kept in the ledger with its success: on the fast path, the
per-delivery path and in transactional handlers, sync and async; a task may opt out;
what is no JSON or too large is not kept (the job succeeds all the same). And the
job's next steps (JobContext.then): a chain and a fan-out run each step once, a
follow-up the app cannot publish fails the attempt before anything is recorded, and
a delivery of a job that succeeded publishes the follow-ups its worker did not
confirm, without running the handler again."""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
from pydantic import BaseModel

from broker_jobs import App, JobContext, Publisher, RetryPolicy
from broker_jobs.envelope import Job
from broker_jobs.errors import FollowUpError
from broker_jobs.store.base import MAX_PAYLOAD_BYTES, Output, Status
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.worker.follow_ups import FollowUps
from tests.support import Broker, run_burst_worker
from topology import declare


class Item(BaseModel):
    n: int


class Total(BaseModel):
    n: int
    doubled: int


class Ran:
    """How many times each (task, key) ran, across handler threads."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, job: JobContext) -> None:
        with self._lock:
            self.counts[job.task, job.idempotency_key] += 1


ONCE = RetryPolicy(max_attempts=1)


# -- results ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_what_a_handler_returns_is_kept_with_its_success(
    broker: Broker, make_app: Callable[[], App], kind: str, tmp_path: Path
) -> None:
    app = make_app()

    def model(payload: Item) -> Total:
        return Total(n=payload.n, doubled=payload.n * 2)

    def listing(payload: Item) -> list[object]:
        return [payload.n, "é", None, {"nested": True}]

    def nothing(payload: Item) -> None:
        return None

    def opaque(payload: Item) -> object:
        return object()  # no JSON: not kept, said once

    def huge(payload: Item) -> str:
        return "x" * (MAX_PAYLOAD_BYTES + 1)

    handlers: dict[str, Callable[[Item], object]] = {
        "r.model": model,
        "r.list": listing,
        "r.none": nothing,
        "r.opaque": opaque,
        "r.huge": huge,
        "r.dropped": model,
    }
    for name, function in handlers.items():
        handler = function if kind == "sync" else _as_async(function)
        app.task(name, retry=ONCE, keep_result=name != "r.dropped")(handler)

    with Publisher(broker.url, app) as publisher:
        for name in handlers:
            publisher.publish(name, Item(n=21), idempotency_key=name)
        # Held until due: the per-delivery path returns its result too.
        publisher.publish("r.model", Item(n=4), idempotency_key="later", delay=0.2)
    with SQLiteStore(tmp_path / "ledger.db") as store:
        run_burst_worker(broker, app, store)
        statuses = {name: store.get(name).status for name in [*handlers, "later"]}  # type: ignore[union-attr]
        assert set(statuses.values()) == {Status.SUCCEEDED}, statuses
        assert store.result("r.model") == {"n": 21, "doubled": 42}
        assert store.result("later") == {"n": 4, "doubled": 8}
        assert store.result("r.list") == [21, "é", None, {"nested": True}]
        for kept_nothing in ("r.none", "r.opaque", "r.dropped"):
            assert store.output(kept_nothing) is None, kept_nothing
        too_large = store.output("r.huge")
        assert too_large is not None
        assert too_large.result_too_large
        assert too_large.result_size == MAX_PAYLOAD_BYTES + 3  # with its quotes


def _as_async(function: Callable[[Item], object]) -> Callable[[Item], object]:
    async def handler(payload: Item) -> object:
        return function(payload)

    handler.__annotations__ = {"payload": Item, "return": object}
    return handler


def test_a_transactional_handler_keeps_its_result_in_its_transaction(
    broker: Broker, make_app: Callable[[], App], tmp_path: Path
) -> None:
    app = make_app()

    @app.task("r.tx", transactional=True)
    def write(payload: Item, db: object) -> dict[str, int]:
        return {"written": payload.n}

    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("r.tx", Item(n=7))
    with SQLiteStore(tmp_path / "ledger.db") as store:
        run_burst_worker(broker, app, store)
        assert store.result(job.id) == {"written": 7}
        record = store.wait(job.id, timeout=5)
        assert record.status is Status.SUCCEEDED


# -- next steps -----------------------------------------------------------------------------


def test_a_three_step_chain_and_a_fan_out_run_each_step_once(
    broker: Broker, make_app: Callable[[], App], tmp_path: Path
) -> None:
    app = make_app()
    ran = Ran()

    @app.task("chain.fetch", retry=ONCE)
    def fetch(payload: Item, job: JobContext) -> None:
        ran.add(job)
        job.then("chain.resize", Item(n=payload.n + 1))

    @app.task("chain.resize", retry=ONCE)
    async def resize(payload: Item, job: JobContext) -> None:
        ran.add(job)
        job.then("chain.notify", {"n": payload.n + 1}, delay=0.2)

    @app.task("chain.notify", retry=ONCE)
    def notify(payload: Item, job: JobContext) -> int:
        ran.add(job)
        return payload.n

    @app.task("fan.out", retry=ONCE)
    def fan_out(payload: Item, job: JobContext) -> None:
        ran.add(job)
        for n in range(payload.n):
            job.then("chain.notify", Item(n=n))

    with Publisher(broker.url, app) as publisher:
        publisher.publish("chain.fetch", Item(n=1), idempotency_key="order-1")
        publisher.publish("fan.out", Item(n=3), idempotency_key="batch-9")
    with SQLiteStore(tmp_path / "ledger.db") as store:
        run_burst_worker(broker, app, store)
        assert ran.counts == {
            ("chain.fetch", "order-1"): 1,
            ("chain.resize", "order-1>1"): 1,  # keys derive from the parent's
            ("chain.notify", "order-1>1>1"): 1,
            ("fan.out", "batch-9"): 1,
            ("chain.notify", "batch-9>1"): 1,
            ("chain.notify", "batch-9>2"): 1,
            ("chain.notify", "batch-9>3"): 1,
        }
        assert store.result("order-1>1>1") == 3
        fetched = store.output("order-1")
        assert fetched is not None
        assert [job.idempotency_key for job in fetched.follow_ups] == ["order-1>1"]
        assert fetched.sent_at is not None  # confirmed, then acked
        [notify_job] = store.output("order-1>1").follow_ups  # type: ignore[union-attr]
        assert notify_job.due_at is not None  # the delay, counted from then()
        # The follow-up ran under the id recorded with its parent's success.
        assert store.get("order-1>1").job_id == fetched.follow_ups[0].id  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("follow_up", "message"),
    [
        (lambda job: job.then("no.such.task", {"n": 1}), r"unknown task 'no.such.task'"),
        (lambda job: job.then("step.next", {"n": "many"}), r"payload for task 'step.next'"),
        (lambda job: job.then("step.next", {"n": 1}, delay=-1), r"delay must not be negative"),
    ],
)
def test_a_follow_up_the_app_cannot_publish_fails_the_attempt_and_records_nothing(
    broker: Broker,
    make_app: Callable[[], App],
    tmp_path: Path,
    follow_up: Callable[[JobContext], None],
    message: str,
) -> None:
    app = make_app()

    @app.task("step.first", retry=ONCE)
    def first(payload: Item, job: JobContext) -> None:
        follow_up(job)

    @app.task("step.next", retry=ONCE)
    def following(payload: Item) -> None:
        raise AssertionError("never published")

    with Publisher(broker.url, app) as publisher:
        publisher.publish("step.first", Item(n=1), idempotency_key="bad")
    with SQLiteStore(tmp_path / "ledger.db") as store:
        run_burst_worker(broker, app, store)
        record = store.get("bad")
        assert record is not None
        assert record.status is Status.DEAD
        assert record.last_error is not None
        assert "FollowUpError" in record.last_error
        assert re.search(message, record.last_error)
        assert store.output("bad") is None
        assert store.get("bad>1") is None


def test_then_checks_at_once_and_raises_a_follow_up_error() -> None:
    app = App(namespace="then")

    @app.task("t.a")
    def a(payload: Item, job: JobContext) -> None: ...

    async def never(*_: object) -> None:
        raise AssertionError

    builders = FollowUps(app, MemoryStore(), publish_job=never, recorded=never, stopping=bool)
    parent = Job(task="t.a", idempotency_key="k" * 255)
    context = JobContext.of(
        parent, max_attempts=1, worker_id="w", time_limit=None, follow_ups=builders.builder(parent)
    )
    first = context.then("t.a", Item(n=1))
    assert len(first.idempotency_key) <= 255  # a parent key too long to extend is hashed
    assert first.idempotency_key.endswith(">1")
    with pytest.raises(FollowUpError, match=r"task 't.a'.*invalid follow-up.*unknown task"):
        context.then("t.b", Item(n=1))
    with pytest.raises(TypeError, match="countdown"):
        context.then("t.a", Item(n=1), countdown=5)  # type: ignore[call-arg]
    assert context.follow_ups == [first]


def test_a_delivery_of_a_succeeded_job_publishes_its_unconfirmed_follow_ups_once(
    broker: Broker, make_app: Callable[[], App], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As a worker killed between the record and the ack leaves it: the success and
    its follow-ups recorded, nothing published, the delivery back in the queue."""
    app = make_app()
    ran = Ran()

    @app.task("crash.parent", retry=ONCE)
    def parent(payload: Item, job: JobContext) -> None:
        ran.add(job)
        job.then("crash.child", Item(n=1))

    @app.task("crash.child", retry=ONCE)
    def child(payload: Item, job: JobContext) -> None:
        ran.add(job)

    job = Job(task="crash.parent", payload={"n": 1}, idempotency_key="p")
    recorded_child = Job(task="crash.child", payload={"n": 1}, idempotency_key="p>1")
    with SQLiteStore(tmp_path / "ledger.db") as store:
        store.claim(job, "dead-worker#1", 60)
        output = Output(None, (recorded_child,))
        store.succeed("p", "dead-worker#1", output=output)
        with Publisher(broker.url, app) as publisher:
            publisher.publish("crash.parent", Item(n=1), job_id=job.id, idempotency_key="p")
        with caplog.at_level(logging.INFO, logger="broker_jobs.worker.follow_ups"):
            run_burst_worker(broker, app, store)
        assert ran.counts == {("crash.child", "p>1"): 1}  # the parent did not run again
        assert store.get("p>1").job_id == recorded_child.id  # type: ignore[union-attr]
        kept = store.output("p")
        assert kept is not None
        assert kept.sent_at is not None
    assert "publishing its 1 recorded follow-ups again" in caplog.text


def test_a_follow_up_refused_for_a_missing_queue_is_held_then_published_once_declared(
    broker: Broker, make_app: Callable[[], App], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()

    @app.task("step.first", retry=ONCE)
    def first(payload: Item, job: JobContext) -> None:
        job.then("step.second", Item(n=payload.n + 1))

    @app.task("step.second", retry=ONCE)
    def second(payload: Item) -> None:
        raise AssertionError("this worker runs step.first only")

    refused = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "was refused" in record.getMessage():
                refused.set()

    def declare_the_second_queue_once_refused() -> None:
        if refused.wait(60):
            with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
                declare(connection, app.topology())

    watch = Watch()
    follow_ups_log = logging.getLogger("broker_jobs.worker.follow_ups")
    follow_ups_log.addHandler(watch)
    # Only the first step's queue exists (the worker declares nothing).
    first_only = make_app()
    first_only.declare("step.first", Item)
    with Publisher(broker.url, first_only) as publisher:
        publisher.publish("step.first", Item(n=1), idempotency_key="k")
    declarer = threading.Thread(target=declare_the_second_queue_once_refused)
    declarer.start()
    try:
        with (
            SQLiteStore(tmp_path / "ledger.db") as store,
            caplog.at_level(logging.INFO, logger="broker_jobs.worker.follow_ups"),
        ):
            counts = run_burst_worker(broker, app, store, tasks=("step.first",), declare=False)
            output = store.output("k")
    finally:
        declarer.join()
        follow_ups_log.removeHandler(watch)
    assert refused.is_set(), "the follow-up was never refused"
    assert counts["succeeded"] == 1
    assert output is not None
    assert output.sent_at is not None
    assert "bootstrap" not in caplog.text
    assert re.search(
        r"follow-up \S+ \(task step\.second\) of job \S+ published after 1 refusal\b", caplog.text
    )
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        waiting = connection.channel().queue_declare(
            app.names.task_queue("step.second"), passive=True
        )
    assert waiting.method.message_count == 1  # published once


def test_a_next_step_is_in_the_ledger_as_queued_before_a_worker_takes_it(
    broker: Broker, make_app: Callable[[], App], tmp_path: Path
) -> None:
    """A worker publishes a next step with the ledger open, but the ledger knew the
    step only from its first claim: with its task's workers paused or busy, `jobs
    list/show/cancel` did not find it, and `status` counted it nowhere. It is
    recorded queued once confirmed (scheduled, with a delay), as a publisher with a
    ledger records its jobs."""
    app = make_app()

    @app.task("step.first", retry=ONCE)
    def first(payload: Item, job: JobContext) -> None:
        job.then("step.second", Item(n=payload.n + 1))

    @app.task("step.second", retry=ONCE)
    def second(payload: Item) -> int:
        return payload.n

    with Publisher(broker.url, app) as publisher:
        publisher.publish("step.first", Item(n=1), idempotency_key="order-5")
    with SQLiteStore(tmp_path / "ledger.db") as store:
        run_burst_worker(broker, app, store, tasks=("step.first",))  # no step.second worker
        now = store.get("order-5>1")
        assert now is not None
        assert now.status is Status.QUEUED
        output = store.output("order-5")
        assert output is not None
        assert now.job_id == output.follow_ups[0].id
    # The step's worker claims that record: test_a_three_step_chain_and_a_fan_out_...
