"""Traces (issue 15, item 5): publish and execution spans linked across a real
broker by the W3C trace context the job carries, with OpenTelemetry's messaging
attributes; and nothing changes without OpenTelemetry.

Spans go to an SDK provider with an in-memory exporter given to
``tracing.set_tracer_provider`` (never OpenTelemetry's global provider, which a
process can set only once)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

from broker_jobs import App, Job, JobRequest
from broker_jobs.errors import PublishBatchError, UnroutableError
from broker_jobs.observe import tracing
from broker_jobs.retry import PermanentError, RetryPolicy
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.sqlite import SQLiteStore
from tests.support import AnyPublisher, Broker, drain, run_burst_worker
from topology import declare

pytestmark = pytest.mark.broker

MakePublisher = Callable[..., AnyPublisher]
CALLER_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Item(BaseModel):
    n: int


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """broker-jobs' spans, kept in memory (an SDK provider of this test only)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.set_tracer_provider(provider)
    yield memory
    tracing.set_tracer_provider(None)
    provider.shutdown()


@pytest.fixture
def test_tracer(exporter: InMemorySpanExporter) -> trace.Tracer:
    """A tracer for the test's own spans (the caller's), exported beside broker-jobs'."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("tests")


@pytest.fixture
def app(make_app: Callable[[], App]) -> App:
    app = make_app()
    once = RetryPolicy(max_attempts=2, base_delay=0.2, max_delay=0.2, jitter=False)

    @app.task("trace.ok")
    def ok(payload: Item) -> None:
        pass

    @app.task("trace.async")
    async def ok_async(payload: Item) -> None:
        await asyncio.sleep(0)

    @app.task("trace.reject")
    def reject(payload: Item) -> None:
        raise PermanentError(f"item {payload.n} can never work")

    attempts: dict[int, int] = {}

    @app.task("trace.flaky", retry=once)
    def flaky(payload: Item) -> None:
        attempts[payload.n] = attempts.get(payload.n, 0) + 1
        if attempts[payload.n] == 1:
            raise ConnectionError("first attempt fails")

    return app


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = spans_named(exporter, name)
    assert len(found) == 1, [span.name for span in exporter.get_finished_spans()]
    return found[0]


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def traceparent_of(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"00-{trace_id(span):032x}-{span_id(span):016x}-{span.context.trace_flags:02x}"


@pytest.mark.parametrize("task", ["trace.ok", "trace.async"])
def test_the_consumer_span_is_the_child_of_the_producer_span_across_the_broker(
    broker: Broker,
    app: App,
    make_publisher: MakePublisher,
    exporter: InMemorySpanExporter,
    test_tracer: trace.Tracer,
    task: str,
) -> None:
    publisher = make_publisher(app)
    with test_tracer.start_as_current_span("request") as request:
        job = publisher.publish(task, Item(n=1))
    run_burst_worker(broker, app, MemoryStore())

    parent = one(exporter, "request")
    producer = one(exporter, f"publish {task}")
    consumer = one(exporter, f"process {task}")
    assert producer.kind is SpanKind.PRODUCER
    assert consumer.kind is SpanKind.CONSUMER
    assert trace_id(producer) == trace_id(consumer) == request.get_span_context().trace_id
    assert parent_id(producer) == span_id(parent)
    assert parent_id(consumer) == span_id(producer)
    # The job returned is the job sent: it carries the producer span's context.
    assert job.traceparent == traceparent_of(producer)
    assert producer.status.status_code is StatusCode.UNSET
    assert consumer.status.status_code is StatusCode.UNSET

    assert dict(producer.attributes or {}) == {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": app.names.work_exchange,
        "messaging.rabbitmq.destination.routing_key": task,
        "messaging.message.id": job.id,
        "broker_jobs.task": task,
        "broker_jobs.idempotency_key": job.idempotency_key,
        "broker_jobs.attempt": 1,
    }
    consumed = dict(consumer.attributes or {})
    assert consumed["messaging.system"] == "rabbitmq"
    assert consumed["messaging.operation.type"] == "process"
    assert consumed["messaging.operation.name"] == "process"
    assert consumed["messaging.message.id"] == job.id
    assert consumed["broker_jobs.task"] == task
    assert consumed["broker_jobs.idempotency_key"] == job.idempotency_key
    assert consumed["broker_jobs.attempt"] == 1
    assert producer.instrumentation_scope is not None
    assert producer.instrumentation_scope.name == "broker_jobs"


def test_a_batch_has_a_producer_span_per_job_each_the_parent_of_its_run(
    broker: Broker,
    app: App,
    make_publisher: MakePublisher,
    exporter: InMemorySpanExporter,
    test_tracer: trace.Tracer,
) -> None:
    publisher = make_publisher(app)
    with test_tracer.start_as_current_span("import"):
        jobs = publisher.publish_many([JobRequest("trace.ok", {"n": n}) for n in range(5)])
    run_burst_worker(broker, app, MemoryStore())

    parent = one(exporter, "import")
    producers = spans_named(exporter, "publish trace.ok")
    consumers = spans_named(exporter, "process trace.ok")
    assert len(producers) == len(consumers) == 5
    # Siblings under the caller's span, not a chain.
    assert {parent_id(span) for span in producers} == {span_id(parent)}
    by_message = {span.attributes["messaging.message.id"]: span for span in producers}  # type: ignore[index]
    assert set(by_message) == {job.id for job in jobs}
    for job in jobs:
        assert job.traceparent == traceparent_of(by_message[job.id])
    assert {parent_id(span) for span in consumers} == {span_id(span) for span in producers}
    assert {trace_id(span) for span in producers + consumers} == {trace_id(parent)}


def test_a_failing_handler_makes_an_error_span_and_its_retry_a_new_pair(
    broker: Broker,
    app: App,
    make_publisher: MakePublisher,
    exporter: InMemorySpanExporter,
    test_tracer: trace.Tracer,
) -> None:
    publisher = make_publisher(app)
    with test_tracer.start_as_current_span("request"):
        publisher.publish("trace.reject", Item(n=7))
        flaky = publisher.publish("trace.flaky", Item(n=8))
    run_burst_worker(broker, app, MemoryStore())

    rejected = one(exporter, "process trace.reject")
    assert rejected.status.status_code is StatusCode.ERROR
    assert "item 7 can never work" in (rejected.status.description or "")
    assert (rejected.attributes or {})["error.type"] == "PermanentError"
    [event] = [event for event in rejected.events if event.name == "exception"]
    assert (event.attributes or {})["exception.type"].endswith("PermanentError")  # type: ignore[union-attr]

    # The flaky job: attempt 1 fails, the worker publishes attempt 2, which succeeds.
    runs = sorted(
        spans_named(exporter, "process trace.flaky"),
        key=lambda span: (span.attributes or {})["broker_jobs.attempt"],  # type: ignore[arg-type,return-value]
    )
    assert [(span.attributes or {})["broker_jobs.attempt"] for span in runs] == [1, 2]
    assert [span.status.status_code for span in runs] == [StatusCode.ERROR, StatusCode.UNSET]
    first_publish, retry_publish = sorted(
        spans_named(exporter, "publish trace.flaky"),
        key=lambda span: (span.attributes or {})["broker_jobs.attempt"],  # type: ignore[arg-type,return-value]
    )
    assert (retry_publish.attributes or {})["messaging.message.id"] == flaky.id
    assert parent_id(runs[0]) == span_id(first_publish)
    assert parent_id(runs[1]) == span_id(retry_publish)
    assert {trace_id(span) for span in [*runs, first_publish, retry_publish]} == {
        trace_id(first_publish)
    }


def test_a_transactional_handler_runs_in_a_consumer_span_too(
    broker: Broker,
    make_app: Callable[[], App],
    make_publisher: MakePublisher,
    exporter: InMemorySpanExporter,
    tmp_path: Path,
) -> None:
    app = make_app()

    @app.task("trace.tx", transactional=True)
    def write(payload: Item, db: object) -> None:
        if payload.n == 2:
            raise ValueError("rolled back")

    publisher = make_publisher(app)
    jobs = [publisher.publish("trace.tx", Item(n=n)) for n in (1, 2)]
    with SQLiteStore(tmp_path / "ledger.db") as store:
        run_burst_worker(broker, app, store)

    runs = {
        (span.attributes or {})["messaging.message.id"]: span
        for span in spans_named(exporter, "process trace.tx")
    }
    producers = {
        (span.attributes or {})["messaging.message.id"]: span
        for span in spans_named(exporter, "publish trace.tx")
    }
    ok, failed = jobs
    assert runs[ok.id].status.status_code is StatusCode.UNSET
    assert StatusCode.ERROR in {
        span.status.status_code
        for span in spans_named(exporter, "process trace.tx")
        if (span.attributes or {})["messaging.message.id"] == failed.id
    }
    # Published outside any span: the producer span is a root, the consumer its child.
    assert producers[ok.id].parent is None
    assert parent_id(runs[ok.id]) == span_id(producers[ok.id])


def test_a_job_without_trace_headers_still_gets_a_root_consumer_span(
    broker: Broker,
    app: App,
    connection: pika.BlockingConnection,
    exporter: InMemorySpanExporter,
    test_tracer: trace.Tracer,
) -> None:
    declare(connection, app.topology(ladder=False))
    connection.channel().basic_publish(  # a publisher in another language, no trace
        app.names.work_exchange,
        "trace.async",
        b'{"n": 3}',
        pika.BasicProperties(
            content_type="application/json", message_id="plain-1", type="trace.async"
        ),
    )
    # An async handler runs on the loop, in the context the worker started in: a
    # span current there is not the job's parent.
    with test_tracer.start_as_current_span("unrelated"):
        run_burst_worker(broker, app, MemoryStore())
    consumer = one(exporter, "process trace.async")
    assert consumer.parent is None
    assert (consumer.attributes or {})["messaging.message.id"] == "plain-1"
    assert spans_named(exporter, "publish trace.async") == []


def test_a_callers_traceparent_is_the_producer_spans_parent(
    app: App,
    make_publisher: MakePublisher,
    connection: pika.BlockingConnection,
    exporter: InMemorySpanExporter,
) -> None:
    publisher = make_publisher(app)
    job = publisher.publish(
        "trace.ok", Item(n=4), traceparent=CALLER_TRACEPARENT, tracestate="vendor=x"
    )
    producer = one(exporter, "publish trace.ok")
    assert f"{trace_id(producer):032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert parent_id(producer) == 0xB7AD6B7169203331
    assert producer.parent is not None
    assert producer.parent.is_remote
    # The message carries the producer span's context, the caller's tracestate kept.
    assert job.traceparent == traceparent_of(producer)
    assert job.tracestate == "vendor=x"
    assert drain(connection, app.names.task_queue("trace.ok")) == [job]


def test_publish_failures_mark_their_producer_spans_failed(
    app: App,
    make_publisher: MakePublisher,
    connection: pika.BlockingConnection,
    exporter: InMemorySpanExporter,
) -> None:
    untyped = make_publisher(namespace=app.namespace)  # declares the exchanges only
    with pytest.raises(UnroutableError):
        untyped.publish("trace.nobody", {"n": 1})
    failed = one(exporter, "publish trace.nobody")
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "UnroutableError"

    exporter.clear()
    declare(connection, app.topology(ladder=False))
    with pytest.raises(PublishBatchError) as raised:
        untyped.publish_many(
            [JobRequest("trace.ok", {"n": 2}), JobRequest("trace.nobody", {"n": 3})]
        )
    assert len(raised.value.confirmed) == 1
    statuses = {span.name: span.status.status_code for span in exporter.get_finished_spans()}
    assert statuses == {
        "publish trace.ok": StatusCode.UNSET,
        "publish trace.nobody": StatusCode.ERROR,
    }


def test_without_an_sdk_the_trace_context_passes_through_unchanged(
    broker: Broker,
    app: App,
    make_publisher: MakePublisher,
    connection: pika.BlockingConnection,
) -> None:
    tracing.set_tracer_provider(trace.NoOpTracerProvider())  # OpenTelemetry's default
    try:
        publisher = make_publisher(app)
        given = publisher.publish(
            "trace.ok", Item(n=5), traceparent=CALLER_TRACEPARENT, tracestate="a=b"
        )
        plain = publisher.publish("trace.ok", Item(n=6))
        [batched] = publisher.publish_many([JobRequest("trace.ok", {"n": 7})])
    finally:
        tracing.set_tracer_provider(None)
    assert (given.traceparent, given.tracestate) == (CALLER_TRACEPARENT, "a=b")
    assert (plain.traceparent, plain.tracestate) == (None, None)
    assert (batched.traceparent, batched.tracestate) == (None, None)
    assert drain(connection, app.names.task_queue("trace.ok")) == [given, plain, batched]


def test_without_an_sdk_a_current_context_from_elsewhere_still_travels(
    broker: Broker, app: App, make_publisher: MakePublisher
) -> None:
    """No SDK, but a span context extracted from an incoming request is current: the
    job carries it (spans are skipped only when they would change nothing)."""
    tracing.set_tracer_provider(trace.NoOpTracerProvider())
    incoming = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=0x0AF7651916CD43DD8448EB211C80319C,
            span_id=0xB7AD6B7169203331,
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    )
    try:
        publisher = make_publisher(app)
        with trace.use_span(incoming):
            single = publisher.publish("trace.ok", Item(n=1))
            [batched] = publisher.publish_many([JobRequest("trace.ok", {"n": 2})])
        outside = publisher.publish("trace.ok", Item(n=3))
    finally:
        tracing.set_tracer_provider(None)
    expected = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert single.traceparent == expected
    assert batched.traceparent == expected
    assert outside.traceparent is None


@pytest.fixture
def without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if the ``otel`` extra were not installed: importing it fails."""
    for name in list(sys.modules):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
    tracing._api.cache_clear()
    yield
    monkeypatch.undo()
    tracing._api.cache_clear()


