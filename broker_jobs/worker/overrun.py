"""What a time limit does to a sync handler that runs past it (docs/worker.md, *Time limits*).

A thread cannot be killed. At its task's time limit a sync handler is interrupted:
:class:`TimeLimitInterrupt` is raised in its thread (``PyThreadState_SetAsyncExc``, as
Dramatiq does). It lands at the next line of Python the handler runs: at once in
Python code (a loop, a spin), when it comes back from C code otherwise (``time.sleep``,
a socket read, a long regex). It is a BaseException, so a handler's ``except
Exception`` does not swallow it.

Until the handler really returns, its job keeps its handler thread (so no more than
``concurrency`` handlers ever run), its lease (renewed) and its record ``running``:
the job's next attempt cannot start beside it, here or on another worker. Whatever it
raises after the interrupt, its attempt failed with
:class:`TimeLimitExceeded` (a handler that returned
before the interrupt landed succeeded: its work is done).

A handler still running ``overrun_grace`` seconds after its limit is *stuck*: the
worker is then replaced (:class:`Overruns`; the worker stops taking jobs, lets the
others finish, records the stuck jobs' attempts as failed by their time limit, and
exits with :data:`EXIT_HANDLER_STUCK` for its supervisor to start a new process).

Both delivery paths keep a sync run's limit with one :class:`LimitWatch`.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from broker_jobs.envelope import Job
from broker_jobs.errors import HandlerStuckError
from broker_jobs.worker.observer import JobObserver

log = logging.getLogger(__name__)

#: The worker's exit code when a handler thread was stuck past its time limit and the
#: overrun grace (EX_SOFTWARE). ``--processes``' supervisor restarts it; under systemd
#: or Kubernetes, restart on failure.
EXIT_HANDLER_STUCK = HandlerStuckError.exit_code


class TimeLimitInterrupt(BaseException):
    """Raised inside a sync handler's thread at its task's time limit."""


class TimeLimitExceeded(Exception):
    """The handler ran longer than its task's time limit. ``stuck``: it did not
    return within the overrun grace after being interrupted, and the worker was
    replaced (its next attempt is then due no sooner than the worker's --grace and
    :data:`STUCK_RETRY_FLOOR`)."""

    def __init__(self, message: str, *, stuck: bool = False) -> None:
        super().__init__(message)
        self.stuck = stuck


def time_limit_error(seconds: float) -> TimeLimitExceeded:
    """The failure of an attempt that ran past its limit of ``seconds``."""
    return TimeLimitExceeded(f"ran longer than {seconds:g} s")


def stuck_error(seconds: float, grace: float) -> TimeLimitExceeded:
    """The failure of an attempt whose handler was stuck past its limit and ``grace``."""
    return TimeLimitExceeded(
        f"ran longer than {seconds:g} s and did not stop within {grace:g} s of being"
        " interrupted; the worker was replaced",
        stuck=True,
    )


#: Seconds beyond the worker's --grace: the least delay of a stuck job's next attempt.
#: The worker that records it gives its other jobs (those waiting for a thread too)
#: at most --grace to settle, then exits: the delay keeps the attempt from starting
#: elsewhere before this process (and the stuck thread) is gone.
STUCK_RETRY_FLOOR = 5.0


class RunGuard:
    """One sync handler call on its thread, which the loop may interrupt once.

    The lock makes "still in the handler" and "interrupt it" one decision: an
    interrupt sent after the call left the handler is taken back (a pending async
    exception is cleared) before the thread runs anything else.
    """

    __slots__ = ("_lock", "_thread", "ended", "interrupted")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: int | None = None
        self.ended = False
        self.interrupted = False

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on this thread, interruptible until it returns."""
        with self._lock:
            self._thread = threading.get_ident()
        try:
            return function(*args)
        finally:
            self._leave()

    def _leave(self) -> None:
        while True:
            try:
                with self._lock:
                    self.ended = True
                    if self.interrupted:
                        _raise_in(self._thread, None)  # a pending interrupt dies here
            except TimeLimitInterrupt:  # landed between the handler's return and here
                continue
            return

    def interrupt(self) -> bool:
        """Raise :class:`TimeLimitInterrupt` in the handler; False if it has not
        started or has returned already."""
        with self._lock:
            if self.ended or self._thread is None or self.interrupted:
                return False
            self.interrupted = True
            _raise_in(self._thread, TimeLimitInterrupt)
            return True


def _raise_in(thread: int | None, error: type[BaseException] | None) -> None:
    """Set (or, with None, clear) the exception pending in ``thread``."""
    if thread is not None:
        pending = None if error is None else ctypes.py_object(error)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), pending)


