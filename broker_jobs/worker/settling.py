"""The steps every delivery ends with, on both of the worker's paths (the fast path's
batches and the per-delivery protocol): renewing a running job's lease, recording
successes, acking settled deliveries, returning or leaving the others.

Each step is decided here once; a path hands it one delivery or a batch. The order
is the protocol's (docs/internals/execution.md): an outcome is recorded before its delivery is
acked, and a failure to record returns the delivery (its redelivery meets the
ledger's record again).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, TypeVar

from broker_jobs.envelope import Job
from broker_jobs.store.base import LeaseLostError, Output, Status, Store, StoreError
from broker_jobs.worker.acks import ChannelAcks
from broker_jobs.worker.ledger_gate import LedgerGate
from broker_jobs.worker.observer import JobObserver, Run

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Outcomes:
    """Counters of what the worker did, by outcome (for logs, tests and metrics)."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: str, count: int = 1) -> None:
        self.counts[outcome] += count


@dataclass(frozen=True)
class Finished:
    """A job whose handler returned, to be recorded as succeeded."""

    job: Job
    holder: str
    run: Run | None
    #: The handler's result and follow-ups to keep with the success (None: none).
    output: Output | None = None


@dataclass(frozen=True)
class Settled:
    """A delivery whose outcome is recorded, to be acked."""

    tag: int
    task: str
    outcome: str


#: How a step reaches the store: ``call(store_method, *args)`` off the loop, held
#: through a ledger outage (``Runner.recorded``), or tried once (``Runner.in_store``).
StoreCall = Callable[..., Coroutine[Any, Any, Any]]


