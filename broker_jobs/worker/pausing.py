"""Paused tasks, as a worker follows them (docs/operations.md, "pause and resume").

The operator's pause is a row in the ledger (:mod:`broker_jobs.store.pauses`). Each
worker reads its namespace's pauses before it first consumes (a new worker starts
paused) and then every ``every`` seconds. When one of its tasks is paused it
cancels that task's consumers first (no more deliveries), then marks the task paused
in its runner: a delivery in hand whose job has not started is returned to its queue
(not run), a running job finishes. When the pause is lifted it consumes again.

A ledger that cannot be read keeps the pauses as last read (said once): neither a
pause nor a resume is guessed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping

from broker_jobs.store.base import Store
from broker_jobs.store.pauses import TaskPause
from broker_jobs.worker.protocol import Runner
from broker_jobs.worker.session import Session

log = logging.getLogger(__name__)


class PauseWatch:
    """Follows the pauses of ``tasks`` (of ``namespace``) for one worker's ``runner``;
    ``queues`` maps each of the worker's queues to its task."""

    def __init__(
        self,
        store: Store,
        namespace: str,
        queues: Mapping[str, str],
        runner: Runner,
        *,
        worker_id: str,
        every: float,
    ) -> None:
        self._store = store
        self._namespace = namespace
        self._queues = dict(queues)
        self._runner = runner
        self._worker_id = worker_id
        self._every = every
        self._failing = False
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
        await _quietly(session.stop_consuming(q for q in consumed if q not in now))
        await _quietly(session.consume({q: t for q, t in now.items() if q not in consumed}))

    async def read(self) -> None:
        """Read the pauses now and act on what changed."""
        pauses = await self._pauses()
        if pauses is None:
            return
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
            await _quietly(session.stop_consuming(queues))
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
            await _quietly(session.consume({q: t for q, t in self._queues.items() if t == task}))
        log.warning("worker %s: task %s is resumed: consuming it again", self._worker_id, task)

    async def _pauses(self) -> dict[str, TaskPause] | None:
        try:
            pauses = await asyncio.to_thread(self._store.pauses, self._namespace)
        except Exception as error:  # kept as last read: a pause is never guessed
            if not self._failing:
                log.warning(
                    "worker %s: cannot read the paused tasks (%s); keeping them as last read",
                    self._worker_id, error,
                )  # fmt: skip
            self._failing = True
            return None
        if self._failing:
            log.info("worker %s: the paused tasks are read again", self._worker_id)
        self._failing = False
        return pauses


async def _quietly(step: Awaitable[None]) -> None:
    """A consumer change on a session that may be going: its loss ends the session,
    and the next one consumes what is not paused then."""
    try:
        await step
    except Exception as error:  # the session's own watcher reports the loss
        log.debug("changing consumers failed (the session is going?): %s", error)