class Overruns:
    """The worker's sync handlers past their time limit: interrupted (not returned
    yet), and stuck (past the overrun grace too). Shared by both delivery paths;
    on the event loop."""

    def __init__(self, grace: float, observer: JobObserver) -> None:
        #: Seconds after its time limit within which an interrupted handler must return.
        self.grace = grace
        self._observer = observer
        self._interrupted: dict[str, Job] = {}
        self._stuck: dict[str, Job] = {}
        #: The ids of every job that was stuck (the worker's exit names them).
        self.ever_stuck: list[str] = []
        #: Those whose failed attempt was recorded (a ledger down may leave some not).
        self._recorded: set[str] = set()
        #: Set at the first stuck handler: the worker is to be replaced.
        self.seen_stuck = asyncio.Event()
        #: Set by the worker once its other jobs settled: the stuck jobs' attempts are
        #: recorded as failed by their time limit, and the process exits.
        self.settle_stuck = asyncio.Event()

    @property
    def stuck(self) -> list[Job]:
        return list(self._stuck.values())

    def interrupted(self, job: Job, limit: float) -> None:
        self._interrupted[job.id] = job
        self._observer.overrunning(job.task, 1)
        log.warning(
            "job %s (%s, attempt %d) ran past its %g s time limit: interrupted; it keeps its"
            " slot and lease until its handler returns (at most %g s more, then this worker"
            " is replaced)",
            job.id,
            job.task,
            job.attempt,
            limit,
            self.grace,
            extra={"job_id": job.id, "key": job.idempotency_key, "task": job.task},
        )

    def became_stuck(self, job: Job, limit: float) -> None:
        if job.id in self._stuck:
            return
        self._stuck[job.id] = job
        self.ever_stuck.append(job.id)
        self._observer.stuck(job.task, 1)
        log.error(
            "job %s (%s) is still running %g s past its %g s time limit and its thread cannot"
            " be stopped: this worker stops taking jobs, lets the others finish, records the"
            " attempt as failed by its time limit and exits with code %d to be replaced",
            job.id,
            job.task,
            self.grace,
            limit,
            EXIT_HANDLER_STUCK,
            extra={"job_id": job.id, "key": job.idempotency_key, "task": job.task},
        )
        self.seen_stuck.set()

    def recorded(self, job: Job) -> None:
        """A stuck job's failed attempt was recorded (its retry or dead letter too)."""
        self._recorded.add(job.id)

    @property
    def unrecorded(self) -> list[str]:
        """The stuck jobs whose failed attempt was not recorded (yet)."""
        return [job_id for job_id in self.ever_stuck if job_id not in self._recorded]

    def returned(self, job: Job) -> None:
        """An interrupted handler returned (or its job was settled without it)."""
        if self._interrupted.pop(job.id, None) is not None:
            self._observer.overrunning(job.task, -1)
        if self._stuck.pop(job.id, None) is not None:
            self._observer.stuck(job.task, -1)

    def describe(self) -> str | None:
        """For ``/readyz``: what is stuck, or None."""
        stuck = self.stuck
        if not stuck:
            return None
        jobs = ", ".join(f"{job.id} ({job.task})" for job in stuck[:3])
        more = f" and {len(stuck) - 3} more" if len(stuck) > 3 else ""
        return f"handler threads stuck past their time limit: {jobs}{more}; being replaced"


class LimitWatch:
    """One sync run's time limit, kept on the event loop. :meth:`arm` with the time
    the handler started on its thread (the limit never counts the wait for a thread);
    at the limit the handler is interrupted, and ``grace`` seconds later, still not
    returned, it is stuck (``stuck`` is set, ``on_stuck()`` called; the worker replaces itself).
    :meth:`outcome` says what the attempt's outcome is once it ends, or once it is
    settled without its handler."""

    def __init__(
        self,
        seconds: float,
        job: Job,
        overruns: Overruns,
        guard: RunGuard,
        on_stuck: Callable[[], object] | None = None,
    ) -> None:
        self.seconds = seconds
        self._on_stuck = on_stuck
        self._job = job
        self._overruns = overruns
        self._guard = guard
        self._timers: list[asyncio.TimerHandle] = []
        self._ended = False
        self._overran = False
        #: Set when the handler is stuck past its limit and the grace.
        self.stuck = asyncio.Event()

    def arm(self, started: float) -> None:
        """On the loop: the limit counts from ``started`` (``time.monotonic()`` when
        the handler started on its thread), however late the loop gets to it. A run
        that already ended gets no timer."""
        if not self._ended:
            loop = asyncio.get_running_loop()
            remaining = max(started + self.seconds - time.monotonic(), 0.0)
            self._timers.append(loop.call_later(remaining, self._at_limit))

    def _at_limit(self) -> None:
        if self._ended or not self._guard.interrupt():
            return  # it returned meanwhile: its report is on its way
        self._overran = True
        self._overruns.interrupted(self._job, self.seconds)
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(self._overruns.grace, self._at_grace))

    def _at_grace(self) -> None:
        if not self._ended:
            self._overruns.became_stuck(self._job, self.seconds)
            self.stuck.set()
            if self._on_stuck is not None:
                self._on_stuck()

    def stuck_error(self) -> TimeLimitExceeded:
        """The failure of this attempt when it is settled as stuck."""
        return stuck_error(self.seconds, self._overruns.grace)

    def outcome(self, error: BaseException | None) -> BaseException | None:
        """The run ended with ``error`` (None: it returned): its attempt's outcome.
        Once interrupted, whatever it raised is its time limit; a handler that returned
        succeeded (before the interrupt landed, or it caught the interrupt and finished
        its work: its return is its outcome)."""
        self._ended = True
        for timer in self._timers:
            timer.cancel()
        if not self._overran:
            return error
        self._overruns.returned(self._job)
        if error is not None and not isinstance(error, TimeLimitExceeded):
            return time_limit_error(self.seconds)
        return error
