"""OpenTelemetry spans for publishing and running jobs, linked by the W3C trace
context that travels in the job (``traceparent``/``tracestate`` headers).

Optional: without the ``otel`` extra (opentelemetry-api) every function here is a
no-op. (Stub: the spans are filled in by the tracing change of issue 15.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from broker_jobs.envelope import Job


@contextmanager
def execution_span(job: Job) -> Iterator[None]:
    """Around a handler's run: a consumer span, child of the job's trace context."""
    yield


@contextmanager
def publish_span(job: Job) -> Iterator[None]:
    """Around a job's publish: a producer span whose context the job carries."""
    yield
