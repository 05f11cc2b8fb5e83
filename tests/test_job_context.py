"""The job inside its handler: a parameter annotated JobContext gets the job's id, key,
task, attempt and maximum, published and due times, time left, the worker's id, the
trace context and a logger with the job's fields; on the fast path, the per-delivery
path and in transactional handlers, sync and async. Signatures the worker could not
call are refused when the task is declared."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel

from broker_jobs import App, ConfigurationError, JobContext, JobRequest, Publisher, RetryPolicy
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.sqlite import SQLiteStore
from tests.support import Broker, run_burst_worker


class Item(BaseModel):
    n: int
    fail_first: bool = False


# -- signatures, checked at declaration (no broker) --------------------------------------


def test_a_handler_may_ask_for_its_job_by_annotation_anywhere_after_the_payload() -> None:
    app = App(namespace="ctx")

    @app.task("a.plain")
    def plain(payload: Item) -> None: ...

    @app.task("a.context")
    def with_context(payload: Item, job: JobContext) -> None: ...

    @app.task("a.keyword")
    async def keyword_only(payload: Item, *, context: JobContext, note: str = "") -> None: ...

    @app.task("a.tx", transactional=True)
    def in_transaction(payload: Item, db: object, job: JobContext) -> None: ...

    assert app.get("a.plain").context_parameter is None
    assert app.get("a.context").context_parameter == "job"
    assert app.get("a.keyword").context_parameter == "context"
    assert app.get("a.tx").context_parameter == "job"


@pytest.mark.parametrize(
    ("transactional", "handler", "message"),
    [
        (
            False,
            lambda: _second,
            r"_second\(payload: .*Item.*, extra\).*nothing is passed for 'extra'",
        ),
        (False, lambda: _two_contexts, r"only one parameter may be annotated JobContext"),
        (True, lambda: _one_argument, r"calls \(payload, db\).*fewer than 2 positional"),
        (True, lambda: _context_as_db, r"its JobContext 'job' must come after those"),
    ],
)
def test_a_handler_the_worker_could_not_call_is_refused_at_declaration(
    transactional: bool, handler: Callable[[], Callable[..., None]], message: str
) -> None:
    app = App(namespace="ctx")
    with pytest.raises(ConfigurationError, match=message):
        app.task("a.b", transactional=transactional)(handler())


def _second(payload: Item, extra) -> None: ...  # type: ignore[no-untyped-def]
def _two_contexts(payload: Item, a: JobContext, b: JobContext) -> None: ...
def _one_argument(payload: Item) -> None: ...
def _context_as_db(payload: Item, job: JobContext) -> None: ...


def test_a_context_for_tests_and_its_time_left() -> None:
    job = JobContext.for_test("a.b", attempt=2, max_attempts=2, time_limit=60)
    assert job.is_last_attempt
    left = job.time_left()
    assert left is not None
    assert 0 < left <= 60
    assert JobContext.for_test().time_left() is None


# -- in the worker -------------------------------------------------------------------------


class Seen:
    def __init__(self) -> None:
        self.contexts: list[JobContext] = []
        self._lock = threading.Lock()

    def add(self, context: JobContext) -> None:
        with self._lock:
            self.contexts.append(context)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_both_paths_give_the_handler_its_job(
    broker: Broker, make_app: Callable[[], App], kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    seen = Seen()
    retry = RetryPolicy(max_attempts=3, base_delay=0.1, max_delay=0.1, jitter=False)

    def handle(payload: Item, job: JobContext) -> None:
        seen.add(job)
        job.log.info("handling %d", payload.n)
        if payload.fail_first and job.attempt == 1:
            raise ConnectionError("first attempt fails")

    async def handle_async(payload: Item, job: JobContext) -> None:
        handle(payload, job)

    app.task("ctx.run", retry=retry, time_limit=30)(handle if kind == "sync" else handle_async)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with Publisher(broker.url, app) as publisher:
        now = publisher.publish(
            "ctx.run", Item(n=1), idempotency_key="now", traceparent=traceparent
        )
        later = publisher.publish("ctx.run", Item(n=2), idempotency_key="later", delay=0.3)
        retried = publisher.publish("ctx.run", Item(n=3, fail_first=True), idempotency_key="again")
    with caplog.at_level(logging.INFO, logger="broker_jobs.handler"):
        run_burst_worker(broker, app, MemoryStore(), worker_id="ctx-worker")

    by_key = {(c.idempotency_key, c.attempt): c for c in seen.contexts}
    assert set(by_key) == {("now", 1), ("later", 1), ("again", 1), ("again", 2)}
    first = by_key["now", 1]  # the fast path
    assert (first.job_id, first.task, first.max_attempts) == (now.id, "ctx.run", 3)
    assert first.published_at == now.created_at
    assert first.worker_id == "ctx-worker"
    assert first.traceparent == traceparent
    assert first.time_limit == 30
    delayed = by_key["later", 1]  # held until due: the per-delivery path
    assert delayed.job_id == later.id
    assert delayed.due_at == later.due_at
    assert by_key["again", 2].job_id == retried.id
    assert by_key["again", 2].is_last_attempt is False
    lines = [r for r in caplog.records if r.name == "broker_jobs.handler"]
    assert {(r.job_id, r.attempt) for r in lines} >= {(now.id, 1), (retried.id, 2)}  # type: ignore[attr-defined]


def test_a_transactional_handler_gets_its_job_inside_the_transaction(
    broker: Broker, make_app: Callable[[], App], tmp_path: Path
) -> None:
    app = make_app()
    seen = Seen()

    @app.task("ctx.tx", transactional=True)
    def write(payload: Item, db: object, job: JobContext) -> None:
        seen.add(job)

    with Publisher(broker.url, app) as publisher:
        [job] = publisher.publish_many([JobRequest("ctx.tx", Item(n=1))])
    with SQLiteStore(tmp_path / "ledger.db") as store:
        run_burst_worker(broker, app, store, worker_id="ctx-worker")
    assert [(c.job_id, c.attempt, c.worker_id) for c in seen.contexts] == [
        (job.id, 1, "ctx-worker")
    ]
