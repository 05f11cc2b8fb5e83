"""How both of the worker's paths call a handler: with its payload (and ``db`` when
transactional), and its job's :class:`~broker_jobs.job_context.JobContext` by keyword
when it declared a parameter for one (:func:`broker_jobs.job_context.handler_parameters`
checked that when the task was declared). A handler that asks for nothing is called as
it is: no context is made for it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from broker_jobs.app import TaskSpec
from broker_jobs.envelope import Job
from broker_jobs.job_context import JobContext


def bound_handler(spec: TaskSpec[Any], job: Job, worker_id: str) -> Callable[..., Any]:
    """``spec``'s handler for ``job``, its context bound if it asks for one (made now,
    as the handler starts: its time left counts from here)."""
    handler = spec.handler
    assert handler is not None  # the worker runs only tasks with a handler
    if spec.context_parameter is None:
        return handler
    context = JobContext.of(
        job,
        max_attempts=spec.retry.max_attempts,
        worker_id=worker_id,
        time_limit=spec.time_limit,
    )
    return functools.partial(handler, **{spec.context_parameter: context})
