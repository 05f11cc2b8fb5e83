"""OpenTelemetry spans for publishing and running jobs, linked by the W3C trace
context that travels in the job (``traceparent``/``tracestate`` headers).

Optional: without the ``otel`` extra (opentelemetry-api) every function here is a
no-op that costs a function call. broker-jobs never configures OpenTelemetry: the
spans go to the global tracer provider the application set up (or to the one given
to :func:`set_tracer_provider`); with none set up, OpenTelemetry's own no-op tracer
takes them.

How the context travels (``docs/metrics.md``, "Traces"):

* :func:`publish_span` starts a ``PRODUCER`` span ``publish <task>``. Its parent is
  the job's own ``traceparent``/``tracestate`` when the caller passed them (a
  service forwarding a trace it received by other means), else the current span.
  The job that is sent carries the producer span's context, as OpenTelemetry's
  propagation expects: the consumer's span is the producer span's child. A
  non-recording span (no SDK, or sampled out) carries on the context it was given,
  so a caller's ``traceparent`` is passed through unchanged then.
* :func:`publish_spans` does the same for each job of a batch, with spans that are
  not made current (they are siblings, not a chain), ended together.
* :func:`execution_span` starts a ``CONSUMER`` span ``process <task>`` whose parent
  is extracted from the job's trace headers; a job without them gets a root span
  (never a child of whatever context the worker happens to hold).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from broker_jobs.envelope import Job

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "TRACER_NAME",
    "PublishSpans",
    "execution_span",
    "publish_span",
    "publishing_traced",
    "publish_spans",
    "set_tracer_provider",
]

#: The instrumentation scope of every span broker-jobs starts.
TRACER_NAME = "broker_jobs"

#: Set by :func:`set_tracer_provider`; ``None``: OpenTelemetry's global provider.
_provider: TracerProvider | None = None
#: The tracer of the provider it came from, so that it is made once per provider.
_tracer_cache: tuple[object, Tracer] | None = None
#: Until when (``time.monotonic``) the provider is taken to be inert (:func:`_provider_inert`).
_inert_until = 0.0
_INERT_FOR = 1.0


@dataclass(frozen=True)
class _Api:
    """What broker-jobs uses of opentelemetry-api, imported on first use."""

    trace: ModuleType
    propagator: TraceContextTextMapPropagator
    new_context: type[Context]


@functools.cache
def _api() -> _Api | None:
    """opentelemetry-api, or ``None`` without it (cached; ``_api.cache_clear()``)."""
    try:
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.context import Context  # noqa: PLC0415
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator,
        )
    except ImportError:
        return None
    return _Api(trace, TraceContextTextMapPropagator(), Context)


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Send broker-jobs' spans to ``provider`` instead of OpenTelemetry's global one
    (``None``: back to the global one). For tests, or an application that keeps
    broker-jobs' spans apart; most applications set the global provider instead."""
    global _provider, _tracer_cache, _inert_until  # noqa: PLW0603
    _provider = provider
    _tracer_cache = None
    _inert_until = 0.0


def _tracer(api: _Api) -> Tracer:
    global _tracer_cache  # noqa: PLW0603
    provider = _provider if _provider is not None else api.trace.get_tracer_provider()
    cached = _tracer_cache
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer: Tracer = provider.get_tracer(TRACER_NAME, _version())
    _tracer_cache = (provider, tracer)
    return tracer


@functools.cache
def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("broker-jobs")
    except PackageNotFoundError:
        return None


def _inert(api: _Api) -> bool:
    """No span would be recorded and no context is current: no tracer provider was
    set up (OpenTelemetry's proxy, or its no-op provider) and no span, not even one
    extracted from elsewhere, is current. Spans then change nothing a job carries:
    they are skipped (~17 us of a single publish's ~220 us of CPU)."""
    return _provider_inert(api) and not api.trace.get_current_span().get_span_context().is_valid


def _provider_inert(api: _Api) -> bool:
    """No tracer provider set up. Asking OpenTelemetry reads the environment (~3 % of
    a worker's CPU per job): a "no" is kept for a second, so a global provider set
    up later is used from at most a second on."""
    global _inert_until  # noqa: PLW0603
    now = time.monotonic()
    if now < _inert_until:
        return True
    trace = api.trace
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    inert = isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    _inert_until = now + _INERT_FOR if inert else 0.0
    return inert


def _job_context(api: _Api, job: Job) -> Context | None:
    """The context of the job's trace headers, or ``None`` when it has none."""
    if not job.traceparent:
        return None
    carrier = {"traceparent": job.traceparent}
    if job.tracestate:
        carrier["tracestate"] = job.tracestate
    context: Context = api.propagator.extract(carrier, context=api.new_context())
    return context


def _carrying(api: _Api, job: Job, span: Span) -> Job:
    """``job`` carrying ``span``'s context (the same job when it already does, or
    when the span has no valid context: nothing to propagate)."""
    span_context = span.get_span_context()
    if not span_context.is_valid:
        return job
    carrier: dict[str, str] = {}
    api.propagator.inject(carrier, context=api.trace.set_span_in_context(span))
    traceparent, tracestate = carrier.get("traceparent"), carrier.get("tracestate")
    if (traceparent, tracestate) == (job.traceparent, job.tracestate):
        return job
    # Both values come from the propagator, well formed: no need to validate again.
    return job.model_copy(update={"traceparent": traceparent, "tracestate": tracestate})


