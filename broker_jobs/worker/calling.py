"""How both of the worker's paths call a handler, and what a run leaves.

A handler is called with its payload (and ``db`` when transactional), and its job's
:class:`~broker_jobs.job_context.JobContext` by keyword when it declared a parameter
for one (:func:`broker_jobs.job_context.handler_parameters` checked that when the task
was declared). A handler that asks for nothing is called as it is: no context is made
for it. What it returns, and the follow-ups it asked for, are the success's
:class:`~broker_jobs.store.base.Output`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from broker_jobs.app import TaskSpec
from broker_jobs.envelope import Job
from broker_jobs.job_context import FollowUpBuilder, JobContext
from broker_jobs.store.base import Output, json_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandlerCall:
    """One run of a handler: what to call, and its job's context if it asked for one."""

    function: Callable[..., Any]
    spec: TaskSpec[Any]
    context: JobContext | None

    def output(self, returned: Any) -> Output | None:
        """What the success keeps: ``returned`` as JSON (unless the task opted out,
        or it returned None) and the follow-ups asked for; None for neither (the
        common case: the fast path's batch records it)."""
        result = None
        if returned is not None and self.spec.keep_result:
            value = (
                returned.model_dump(mode="json") if isinstance(returned, BaseModel) else returned
            )
            result = json_text(value)
            if result is None:
                _not_json(self.spec.name, type(returned).__name__)
        follow_ups = tuple(self.context.follow_ups) if self.context is not None else ()
        if result is None and not follow_ups:
            return None
        return Output(result, follow_ups)


class FollowUpBuilders(Protocol):
    def builder(self, parent: Job) -> FollowUpBuilder: ...


def bound_handler(
    spec: TaskSpec[Any], job: Job, worker_id: str, follow_ups: FollowUpBuilders | None = None
) -> HandlerCall:
    """``spec``'s handler for ``job``, its context bound if it asks for one (made now,
    as the handler starts: its time left counts from here); ``follow_ups`` builds the
    jobs its ``then`` asks for (:class:`~broker_jobs.worker.follow_ups.FollowUps`)."""
    handler = spec.handler
    assert handler is not None  # the worker runs only tasks with a handler
    if spec.context_parameter is None:
        return HandlerCall(handler, spec, None)
    context = JobContext.of(
        job,
        max_attempts=spec.retry.max_attempts,
        worker_id=worker_id,
        time_limit=spec.time_limit,
        follow_ups=None if follow_ups is None else follow_ups.builder(job),
    )
    return HandlerCall(
        functools.partial(handler, **{spec.context_parameter: context}), spec, context
    )


@functools.cache
def _not_json(task: str, kind: str) -> None:
    """Say once per task and type: a result that is no JSON is not kept (the job
    succeeded all the same)."""
    log.warning(
        "the handler of task %r returned a %s, which is not JSON: its result is not kept"
        " (return a pydantic model, dict, list, str, number or bool; or None)",
        task,
        kind,
    )
