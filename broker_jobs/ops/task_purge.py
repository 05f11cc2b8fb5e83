"""Purging a task's pending jobs (``broker-jobs jobs purge TASK``): the ready
messages of its queues (every lane's) are deleted, then the jobs the ledger knows as
waiting (queued, scheduled, retrying) are recorded cancelled.

In that order: a job published between the two steps has its record cancelled and
its message kept, and a worker acks it without running it; a job a worker holds
prefetched (unacked: a purge cannot take it) is cancelled in the ledger, so it is
skipped too. A delayed job or a retry in the delay ladder (shared by the namespace's
tasks: not purged) is skipped when it arrives if the ledger knows it; one published
without the ledger then runs. Running jobs are not touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pika

from broker_jobs.errors import TopologyMissingError
from broker_jobs.ops.status import QueueProbe, lanes_found
from broker_jobs.store.base import CANCELLABLE, CancelOutcome, Store
from topology.names import Names

#: Records cancelled per ledger read.
CANCEL_BATCH = 500


@dataclass(frozen=True)
class PendingJobs:
    """What a purge of ``task`` would take: ``ready`` messages in ``queues`` and
    ``waiting`` records in the ledger."""

    task: str
    queues: tuple[str, ...]
    ready: int
    waiting: int

    def document(self) -> dict[str, object]:
        return {"task": self.task, "queues": list(self.queues), "ready": self.ready,
                "waiting": self.waiting}  # fmt: skip


@dataclass(frozen=True)
class PurgedJobs:
    """What a purge took: ``purged`` messages, ``cancelled`` ledger records."""

    task: str
    purged: int
    cancelled: int

    def document(self) -> dict[str, object]:
        return {"task": self.task, "purged": self.purged, "cancelled": self.cancelled}


def task_queues(
    connection: pika.BlockingConnection, names: Names, task: str, lanes: Sequence[str] | None
) -> tuple[str, ...]:
    """The queues of ``task``: ``lanes`` (the app's, when it has several), else those
    on the broker (an app's task of one queue, or a task named without the app: one
    declared with priorities or shards has several); a usage error if one is missing."""
    probe = QueueProbe(connection)
    try:
        if lanes:
            queues = tuple(lanes)
            missing = [queue for queue in queues if not probe.queue(queue).exists]
        else:  # found on the broker: each one exists
            queues = lanes_found(probe, names, task)
            missing = [] if queues else [names.task_queue(task)]
    finally:
        probe.close()
    if missing:
        raise TopologyMissingError(
            f"no queue '{missing[0]}'",
            or_else=f"or check the task's name ({task!r}) and namespace ({names.namespace!r})",
        )
    return queues


def pending(
    connection: pika.BlockingConnection,
    names: Names,
    task: str,
    store: Store,
    lanes: Sequence[str] | None = None,
) -> PendingJobs:
    """Count what :func:`purge_pending` would take (passive declares: read-only)."""
    queues = task_queues(connection, names, task, lanes)
    channel = connection.channel()
    try:
        ready = sum(
            channel.queue_declare(queue, passive=True).method.message_count or 0 for queue in queues
        )
    finally:
        if channel.is_open:
            channel.close()
    summary = store.task_summaries().get(task)
    waiting = 0 if summary is None else sum(summary.counts[status] for status in CANCELLABLE)
    return PendingJobs(task, queues, ready, waiting)


def purge_pending(
    connection: pika.BlockingConnection,
    names: Names,
    task: str,
    store: Store,
    lanes: Sequence[str] | None = None,
) -> PurgedJobs:
    """Purge ``task``'s queues, then cancel its waiting records (see the module)."""
    channel = connection.channel()
    try:
        purged = sum(
            channel.queue_purge(queue).method.message_count or 0
            for queue in task_queues(connection, names, task, lanes)
        )
    finally:
        if channel.is_open:
            channel.close()
    return PurgedJobs(task, purged, cancel_waiting(store, task))


def cancel_waiting(store: Store, task: str) -> int:
    """Record every waiting job of ``task`` cancelled; how many were."""
    cancelled = 0
    for status in CANCELLABLE:
        while records := store.find(task=task, status=status, limit=CANCEL_BATCH):
            done = sum(
                store.cancel(record.idempotency_key).outcome is CancelOutcome.CANCELLED
                for record in records
            )
            cancelled += done
            if not done:  # taken meanwhile (claimed, run): nothing more to cancel here
                break
    return cancelled
