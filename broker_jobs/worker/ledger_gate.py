"""What the worker does while its ledger (the store) fails (docs/worker.md, *Ledger outages*).

A claim or a record that cannot be written is our outage, not the job's: handing the
delivery back (``basic.nack``) would have RabbitMQ redeliver it at once, in a loop,
each return counted against the quorum queue's delivery limit until healthy jobs
were dead-lettered. Instead every store call of the delivery path goes through
:meth:`LedgerGate.call`: on a :class:`~broker_jobs.store.base.StoreError` it waits
and tries again, holding the delivery unacked meanwhile. The broker sends no more
than the prefetch, so the worker takes no new work while the ledger is away; no
attempt is spent and no delivery returned.

The gate says so once: one WARNING when the ledger first fails, one INFO when it
answers again (with how long it was away), ``/readyz`` answers 503 with the reason
meanwhile, and two metrics (``broker_jobs_ledger_up``, the seconds without a ledger)
count it. Pauses grow from :data:`FIRST_PAUSE` to :data:`MAX_PAUSE`, so work resumes
within about a second of the store's return.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from broker_jobs.store.base import LeaseLostError, StoreError
from broker_jobs.worker.observer import JobObserver

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds between two tries of a failing store call: the first pause, and the most.
FIRST_PAUSE, MAX_PAUSE = 0.1, 1.0
#: A store call unanswered this long is an outage too: a frozen database server, or a
#: table lock held by a migration (SQLite's own busy timeout is 10 s as well).
STALL_AFTER = 10.0
#: How often :meth:`StalledCalls.watch` looks.
STALL_CHECK_EVERY = 1.0


class LedgerGaveUp(Exception):
    """A held store call was abandoned (the delivery's channel is lost, or the worker
    stops): its delivery is left unsettled for the broker to return, never nacked."""


class StalledCalls:
    """The worker's store calls in flight: one unanswered for :data:`STALL_AFTER`
    seconds is reported to the gate as a failure (a hung database raises nothing, so
    it would otherwise hold every job without a word, ``/readyz`` 200); the call
    itself goes on, and its answer ends the outage (the caller tells the gate)."""

    def __init__(self, gate: LedgerGate) -> None:
        self._gate = gate
        #: Each call's ``time.monotonic()`` at its start, oldest first.
        self._started: dict[asyncio.Future[Any], float] = {}

    def track(self, call: asyncio.Future[T]) -> asyncio.Future[T]:
        """Watch ``call`` until it is done; returns it."""
        self._started[call] = time.monotonic()
        call.add_done_callback(self._forget)
        return call

    def _forget(self, call: asyncio.Future[Any]) -> None:
        del self._started[call]

    async def watch(self) -> None:
        """Until cancelled: report the oldest call in flight once it is stalled."""
        while True:
            await asyncio.sleep(STALL_CHECK_EVERY)
            if not self._started:
                continue
            # Calls are tracked as they start: the first left is the oldest.
            waited = time.monotonic() - next(iter(self._started.values()))
            if waited >= STALL_AFTER:
                self._gate.failed(
                    StoreError(
                        f"no answer for {waited:.0f} s (the database may be frozen or"
                        " unreachable, or a table locked: a migration, VACUUM FULL)"
                    )
                )


class LedgerGate:
    """The worker's view of its ledger: up, or down since when and why. On the loop
    (``readiness`` reads it from the metrics thread: plain attributes)."""

    def __init__(self, store_name: str, observer: JobObserver) -> None:
        self._store_name = store_name
        self._observer = observer
        #: ``time.monotonic()`` of the first failure of this outage; None while up.
        self._down_since: float | None = None
        self._counted_until = 0.0
        self._failures = 0
        #: The last failure's message (passwords masked by the store).
        self.reason: str | None = None

    @property
    def is_down(self) -> bool:
        return self._down_since is not None

    def describe(self) -> str | None:
        """For ``/readyz``: why the worker holds its jobs, or None."""
        since = self._down_since
        if since is None:
            return None
        return (
            f"the ledger ({self._store_name}) has failed for {time.monotonic() - since:.0f} s:"
            f" {self.reason}; jobs are held until it answers"
        )

    def failed(self, error: BaseException) -> None:
        """A store call failed with ``error`` (not a lost lease)."""
        now = time.monotonic()
        self.reason = str(error) or type(error).__name__
        self._failures += 1
        if self._down_since is None:
            self._down_since = self._counted_until = now
            self._observer.ledger_up(False)
            log.warning(
                "the ledger (%s) failed: %s. Holding the deliveries in hand (no new ones"
                " are taken) and trying again every %g s or so until it answers",
                self._store_name,
                self.reason,
                MAX_PAUSE,
            )
        else:
            self._count_down_time(now)

    def answered(self) -> None:
        """A store call succeeded: the ledger is back (one INFO line), if it was away."""
        since = self._down_since
        if since is None:
            return
        now = time.monotonic()
        self._count_down_time(now)
        self._down_since = None
        self._failures = 0
        self._observer.ledger_up(True)
        log.info(
            "the ledger (%s) answers again after %.1f s; the held jobs go on",
            self._store_name,
            now - since,
        )

    def _count_down_time(self, now: float) -> None:
        self._observer.ledger_down_for(now - self._counted_until)
        self._counted_until = now

    async def pause(self) -> None:
        """Wait before the next try: the longer the outage, the longer (to MAX_PAUSE)."""
        pause = min(MAX_PAUSE, FIRST_PAUSE * 2 ** min(self._failures, 8))
        await asyncio.sleep(random.uniform(pause / 2, pause))

    async def call(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        give_up: Callable[[], bool] | None = None,
    ) -> T:
        """``await attempt()`` until it does not raise StoreError. A lost lease is the
        store answering (raised as it comes); ``give_up()`` true after a failure
        raises :class:`LedgerGaveUp` (a claim for a delivery that cannot be acked
        any more); other exceptions propagate."""
        while True:
            try:
                result = await attempt()
            except LeaseLostError:
                self.answered()
                raise
            except StoreError as error:
                self.failed(error)
                if give_up is not None and give_up():
                    raise LedgerGaveUp(str(error)) from error
                await self.pause()
                continue
            self.answered()
            return result
