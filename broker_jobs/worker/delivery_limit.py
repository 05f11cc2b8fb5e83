"""A job at its quorum queue's delivery limit: a crash loop, or a job to rescue.

RabbitMQ counts every return of a delivery against the queue's delivery limit
(``x-delivery-count``), and dead-letters the message past it, with nobody left to
record why. A return is a worker that died, or a connection that dropped, while it
held the delivery, whatever the delivery was doing: its handler running (a crash the
job may have caused), or only waiting (prefetched, queued for a thread, waiting for
the lease of a holder that died). In a storm of worker kills, a healthy job that
waits a lease (60 s by default) for its dead holder is held by many workers that die
in turn, and reached the limit without ever running again: 85 of 16,000 jobs in
``bench.faults`` worker-kill (PostgreSQL, 18 kills) before this rule.

So on the last delivery the queue allows, the ledger decides instead of the count.
A crash is an execution that ended because its lease lapsed (a ``lost`` execution in
the ledger, or the running one under a lapsed lease): a job whose runs killed as
many workers as the limit allows is a crash loop and is dead-lettered, recorded
dead. Any other job there is *rescued*: published again as a fresh message (delivery
count 0, the same id, key and attempt; delayed until its holder's lease lapses if a
lease is live), confirmed, then the delivery is acked. A rescue needs as many returns
again as the limit, each a worker's death or a lost connection, so it cannot loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from broker_jobs.store.base import TERMINAL, JobRecord, Status
from broker_jobs.worker.dead_letters import DeathCause
from topology.model import QueueOptions, QueueType

#: Seconds after a lease's end that a rescued copy waiting for it arrives (clock
#: differences between the worker and the ledger's server).
LEASE_MARGIN = 1.0


@dataclass(frozen=True)
class Rescue:
    """Publish the job again as a fresh message, then ack the delivery."""

    #: Seconds until the copy is due (the holder's lease lapses); None: at once.
    delay: float | None
    why: str
    #: The delivery's ``x-delivery-count`` (it was delivered one time more).
    count: int


def at_delivery_limit(queue: QueueOptions, count: object) -> bool:
    """Whether a delivery whose ``x-delivery-count`` header is ``count`` is the last its
    queue allows (only quorum queues count deliveries): the ledger judges it (both
    paths ask here; the fast path hands such a delivery to the per-delivery one)."""
    return (
        queue.queue_type is QueueType.QUORUM
        and isinstance(count, int)
        and count >= queue.delivery_limit
    )


def judge_last_delivery(
    *,
    count: int,
    limit: int,
    attempt: int,
    record: JobRecord | None,
    crashes_before: int,
    now: datetime,
) -> DeathCause | Rescue | None:
    """What to do with a delivery whose ``x-delivery-count`` is ``count`` (>= ``limit``,
    the queue's delivery limit): dead-letter it as a crash loop, rescue it, or None
    (go on: the claim decides; it is re-judged at each re-check while it waits).

    ``crashes_before``: the job's executions the ledger closed as ``lost`` (their
    lease lapsed and another claim took the job over)."""
    if record is not None and record.status in TERMINAL:
        return None  # a duplicate: the claim acks it
    if record is None or record.status is not Status.RUNNING or record.worker is None:
        # Never ran, ran and was retried, or was given back on a graceful stop: its
        # returns were deaths of workers that held it waiting, not crashes it caused.
        return Rescue(None, "it was not running when its workers died", count)
    lapsed = record.lease_until is None or record.lease_until <= now
    crashes = crashes_before + 1  # the running execution, once its lease has lapsed
    if lapsed and crashes >= limit:
        return DeathCause(
            "crash-loop",
            f"its worker died while running it: {crashes} runs ended by their worker's"
            f" death, delivered {count + 1} times, the queue's delivery limit is {limit};"
            f" last holder {record.worker}",
            attempt,
        )
    if lapsed:
        why = f"{crashes} of its runs ended by a worker's death, under {limit}"
        return Rescue(None, why, count)
    if crashes >= limit:
        return None  # held: if the holder is dead, its lapse makes this the limit-th crash
    assert record.lease_until is not None
    wait = (record.lease_until - now).total_seconds() + LEASE_MARGIN
    return Rescue(wait, f"it waits for the lease of {record.worker}", count)