class Settling:
    """The closing steps of a delivery, shared by both paths of one runner."""

    def __init__(
        self,
        store: Store,
        ledger: LedgerGate,
        observer: JobObserver,
        *,
        recorded: StoreCall,
        in_store: Callable[..., Any],
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._observer = observer
        self._recorded = recorded
        self._in_store = in_store
        self.outcomes = Outcomes()

    async def renew(self, job: Job, holder: str, lease: float) -> bool:
        """Renew ``holder``'s lease of a running job; False once it is lost (taken
        over: the job may run elsewhere, and recording its outcome will tell). A
        store outage is said once (the ledger's gate) and the lease renewed again at
        the next turn: True."""
        try:
            await self._in_store(self._store.renew, job.idempotency_key, holder, lease)
        except LeaseLostError:
            self._observer.lease_lost(job.task)
            log.warning("job %s's lease was taken over; it may run elsewhere", job.id)
            return False
        except StoreError as error:
            self._ledger.failed(error)
            return True
        self._ledger.answered()
        self._observer.renewed(job.task)
        return True

    def record_at_once(self, finished: Sequence[Finished]) -> list[Finished] | None:
        """:meth:`record_successes` here and now, in one store call, where the store
        can do it without waiting and no success keeps an output; None otherwise
        (nothing recorded: await :meth:`record_successes`). Raises what the store raises."""
        if any(done.output is not None for done in finished):
            return None
        lost = self._store.try_succeed_many([(d.job.idempotency_key, d.holder) for d in finished])
        if lost is None:
            return None
        # Tried once, at once: a lost key is one taken over.
        return self._successes(finished, _of_keys(finished, lost))

    async def record_successes(self, finished: Sequence[Finished]) -> list[Finished]:
        """Record the successes in one store call: at once on the loop where the store
        can do it without waiting, else on the store's thread, held through a ledger
        outage (the handlers ran: their deliveries stay unacked until it is written).
        Successes with an output (a result, follow-ups) go in a second call
        (``succeed_many_keeping``), each output in its success's transaction. A job
        whose lease was taken over meanwhile is said so, not raised. Returns the
        successes recorded; raises what the store raises otherwise (the caller returns
        the deliveries)."""
        pairs = [(d.job.idempotency_key, d.holder) for d in finished if d.output is None]
        keeping = [
            (d.job.idempotency_key, d.holder, d.output) for d in finished if d.output is not None
        ]
        lost: list[str] = []
        if pairs:
            tried = self._store.try_succeed_many(pairs)
            lost = (
                tried
                if tried is not None
                else await self._recorded(self._store.succeed_many, pairs)
            )
        if keeping:
            lost += await self._recorded(self._store.succeed_many_keeping, keeping)
        if not lost:
            return self._successes(finished, [])
        # Held through an outage, the call may have been tried before: a try whose
        # commit went through and whose answer was lost (a connection dropped in the
        # commit) leaves successes that this try finds already there, under their
        # own holders. They were recorded: their follow-ups go out, they are acked.
        taken_over = []
        for done in _of_keys(finished, lost):
            record = await self._recorded(self._store.get, done.job.idempotency_key)
            if record is None or record.outcome_by(done.holder) is not Status.SUCCEEDED:
                taken_over.append(done)
        return self._successes(finished, taken_over)

    def _successes(
        self, finished: Sequence[Finished], taken_over: Sequence[Finished]
    ) -> list[Finished]:
        """Of ``finished``, now recorded, those that were still theirs to record:
        those whose lease was taken over are said, and left out."""
        observer = self._observer
        for done in taken_over:
            observer.lease_lost(done.job.task)
            log.warning(
                "job %s (key %s) finished after its lease was taken over",
                done.job.id,
                done.job.idempotency_key,
            )
        gone = {id(done) for done in taken_over}
        recorded = [done for done in finished if id(done) not in gone]
        observer.succeeded_all((done.job, done.run) for done in recorded)
        return recorded

    async def ack(self, acks: ChannelAcks, settled: Sequence[Settled]) -> None:
        """Ack deliveries of one channel whose outcomes are recorded (one ``multiple``
        frame where it can) and count their outcomes. A failed or lost ack is counted,
        not raised: the outcomes are recorded, so the redeliveries find them settled."""
        try:
            if len(settled) == 1:  # one settlement: a frame of its own (see acks.ack)
                acked = await acks.ack(settled[0].tag)
            else:
                acked = await acks.ack_many([entry.tag for entry in settled])
        except Exception:
            self._ack_failed(settled)
            return
        self._count(settled, acked)

    def ack_at_once(self, acks: ChannelAcks, settled: Sequence[Settled]) -> bool:
        """:meth:`ack`, here and now, where the frame needs no waiting (the channel
        sends nothing else and aiormq's write queue is empty); False otherwise
        (nothing done: await :meth:`ack`)."""
        try:
            if len(settled) == 1:
                acked = acks.ack_at_once(settled[0].tag)
            else:
                acked = acks.ack_many_at_once([entry.tag for entry in settled])
        except Exception:
            self._ack_failed(settled)
            return True
        if acked is None:
            return False
        self._count(settled, acked)
        return True

    def _ack_failed(self, settled: Sequence[Settled]) -> None:
        log.warning("acking %d deliveries failed; they will be redelivered", len(settled))
        self.outcomes.add("ack-failed", len(settled))

    def _count(self, settled: Sequence[Settled], acked: bool) -> None:
        """Count the outcomes of ``settled``; those of a lost channel's as such too."""
        for task_outcome, group in groupby(settled, key=lambda entry: (entry.task, entry.outcome)):
            count = sum(1 for _ in group)
            task, outcome = task_outcome
            # First: who waits for outcomes sees the metrics.
            self._observer.settled(task, outcome, count)
            self.outcomes.add(outcome, count)
        if not acked:
            self.outcomes.add("ack-lost", len(settled))

    async def give_back(
        self, acks: ChannelAcks, tag: int, task: str, *, outcome: str = "returned"
    ) -> None:
        """Return the delivery to the queue (our own failure, or its task paused); its
        redelivery meets the store's record again. Counted as ``outcome``."""
        try:
            await acks.nack(tag)
        except Exception:  # the channel went meanwhile: the broker returns it anyway
            log.warning("returning a %s delivery failed; it will be redelivered", task)
        self.outcomes.add(outcome)

    def leave(self, acks: ChannelAcks, tag: int) -> None:
        """Leave a delivery unsettled (not started: the worker stops, or its channel
        is lost): the broker returns it to the queue when the channel closes."""
        acks.forget(tag)
        self.outcomes.add("left")


def _of_keys(finished: Sequence[Finished], keys: Sequence[str]) -> list[Finished]:
    """Those of ``finished`` whose key is in ``keys`` (all copies of a key)."""
    wanted = set(keys)
    return [done for done in finished if done.job.idempotency_key in wanted]
