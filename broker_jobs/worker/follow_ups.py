"""A job's next steps, exactly once (docs/worker.md, "Next steps").

    handler: job.then(task, payload)   -> built and checked now (a FollowUpError fails
                                          the attempt; nothing is recorded)
    success recorded WITH the follow-ups, in one transaction of the ledger
    each follow-up published, confirmed -> recorded queued (or scheduled), as a
    publisher with a ledger records its jobs -> the record marked sent -> the
    delivery acked

A worker that dies anywhere in between leaves the delivery unacked. Its redelivery
meets the success in the ledger (a duplicate: the handler does not run again) and
publishes the recorded follow-ups again, with the ids and keys they were recorded
with, before it is acked: a copy published twice is a duplicate for the worker that
claims it, so each next step runs once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from broker_jobs.app import App, TaskSpec
from broker_jobs.envelope import Job
from broker_jobs.errors import BrokerJobsError, FollowUpError
from broker_jobs.job_context import FollowUpBuilder, follow_up_key
from broker_jobs.plural import plural
from broker_jobs.publish.prepare import JobFactory
from broker_jobs.store.base import JobRecord, Status, Store
from broker_jobs.worker.link import LinkStoppedError

log = logging.getLogger(__name__)

#: Seconds between two tries of a follow-up the broker refused (an unroutable task:
#: its queue is not declared), doubling up to :data:`REFUSED_RETRY_MAX`.
REFUSED_RETRY_FIRST, REFUSED_RETRY_MAX = 1.0, 30.0


class FollowUps:
    """Builds the follow-ups handlers ask for, and publishes recorded ones."""

    def __init__(
        self,
        app: App,
        store: Store,
        *,
        publish_job: Callable[[Job], Awaitable[None]],
        recorded: Callable[..., Coroutine[Any, Any, Any]],
        stopping: Callable[[], bool],
    ) -> None:
        self._factory = JobFactory(app, None)
        self._store = store
        self._publish_job = publish_job
        self._recorded = recorded
        self._stopping = stopping

    def builder(self, parent: Job) -> FollowUpBuilder:
        """What ``JobContext.then`` of ``parent``'s handler builds its jobs with."""
        return functools.partial(build_follow_up, self._factory, parent)

    async def send(self, parent: Job, jobs: Sequence[Job]) -> bool:
        """Publish ``parent``'s recorded follow-ups (each confirmed), record them queued
        (an operator sees, and may cancel, a next step that no worker took yet; a key
        claimed already keeps its record), then mark them sent. False if the worker
        stops before the broker confirmed them all: the delivery is then left unacked,
        and its redelivery sends them."""
        try:
            for job in jobs:
                await self._publish(parent, job)
        except LinkStoppedError:
            return False
        await self._recorded(self._store.record_published, list(jobs))
        await self._recorded(self._store.mark_follow_ups_sent, parent.idempotency_key)
        return True

    async def after_duplicate(self, parent: Job, spec: TaskSpec[Any], record: JobRecord) -> bool:
        """A delivery the ledger skipped as a duplicate: when the job had succeeded and
        its handler can ask for follow-ups (it takes a JobContext), publish those not
        confirmed yet (:meth:`send_pending`). Other tasks cost no read."""
        if spec.context_parameter is None or record.status is not Status.SUCCEEDED:
            return True
        return await self.send_pending(parent, record)

    async def send_pending(self, parent: Job, record: JobRecord) -> bool:
        """A delivery of ``parent`` whose success the ledger has: publish the
        follow-ups recorded with it (``record``) that the broker has not confirmed (its
        worker died between the record and the ack). False as for :meth:`send`."""
        kept = await self._recorded(self._store.output_of, record)
        if kept is None or not kept.follow_ups_pending:
            return True
        log.info(
            "job %s (key %s) succeeded before its follow-ups were confirmed: publishing"
            " its %d recorded follow-ups again (same ids and keys)",
            parent.id,
            parent.idempotency_key,
            len(kept.follow_ups),
        )
        return await self.send(parent, kept.follow_ups)

    async def _publish(self, parent: Job, job: Job) -> None:
        """One follow-up, confirmed. A refusal by the broker (its task's queue is not
        declared, a nack) is said and tried again, backing off, while the delivery is
        held: the parent succeeded, and its next step must not be lost to an
        operator's missing topology. Raises LinkStoppedError when the worker stops."""
        wait = REFUSED_RETRY_FIRST
        refusals = 0
        while True:
            try:
                await self._publish_job(job)
            except LinkStoppedError:
                raise
            except Exception as error:
                if self._stopping():
                    raise LinkStoppedError() from error
                refusals += 1
                log.warning(
                    "follow-up %s (task %s) of job %s was refused (%s); trying again in %.0f s",
                    job.id,
                    job.task,
                    parent.id,
                    error,
                    wait,
                )
                await asyncio.sleep(wait)
                wait = min(wait * 2, REFUSED_RETRY_MAX)
            else:
                if refusals:
                    log.info(
                        "follow-up %s (task %s) of job %s published after %s",
                        job.id,
                        job.task,
                        parent.id,
                        plural(refusals, "refusal"),
                    )
                return


def build_follow_up(
    factory: JobFactory,
    parent: Job,
    task: Any,
    payload: Any,
    *,
    number: int,
    idempotency_key: str | None,
    delay: Any,
    eta: Any,
    priority: Any,
) -> Job:
    """``parent``'s ``number``-th follow-up, validated as a publish of ``factory``'s
    app validates it; its key derived from the parent's unless given, its trace the
    parent's. A :class:`FollowUpError` if it cannot be published."""
    try:
        prepared = factory.build(
            task,
            payload,
            idempotency_key=idempotency_key or follow_up_key(parent.idempotency_key, number),
            delay=delay,
            eta=eta,
            priority=priority,
            traceparent=parent.traceparent,
            tracestate=parent.tracestate,
        )
    except (BrokerJobsError, TypeError, ValueError) as error:
        raise FollowUpError(parent.task, str(error)) from None
    return prepared.job