@pytest.mark.usefixtures("without_opentelemetry")
def test_without_opentelemetry_jobs_publish_and_run_as_before(
    broker: Broker,
    app: App,
    make_publisher: MakePublisher,
    exporter: InMemorySpanExporter,
) -> None:
    assert tracing._api() is None
    publisher = make_publisher(app)
    given = publisher.publish("trace.ok", Item(n=1), traceparent=CALLER_TRACEPARENT)
    plain = publisher.publish("trace.reject", Item(n=2))
    batch = publisher.publish_many([JobRequest("trace.ok", {"n": n}) for n in range(3)])
    assert given.traceparent == CALLER_TRACEPARENT
    assert plain.traceparent is None
    assert all(job.traceparent is None for job in batch)
    store = MemoryStore()
    run_burst_worker(broker, app, store)
    assert store.get(given.idempotency_key) is not None
    assert exporter.get_finished_spans() == ()  # the SDK provider is never reached

    job = Job(task="trace.ok")
    with tracing.publish_span(job, exchange="x", routing_key="k") as sent:
        assert sent is job
    with pytest.raises(ValueError, match="kept"), tracing.execution_span(job):
        raise ValueError("kept")
    spans = tracing.publish_spans([(job, "x", "k")])
    assert spans.jobs == [job]
    spans.end({job.id: ValueError("ignored")})
