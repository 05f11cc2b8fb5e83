"""What an operator tells a worker through the ledger (:mod:`broker_jobs.store.controls`),
as the worker follows it: paused tasks (docs/operations.md, "pause and resume") and a
request to stop (docs/operations.md, "workers").

The operator's pause is a row in the ledger (:mod:`broker_jobs.store.controls`). Each
worker reads its namespace's pauses before it first consumes (a new worker starts
paused) and then every ``every`` seconds. When one of its tasks is paused it
cancels that task's consumers first (no more deliveries), then marks the task paused
in its runner: a delivery in hand whose job has not started is returned to its queue
(not run), a running job finishes. When the pause is lifted it consumes again.

A stop request for this worker stops it as SIGTERM does (no job starts, running ones
finish within the grace period); it deletes the request as it exits. A request older
than the worker (left by an earlier process of the same ``--worker-id``) is deleted
unheeded.

A ledger that cannot be read keeps the pauses as last read (said once, unless the
worker's ledger gate says the outage already): neither a pause nor a resume is
guessed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import timedelta

from broker_jobs.clock import utc_now
from broker_jobs.observe.failure_streak import FailureStreak
from broker_jobs.store.base import Store
from broker_jobs.store.controls import StopRequest, TaskPause
from broker_jobs.worker.protocol import Runner
from broker_jobs.worker.session import Session, change_quietly

log = logging.getLogger(__name__)

#: A stop request older than the worker by more than this (clocks differ) is stale.
STALE_STOP = timedelta(seconds=5)


class ControlWatch:
    """Follows the pauses of ``tasks`` (of ``namespace``) for one worker's ``runner``,
    and its stop requests (``on_stop`` is called once); ``queues`` maps each of the
    worker's queues to its task."""

    def __init__(
        self,
        store: Store,
        namespace: str,
        queues: Mapping[str, str],
        runner: Runner,
        *,
        worker_id: str,
        every: float,
        on_stop: Callable[[StopRequest], None],
    ) -> None:
        self._store = store
        self._namespace = namespace
        self._queues = dict(queues)
        self._runner = runner
        self._worker_id = worker_id
        self._every = every
        self._streak = FailureStreak(log, quiet=lambda: runner.ledger.in_outage)
        self._on_stop = on_stop
        self._stop_heard = False
        self._started_at = utc_now()
        #: The session consuming now (None between sessions).
        self.session: Session | None = None

    @property
    def paused(self) -> frozenset[str]:
        return self._runner.paused

    def consumed(self) -> dict[str, str]:
        """The queues to consume now: those of tasks not paused."""
        return {q: t for q, t in self._queues.items() if t not in self._runner.paused}

    async def attach(self, session: Session | None, consumed: Mapping[str, str]) -> None:
        """``session`` now consumes ``consumed`` (None: the session ended). A pause or
        a resume read while it opened is applied to it here."""
        self.session = session
        if session is None:
            return
        now = self.consumed()
        await change_quietly(session.stop_consuming(q for q in consumed if q not in now))
        await change_quietly(session.consume({q: t for q, t in now.items() if q not in consumed}))

    async def read(self) -> None:
        """Read the pauses and stop requests now and act on what changed."""
        found = await self._controls()
        if found is None:
            return
        pauses, stops = found
        stop = stops.get(self._worker_id)
        if stop is not None and not self._stop_heard:
            await self._heed(stop)
        mine = set(self._queues.values())
        now = frozenset(task for task in pauses if task in mine)
        before = self._runner.paused
        for task in sorted(now - before):
            await self._pause(task, pauses[task])
        for task in sorted(before - now):
            await self._resume(task)

    async def run(self) -> None:
        """Read every ``every`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self._every)
            await self.read()

    async def _pause(self, task: str, pause: TaskPause) -> None:
        queues = [q for q, t in self._queues.items() if t == task]
        session = self.session
        if session is not None:  # first no new deliveries, then none in hand starts
            await change_quietly(session.stop_consuming(queues))
        self._runner.paused = self._runner.paused | {task}
        log.warning(
            "worker %s: task %s is paused (by %s since %s): its jobs do not start here"
            " (those in hand go back to the queue), the running ones finish;"
            " broker-jobs resume %s --namespace %s lifts it",
            self._worker_id, task, pause.by, pause.since.isoformat(timespec="seconds"),
            task, self._namespace,
        )  # fmt: skip

    async def _resume(self, task: str) -> None:
        self._runner.paused = self._runner.paused - {task}
        session = self.session
        if session is not None:
            queues = {q: t for q, t in self._queues.items() if t == task}
            await change_quietly(session.consume(queues))
        log.warning("worker %s: task %s is resumed: consuming it again", self._worker_id, task)

    async def _heed(self, stop: StopRequest) -> None:
        if stop.at < self._started_at - STALE_STOP:
            log.info(
                "worker %s: a stop request of %s (by %s) is older than this process:"
                " deleted unheeded", self._worker_id, stop.at.isoformat(timespec="seconds"),
                stop.by,
            )  # fmt: skip
            await asyncio.to_thread(self._store.clear_stop, self._worker_id)
            return
        self._stop_heard = True
        log.warning(
            "worker %s: asked to stop by %s at %s: stopping gracefully",
            self._worker_id, stop.by, stop.at.isoformat(timespec="seconds"),
        )  # fmt: skip
        self._on_stop(stop)

    async def stopped(self) -> None:
        """The worker exits: its stop request, if it heard one, is done."""
        if self._stop_heard:
            with contextlib.suppress(Exception):  # the next start deletes it as stale
                await asyncio.to_thread(self._store.clear_stop, self._worker_id)

    def _read(self) -> tuple[dict[str, TaskPause], dict[str, StopRequest]]:
        return self._store.pauses(self._namespace), self._store.stop_requests(self._namespace)

    async def _controls(self) -> tuple[dict[str, TaskPause], dict[str, StopRequest]] | None:
        try:
            found = await asyncio.to_thread(self._read)
        except Exception as error:  # kept as last read: a pause is never guessed
            self._streak.failed(
                "worker %s: cannot read the paused tasks (%s); keeping them as last read",
                self._worker_id, error,
            )  # fmt: skip
            return None
        self._streak.worked("worker %s: the paused tasks are read again", self._worker_id)
        return found
