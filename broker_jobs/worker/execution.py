"""Running one handler: sync ones in a bounded thread pool, async ones on the loop,
each under a time limit that starts when the handler starts, with the store's lease
renewed while it runs.

Sync handlers run in threads so that a CPU-bound handler never starves the event
loop, which keeps AMQP heartbeats flowing. A sync handler that overruns its time
limit is interrupted (:mod:`broker_jobs.worker.overrun`) and keeps its thread, its
lease and its record until it really returns; an async one is cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from pydantic import BaseModel

from broker_jobs.envelope import Job
from broker_jobs.worker.levels import LevelCalls, LevelPicker, LevelSlots
from broker_jobs.worker.observer import Run
from broker_jobs.worker.overrun import (
    STUCK_RETRY_FLOOR,
    LimitWatch,
    Overruns,
    RunGuard,
    TimeLimitExceeded,
    stuck_error,
    time_limit_error,
)
from topology.priority import Priority, PriorityPolicy

log = logging.getLogger(__name__)

__all__ = [
    "STUCK_RETRY_FLOOR",
    "Executor",
    "HandlerThreads",
    "RunLimit",
    "TimeLimitExceeded",
    "handler_failure",
    "run_async_handler",
    "stuck_error",
    "time_limit_error",
]


class HandlerThreads(concurrent.futures.Executor):
    """``size`` threads, started at once, running calls from one queue.

    :meth:`post` is a lock and a queue put (~1 us): the fast path hands claimed jobs
    over this way (:meth:`post_all`), on their way to their start (a
    ThreadPoolExecutor's ``submit`` cost ~20 us each: a future, a work item, a lock
    and a semaphore). :meth:`submit`, what ``loop.run_in_executor`` calls, wraps the
    call in a future; a future cancelled before a thread takes its call never runs it.
    """

    def __init__(self, size: int, name: str, picker: LevelPicker | None = None) -> None:
        self._calls: _FifoCalls | LevelCalls = (
            _FifoCalls() if picker is None else LevelCalls(picker)
        )
        #: Held while posting and while shutting down: a call is queued before the
        #: threads' end marks (and runs) or refused, never queued behind them.
        self._posting = threading.Lock()
        self._shut = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}_{index}", daemon=True)
            for index in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def post(self, call: Callable[[], object], level: Priority = Priority.NORMAL) -> None:
        """Run ``call()`` on one of the threads; it reports its own outcome. With a
        picker, waiting calls start by level; without, in order."""
        self._put_all((call,), (level,))

    def post_all(
        self, calls: Sequence[Callable[[], object]], levels: Sequence[Priority] | None = None
    ) -> None:
        """:meth:`post` each call, under one lock.

        The poster (the event loop) keeps the GIL until it next blocks or its switch
        interval ends; the woken threads start then. Handing the GIL over at once
        after each post (``time.sleep(0)``, an earlier version) cost more than it gave:
        side by side (``python -m bench.ab``, 20,000 jobs, 5 rounds, memory store,
        classic queue) the drain ran 1.036x as fast without it, the worker's CPU per
        job 0.925x, the broker's 0.928x (fewer, larger multiple acks), and the
        publish-to-start median at 200 jobs/s was 0.955x (not longer).
        """
        self._put_all(calls, levels)

    def _put_all(
        self, calls: Sequence[Callable[[], object]], levels: Sequence[Priority] | None
    ) -> None:
        with self._posting:
            if self._shut:
                raise RuntimeError("the handler threads are shut down")
            if levels is None:
                for call in calls:
                    self._calls.put(call, Priority.NORMAL)
            else:
                for call, level in zip(calls, levels, strict=True):
                    self._calls.put(call, level)

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        return self.submit_at(Priority.NORMAL, fn, *args, **kwargs)

    def submit_at(
        self, level: Priority, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """:meth:`submit`, waiting for a thread at ``level``."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return  # cancelled while it waited for a thread
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:
                future.set_exception(error)
            else:
                future.set_result(result)

        self.post(run, level)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; each thread ends after the calls queued before (a posted job
        sees the worker stopping and does not run; a cancelled future's call neither)."""
        with self._posting:
            self._shut = True
            for _ in self._threads:
                self._calls.end()
        if wait:
            for thread in self._threads:
                thread.join()

    def _serve(self) -> None:
        calls = self._calls
        while (call := calls.get()) is not None:
            try:
                call()
            except BaseException:  # posted calls report their own outcomes: a bug
                log.exception("a call on a handler thread failed")


class _FifoCalls:
    """The handler threads' queue without priorities: in order (a SimpleQueue)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()

    def put(self, call: Callable[[], object], level: Priority) -> None:
        self._queue.put(call)

    def end(self) -> None:
        self._queue.put(None)

    def get(self) -> Callable[[], object] | None:
        return self._queue.get()


class Executor:
    """Runs handlers; at most ``concurrency`` at once. Given a priority policy, jobs
    waiting for a thread or a slot start by level (:mod:`broker_jobs.worker.levels`)."""

    def __init__(
        self, concurrency: int, priorities: PriorityPolicy | None = None, max_wait: float = 900
    ) -> None:
        picker = None if priorities is None else LevelPicker(priorities, max_wait)
        self._pool = HandlerThreads(concurrency, "broker-jobs-handler", picker)
        #: Held from before a job is claimed until it is settled, so a job waiting
        #: for a slot holds no claim (and, on shutdown, can go back unclaimed).
        self._slots: asyncio.Semaphore | LevelSlots = (
            asyncio.Semaphore(concurrency) if picker is None else LevelSlots(concurrency, picker)
        )

    def slot(self, level: Priority = Priority.NORMAL) -> AbstractAsyncContextManager[Any]:
        """``async with executor.slot(level):`` holds one of the ``concurrency`` slots."""
        if isinstance(self._slots, LevelSlots):
            return self._slots.at(level)
        return self._slots

    async def run(
        self,
        handler: Callable[..., Any],
        payload: BaseModel,
        run: Run,
        limit: RunLimit,
        *,
        renew_lease: Callable[[], Awaitable[bool]],
        renew_every: float,
        level: Priority = Priority.NORMAL,
    ) -> Any:
        """Run ``handler(payload)`` inside ``run``; raise what it raises, or
        TimeLimitExceeded. The caller holds a :meth:`slot`."""
        renewer = asyncio.create_task(_renew_forever(renew_lease, renew_every))
        try:
            if inspect.iscoroutinefunction(handler):
                return await run_async_handler(handler, payload, run, limit.seconds)
            return await self._run_in_thread(handler, payload, run, limit, level)
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    async def _run_in_thread(
        self,
        handler: Callable[..., Any],
        payload: BaseModel,
        run: Run,
        limit: RunLimit,
        level: Priority,
    ) -> Any:
        """A sync handler on a pool thread, under its :class:`LimitWatch`: past its
        limit it is interrupted and waited for (its thread, lease and record stay
        taken) until it returns, or until the worker, replacing itself, settles it as
        stuck."""
        loop = asyncio.get_running_loop()
        guard = RunGuard()
        watch = limit.watch(guard)

        def on_thread() -> Any:
            if watch is not None:
                loop.call_soon_threadsafe(watch.arm, time.monotonic())
            with run:
                return guard.call(handler, payload)

        # In the caller's context: the job's execution span stays current in the
        # thread, so spans the handler starts are its children.
        context = contextvars.copy_context()
        ran = asyncio.wrap_future(self._pool.submit_at(level, context.run, on_thread))
        if watch is None:
            return await ran
        settled_as_stuck = asyncio.ensure_future(limit.settled_as_stuck(watch))
        try:
            done, _ = await asyncio.wait(
                (ran, settled_as_stuck), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            settled_as_stuck.cancel()
            if not ran.done():  # cancelled (the worker goes), or stuck: not watched now
                watch.outcome(None)
        if ran not in done:
            raise watch.stuck_error()
        raised = ran.exception()
        error = watch.outcome(raised)
        if error is None:
            return ran.result()
        if error is not raised:
            raise error from None  # an interrupted run's failure is its time limit
        raise error

    def post_all(
        self, calls: Sequence[Callable[[], object]], levels: Sequence[Priority] | None = None
    ) -> None:
        """Run each call on a handler thread (at its level); callable from any thread.
        The calls report their own outcomes (the fast path starts claimed jobs this
        way, from the loop or the store's thread)."""
        self._pool.post_all(calls, levels)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)


class RunLimit:
    """One run's time limit (``seconds``, None: none) and who hears of its overruns."""

    def __init__(self, seconds: float | None, job: Job, overruns: Overruns) -> None:
        self.seconds = seconds
        self._job = job
        self._overruns = overruns

    def watch(
        self, guard: RunGuard, on_stuck: Callable[[], object] | None = None
    ) -> LimitWatch | None:
        """The watch of a sync run under ``guard``; None without a limit."""
        if self.seconds is None:
            return None
        return LimitWatch(self.seconds, self._job, self._overruns, guard, on_stuck)

    async def settled_as_stuck(self, watch: LimitWatch) -> None:
        """Returns once the run is stuck and the worker, replacing itself, settles the
        stuck jobs (their other jobs finished)."""
        await watch.stuck.wait()
        await self._overruns.settle_stuck.wait()


async def run_async_handler(
    handler: Callable[..., Any], payload: BaseModel, run: Run, seconds: float | None
) -> Any:
    """An async handler on the loop inside ``run``, cancelled at its limit (both
    delivery paths run theirs so)."""
    scope = asyncio.timeout(seconds)
    try:
        async with scope:
            with run:
                return await handler(payload)
    except TimeoutError:
        if seconds is not None and scope.expired():  # else the handler's own: its failure
            raise time_limit_error(seconds) from None
        raise
    finally:
        if seconds is not None and not scope.expired() and (run.duration or 0.0) > seconds:
            _say_the_loop_was_held(run, seconds)


def _say_the_loop_was_held(run: Run, seconds: float) -> None:
    """An async handler that ran past its limit without being cancelled held the
    event loop (a blocking call inside ``async def``): the cancellation could not be
    delivered, and the whole worker stood still meanwhile. Its outcome stands, as a
    sync handler's return after its limit does; this says why the limit did not act."""
    job = run.job
    log.warning(
        "job %s (%s, attempt %d): its async handler ran %.1f s, past its %g s time limit,"
        " without giving the event loop a turn, so it could not be cancelled and the"
        " worker's other jobs, heartbeats and lease renewals waited meanwhile: inside"
        " `async def`, await (asyncio.sleep, an async client, asyncio.to_thread) instead of"
        " blocking, or declare the handler with `def` to run it on a thread",
        job.id,
        job.task,
        job.attempt,
        run.duration or 0.0,
        seconds,
        extra={"job_id": job.id, "key": job.idempotency_key, "task": job.task},
    )


async def _renew_forever(renew: Callable[[], Awaitable[bool]], every: float) -> None:
    """Renew every ``every`` seconds until cancelled or the lease is lost (``renew()``
    says False); a renewal that met an unreachable store is tried again at the next
    turn (stopping would let the lease lapse under a running handler once the store
    is back)."""
    while True:
        await asyncio.sleep(every)
        if not await renew():
            return


def handler_failure(error: BaseException) -> Exception:
    """What a handler raised, as the failure its task's policy decides: a
    ``KeyboardInterrupt`` or ``SystemExit`` raised by the handler itself (not an
    ``Exception``) as a ``RuntimeError`` naming it, since it must not end the worker."""
    return error if isinstance(error, Exception) else RuntimeError(repr(error))