def _publish_attributes(job: Job, exchange: str, routing_key: str) -> dict[str, AttributeValue]:
    return {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": exchange,
        "messaging.rabbitmq.destination.routing_key": routing_key,
        "messaging.message.id": job.id,
        "broker_jobs.task": job.task,
        "broker_jobs.idempotency_key": job.idempotency_key,
        "broker_jobs.attempt": job.attempt,
    }


def _start_publish(api: _Api, job: Job, exchange: str, routing_key: str) -> tuple[Span, Job]:
    """A producer span for ``job``, and the job carrying the span's context."""
    parent = _job_context(api, job)  # None: the current context
    span = _tracer(api).start_span(
        f"publish {job.task}",
        context=parent,
        kind=api.trace.SpanKind.PRODUCER,
        attributes=_publish_attributes(job, exchange, routing_key),
    )
    if parent is not None and (
        span.get_span_context() is api.trace.get_current_span(parent).get_span_context()
    ):
        # OpenTelemetry's no-op tracer (no SDK) gives the span its parent's context:
        # the caller's headers pass through as they are (without injecting them again).
        return span, job
    return span, _carrying(api, job, span)


def _fail(api: _Api, span: Span, error: BaseException) -> None:
    if span.is_recording():
        span.record_exception(error)
        span.set_attribute("error.type", type(error).__qualname__)
        span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, str(error)[:500]))


def publishing_traced() -> bool:
    """Whether a publish gets a producer span: OpenTelemetry is installed, and a
    tracer provider is set up or a span is current. Otherwise :func:`publish_span`
    yields the job as it is, and a caller may skip entering it (~8 us of a single
    publish's ~190 us of CPU)."""
    return _publishing_api() is not None


def _publishing_api() -> _Api | None:
    """OpenTelemetry's API where a publish gets a producer span, else None."""
    api = _api()
    return None if api is None or _inert(api) else api


@contextmanager
def publish_span(job: Job, *, exchange: str, routing_key: str) -> Iterator[Job]:
    """Around one job's publish and confirm: a producer span, current inside the
    block. Yields the job to send: ``job`` carrying the span's trace context. An
    exception leaving the block is recorded on the span (status ERROR)."""
    api = _publishing_api()
    if api is None:  # the job goes as it is (its own trace headers too)
        yield job
        return
    span, sent = _start_publish(api, job, exchange, routing_key)
    with api.trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            yield sent
        except BaseException as error:
            _fail(api, span, error)
            raise


class PublishSpans:
    """The producer spans of one batch, one per job, ended together by :meth:`end`.
    ``jobs`` are the jobs to send, each carrying its span's context, in order."""

    def __init__(self, api: _Api | None, jobs: list[Job], spans: list[Span]) -> None:
        self._api = api
        self.jobs = jobs
        self._spans = spans

    def end(
        self,
        failed: Mapping[str, BaseException] | None = None,
        error: BaseException | None = None,
    ) -> None:
        """End every span: those of ``failed`` (by job id) with their error, all of
        them with ``error`` when the whole batch raised."""
        api = self._api
        if api is None:
            return
        failures = failed or {}
        for job, span in zip(self.jobs, self._spans, strict=True):
            failure = error if error is not None else failures.get(job.id)
            if failure is not None:
                _fail(api, span, failure)
            span.end()
        self._spans = []


def publish_spans(items: Sequence[tuple[Job, str, str]]) -> PublishSpans:
    """Start a producer span for each ``(job, exchange, routing_key)`` of a batch
    (not made current); the caller ends them with :meth:`PublishSpans.end`."""
    api = _publishing_api()
    if api is None:
        return PublishSpans(None, [job for job, _, _ in items], [])
    jobs, spans = [], []
    for job, exchange, routing_key in items:
        span, sent = _start_publish(api, job, exchange, routing_key)
        jobs.append(sent)
        spans.append(span)
    return PublishSpans(api, jobs, spans)


def execution_traced(job: Job) -> bool:
    """Whether a run of ``job`` gets a consumer span: OpenTelemetry is installed, and
    the job carries a trace context, or a tracer provider is set up or a span is
    current. Otherwise :func:`execution_span` does nothing, and a caller may skip
    entering it (~1 us a run, a few on a cold CPU)."""
    return _execution_api(job) is not None


def _execution_api(job: Job) -> _Api | None:
    """OpenTelemetry's API where a run of ``job`` gets a consumer span, else None (a
    no-op root span is skipped)."""
    api = _api()
    if api is None or (not job.traceparent and _inert(api)):
        return None
    return api


@contextmanager
def execution_span(job: Job, *, queue: str | None = None) -> Iterator[None]:
    """Around a handler's run: a consumer span ``process <task>``, current inside
    the block, child of the job's trace context (a root span when the job carries
    none). An exception leaving the block is recorded (status ERROR) and re-raised."""
    api = _execution_api(job)
    if api is None:
        yield
        return
    attributes: dict[str, AttributeValue] = {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": job.id,
        "broker_jobs.task": job.task,
        "broker_jobs.idempotency_key": job.idempotency_key,
        "broker_jobs.attempt": job.attempt,
    }
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    parent = _job_context(api, job)
    span = _tracer(api).start_span(
        f"process {job.task}",
        # A job without trace headers starts a trace of its own.
        context=parent if parent is not None else api.new_context(),
        kind=api.trace.SpanKind.CONSUMER,
        attributes=attributes,
    )
    with api.trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            yield
        except BaseException as error:
            _fail(api, span, error)
            raise
