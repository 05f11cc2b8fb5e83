"""A daemon's heartbeat in the ledger (:mod:`broker_jobs.store.processes`): every
:data:`HEARTBEAT_EVERY` seconds the process rewrites its record with what it is
doing; on a graceful exit it writes its last one, ``stopped``.

A heartbeat is the daemon's own business, never its jobs': a ledger that cannot
take it is said once (WARNING), and once more when it takes it again, and nothing
else waits for it. Its cost is one small write per process every few seconds and,
per job, nothing (the worker's running jobs are read at the beat, not counted as
they run: :class:`broker_jobs.worker.observer.JobObserver` keeps them anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from broker_jobs.clock import utc_now
from broker_jobs.errors import BrokerJobsError
from broker_jobs.observe.failure_streak import FailureStreak, never
from broker_jobs.store.base import Store
from broker_jobs.store.processes import (
    ProcessKind,
    ProcessRecord,
    ProcessState,
    RunningJob,
    pid_namespace,
)
from broker_jobs.version import __version__

log = logging.getLogger(__name__)

#: Seconds between two heartbeats of a process.
HEARTBEAT_EVERY = 5.0
#: Records of processes silent this long are deleted (by any process's heartbeat,
#: once an hour): a lost worker stays listed, as lost, for a day.
FORGET_AFTER = timedelta(days=1)
FORGET_EVERY = 3600.0
#: Seconds the last heartbeat of an exit may take.
STOPPED_WITHIN = 2.0

#: How the heartbeat calls the store: a thread, the daemon's store thread...
StoreCall = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Pulse:
    """What changes between two heartbeats."""

    state: ProcessState = ProcessState.RUNNING
    in_flight: int = 0
    running: tuple[RunningJob, ...] = ()
    role: str | None = None
    paused: tuple[str, ...] = ()
    #: Why the process holds its deliveries (None: it does not).
    held: str | None = None


def process_record(
    kind: ProcessKind,
    id: str,
    namespace: str,
    *,
    tasks: Sequence[str] = (),
    concurrency: int | None = None,
    processes: int | None = None,
    every: float = HEARTBEAT_EVERY,
) -> ProcessRecord:
    """The first record of this process (host, pid and version are its own)."""
    now = utc_now()
    return ProcessRecord(
        id=id,
        kind=kind,
        namespace=namespace,
        host=socket.gethostname(),
        pid_namespace=pid_namespace(),
        pid=os.getpid(),
        version=__version__,
        started_at=now,
        seen_at=now,
        every=every,
        tasks=tuple(tasks),
        concurrency=concurrency,
        processes=processes,
    )


class Heartbeat:
    """Keeps ``record``'s heartbeat in ``store``: ``await heartbeat.run()`` until
    cancelled, then ``await heartbeat.stopped()``. ``pulse`` says what changed (read
    on the event loop at each beat); ``call`` runs a store call off the loop;
    ``quiet()`` true: a failure is said elsewhere (a worker's ledger gate), not here."""

    def __init__(
        self,
        store: Store,
        record: ProcessRecord,
        *,
        pulse: Callable[[], Pulse] = Pulse,
        call: StoreCall = asyncio.to_thread,
        quiet: Callable[[], bool] = never,
    ) -> None:
        self._store = store
        self._record = record
        self._pulse = pulse
        self._call = call
        self._streak = FailureStreak(log, quiet=quiet)
        self._forgot_at: float | None = None

    @property
    def record(self) -> ProcessRecord:
        """The last record written (or tried)."""
        return self._record

    async def run(self) -> None:
        """Beat every ``record.every`` seconds, until cancelled."""
        while True:
            await self.beat()
            await self._call(self.forget_old, asyncio.get_running_loop().time())
            await asyncio.sleep(self._record.every)

    async def beat(self, pulse: Pulse | None = None) -> bool:
        """Write one heartbeat now (``pulse``, else the process's own, read here on
        the loop); whether the ledger took it."""
        return bool(await self._call(self.write, pulse or self._pulse()))

    def write(self, pulse: Pulse) -> bool:
        """:meth:`beat` on the caller's thread (a daemon without a loop of its own
        for the store, as the exporter's poll thread)."""
        self._record = record = replace(
            self._record,
            seen_at=utc_now(),
            state=pulse.state,
            in_flight=pulse.in_flight,
            running=pulse.running,
            role=pulse.role,
            paused=pulse.paused,
            held=pulse.held,
        )
        try:
            self._store.record_process(record)
        except Exception as error:  # the heartbeat never costs the daemon anything
            self._streak.failed(
                "%s %s: its heartbeat is not recorded (%s); `broker-jobs workers` shows"
                " it as lost until it is", record.kind.value, record.id, error,
            )  # fmt: skip
            return False
        self._streak.worked("%s %s: its heartbeat is recorded again", record.kind.value, record.id)
        return True

    def forget_old(self, now: float) -> None:
        """Once an hour (``now``: a monotonic clock), delete the records silent for
        :data:`FORGET_AFTER`; a failure here is the heartbeat's own to say."""
        if self._forgot_at is not None and now - self._forgot_at < FORGET_EVERY:
            return
        self._forgot_at = now
        with contextlib.suppress(Exception):
            self._store.forget_processes(utc_now() - FORGET_AFTER)

    async def stopped(
        self, *, ended: BaseException | None = None, within: float = STOPPED_WITHIN
    ) -> None:
        """The last heartbeat of an exit: ``stopped``, nothing running, and the error it
        ``ended`` with, if any. Waits ``within`` seconds at most (a ledger that hangs
        does not hold up the exit; the record then shows the process lost, later)."""
        self._record = replace(self._record, ended=exit_reason(ended))
        last = replace(self._pulse(), state=ProcessState.STOPPED, in_flight=0, running=())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.beat(last), within)


#: The longest reason a record keeps (an error's first line, shortened).
MAX_EXIT_REASON = 300


def exit_reason(error: BaseException | None) -> str | None:
    """What ``workers`` shows for a process that ended with ``error``: its exit code
    and the first line of its message; None for a stop it was asked for (a signal,
    a cancelled task, ``--burst`` drained)."""
    if error is None or isinstance(error, (asyncio.CancelledError, KeyboardInterrupt)):
        return None
    line = (str(error).strip().splitlines() or [""])[0]
    if isinstance(error, BrokerJobsError):
        reason = f"exit {error.exit_code}: {line or type(error).__name__}"
    else:
        reason = f"crashed: {type(error).__name__}" + (f": {line}" if line else "")
    if len(reason) > MAX_EXIT_REASON:
        reason = reason[: MAX_EXIT_REASON - 1] + "\u2026"
    return reason
