"""What the worker does while its ledger (the store) fails (docs/worker.md, *Ledger outages*).

A claim or a record that cannot be written is our outage, not the job's: handing the
delivery back (``basic.nack``) would have RabbitMQ redeliver it at once, in a loop,
each return counted against the quorum queue's delivery limit until healthy jobs
were dead-lettered. Instead every store call of the delivery path goes through
:meth:`LedgerGate.call`: on a :class:`~broker_jobs.store.base.StoreError` it waits
and tries again, holding the delivery unacked meanwhile. The broker sends no more
than the prefetch, so the worker takes no new work while the ledger is away; no
attempt is spent and no delivery returned.

The gate says so once: one WARNING when the ledger first fails, one INFO when the
outage is over (with how long it was away), ``/readyz`` answers 503 with the reason
while it fails, and two metrics (``broker_jobs_ledger_up``, the seconds without a
ledger) count it. The outage is over once the ledger has answered for
:data:`STEADY_AFTER` seconds: one that flaps (a server dropping each connection as it
comes) is one outage, not a WARNING and an INFO for each answer between its failures.
Pauses grow from :data:`FIRST_PAUSE` to :data:`MAX_PAUSE`, so work resumes within
about a second of the store's return (the log's end of the outage is later; the
metrics and ``/readyz`` follow each answer and failure at once).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from broker_jobs.plural import plural
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
#: An outage is over once the ledger has answered this long without failing again.
#: A PostgreSQL whose connections were killed as they came in, for 15 s, answered
#: between failures for 0.2 s at a time: 34-39 WARNING and INFO pairs a worker when
#: each answer ended the outage; one of each now.
STEADY_AFTER = 5.0


class LedgerGaveUp(Exception):
    """A held store call was abandoned (the delivery's channel is lost, or the worker
    stops): its delivery is left unsettled for the broker to return, never nacked."""


class StalledCalls:
    """The worker's store calls in flight: one unanswered for :data:`STALL_AFTER`
    seconds is reported to the gate as a failure (a hung database raises nothing, so
    it would otherwise hold every job without a word, ``/readyz`` 200); the call
    itself goes on, and its answer ends the outage (the caller tells the gate). Its
    watch also has the gate say the end of an outage once the ledger has answered
    for :data:`STEADY_AFTER` seconds, were there no store call then."""

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
            self._gate.settle()
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
    (``readiness`` reads it from the metrics thread: plain attributes).
    ``clock``: ``time.monotonic``, or a test's."""

    def __init__(
        self,
        store_name: str,
        observer: JobObserver,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store_name = store_name
        self._observer = observer
        self._clock = clock
        #: The clock at the failure that began this outage; None once it is over.
        self._outage_since: float | None = None
        #: The clock at the failure the ledger has not answered since; None while it
        #: answers (the outage may still go on: :data:`STEADY_AFTER`).
        self._down_since: float | None = None
        #: The clock at the answer that ended the last failure of this outage.
        self._answering_since: float | None = None
        #: Failures of this outage after an answer of the ledger's, and the seconds
        #: it was down in all.
        self._relapses = 0
        self._down_for = 0.0
        self._counted_until = 0.0
        self._failures = 0
        #: The last failure's message (passwords masked by the store).
        self.reason: str | None = None

    @property
    def is_down(self) -> bool:
        return self._down_since is not None

    @property
    def in_outage(self) -> bool:
        """Whether an outage was said and its end not yet (it may answer meanwhile):
        the worker's heartbeat and paused tasks' reader then say none of their own."""
        return self._outage_since is not None

    def describe(self) -> str | None:
        """For ``/readyz``: why the worker holds its jobs, or None."""
        if self._down_since is None:
            return None
        since = self._outage_since if self._outage_since is not None else self._down_since
        return (
            f"the ledger ({self._store_name}) has failed for {self._clock() - since:.0f} s:"
            f" {self.reason}; jobs are held until it answers"
        )

    def failed(self, error: BaseException) -> None:
        """A store call failed with ``error`` (not a lost lease)."""
        now = self._clock()
        self.reason = str(error) or type(error).__name__
        self._failures += 1
        if self._down_since is not None:
            self._count_down_time(now)
            return
        self._down_since = self._counted_until = now
        self._answering_since = None
        self._observer.ledger_up(False)
        if self._outage_since is not None:  # it answered, and fails again: it flaps
            self._relapses += 1
            log.debug("the ledger (%s) fails again: %s", self._store_name, self.reason)
            return
        self._outage_since = now
        log.warning(
            "the ledger (%s) failed: %s. Holding the deliveries in hand (no new ones"
            " are taken) and trying again every %g s or so until it answers",
            self._store_name,
            self.reason,
            MAX_PAUSE,
        )

    def answered(self) -> None:
        """A store call succeeded: the ledger is back, if it was away (its outage
        is over once it has answered for :data:`STEADY_AFTER` seconds)."""
        if self._outage_since is None:
            return
        since = self._down_since
        if since is None:
            self.settle()
            return
        now = self._clock()
        self._count_down_time(now)
        self._down_for += now - since
        self._down_since = None
        self._answering_since = now
        self._observer.ledger_up(True)

    def settle(self) -> None:
        """One INFO line if the ledger has answered for :data:`STEADY_AFTER` seconds
        since the last failure of an outage: the outage is over."""
        answering = self._answering_since
        if answering is not None and self._clock() - answering >= STEADY_AFTER:
            self._over()

    def close(self) -> None:
        """The worker ends: an outage whose ledger answered since is over (its
        answer has not lasted :data:`STEADY_AFTER` seconds, but nothing failed)."""
        if self._answering_since is not None:
            self._over()

    def _over(self) -> None:
        outage, answered_at = self._outage_since, self._answering_since
        assert outage is not None
        assert answered_at is not None
        relapses, down_for = self._relapses, self._down_for
        self._outage_since = self._answering_since = None
        self._relapses, self._down_for, self._failures = 0, 0.0, 0
        if not relapses:
            log.info(
                "the ledger (%s) answers again after %.1f s; the held jobs go on",
                self._store_name,
                answered_at - outage,
            )
            return
        log.info(
            "the ledger (%s) answers again after %.1f s, in which it answered and failed"
            " again %s (down %.1f s in all); it has answered for %.1f s since",
            self._store_name,
            answered_at - outage,
            plural(relapses, "time"),
            down_for,
            self._clock() - answered_at,
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
