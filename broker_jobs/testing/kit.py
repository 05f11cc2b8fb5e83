"""Test your jobs without a broker: publish through the production API, run the
queued jobs in the test's process with the real worker's decision code, move a
clock instead of sleeping, and assert on what the ledger says.

    kit = JobsKit(app)
    kit.publisher().publish(resize, Resize(url="u", width=128))
    kit.run()                         # what is due now, retries without delay included
    kit.advance(minutes=5)            # time moves; delayed jobs and retries run when due
    assert kit.record(job).status is Status.SUCCEEDED

docs/testing.md describes it; the pytest fixtures are in
:mod:`broker_jobs.testing.pytest_plugin`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from collections import Counter
from collections.abc import Coroutine
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from broker_jobs.app import App
from broker_jobs.clock import clock_override
from broker_jobs.closing import Closing
from broker_jobs.envelope import Job, WireMessage, decode
from broker_jobs.errors import BrokerJobsError, DecodeError, HandlerStuckError
from broker_jobs.job_context import JobContext
from broker_jobs.publish.prepare import JobFactory
from broker_jobs.store.base import JobRecord, Store
from broker_jobs.store.memory import MemoryStore
from broker_jobs.testing.memory_broker import DEFAULT_START, MemoryBroker, TestClock
from broker_jobs.testing.memory_publishers import MemoryAsyncPublisher, MemoryPublisher
from broker_jobs.testing.memory_worker import MemoryWorker, wire_of
from broker_jobs.worker.follow_ups import build_follow_up
from scheduler.config import load_schedules
from scheduler.emitter import Emitter
from topology import names as n

T = TypeVar("T")

#: How far :meth:`JobsKit.run_all` moves the clock before it calls the jobs endless.
RUN_ALL_LIMIT = timedelta(days=400)
#: Real seconds a sync handler may run past its time limit before the kit's worker is
#: replaced, as ``broker-jobs worker --overrun-grace`` (30) replaces a worker.
DEFAULT_OVERRUN_GRACE = 30.0


class KitError(BrokerJobsError):
    """The testing kit was used in a way it cannot honour (the message says how to)."""


@dataclass(frozen=True)
class DeadLetter:
    """A message in a task's dead-letter queue, as the worker left it there."""

    job_id: str | None
    reason: str | None
    error: str | None
    attempts: int | None
    message: WireMessage

    @property
    def job(self) -> Job:
        """The job itself (:class:`~broker_jobs.DecodeError` for a poison message)."""
        return decode(self.message)


class JobsKit(Closing):
    """An app's queues in memory, a worker running them on demand, and a clock.

    ``store`` defaults to a :class:`~broker_jobs.MemoryStore` (pass an SQLite or
    PostgreSQL store to test against the ledger you deploy); ``start`` is the clock's
    first reading. Inside the kit (until :meth:`close`), every time broker-jobs
    reads (due times, leases, retries, the ledger's stamps) is the kit's clock.
    """

    def __init__(
        self,
        app: App,
        *,
        store: Store | None = None,
        start: datetime = DEFAULT_START,
        concurrency: int = 4,
        worker_id: str = "test-worker",
        overrun_grace: float = DEFAULT_OVERRUN_GRACE,
    ) -> None:
        self.app = app
        self.clock = TestClock(start)
        self.store: Store = store if store is not None else MemoryStore()
        self.broker = MemoryBroker(app.topology(), self.clock)
        self._stack = ExitStack()
        self._stack.enter_context(clock_override(self.clock.now))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="broker-jobs-kit", daemon=True
        )
        self._thread.start()
        self._closed = False
        self._new_worker = functools.partial(
            MemoryWorker,
            app,
            self.store,
            self.broker,
            concurrency=concurrency,
            worker_id=worker_id,
            overrun_grace=overrun_grace,
        )
        #: The outcomes of the workers replaced after a stuck handler.
        self._past_outcomes: Counter[str] = Counter()
        self._worker = self._on_loop(self._make_worker())

    async def _make_worker(self) -> MemoryWorker:
        return self._new_worker()  # on the kit's loop: its events belong there

    # -- publishing ---------------------------------------------------------------------

    def publisher(self, *, ledger: Store | None = None) -> MemoryPublisher:
        """A :class:`~broker_jobs.Publisher` publishing to the kit (the same API and
        errors); ``ledger`` records confirmed jobs as in production."""
        return MemoryPublisher(self.broker, self.app, ledger=ledger)

    def async_publisher(self, *, ledger: Store | None = None) -> MemoryAsyncPublisher:
        """An :class:`~broker_jobs.AsyncPublisher` publishing to the kit."""
        return MemoryAsyncPublisher(self.broker, self.app, ledger=ledger)

    def context(self, task: str, **fields: Any) -> JobContext:
        """A :class:`~broker_jobs.JobContext` for calling ``task``'s handler directly
        (``fields`` as for ``JobContext.for_test``), with the task's ``max_attempts``
        and ``time_limit`` as a worker gives them, and whose ``then()`` checks each
        follow-up against the kit's app as a worker does: an unknown task or an
        invalid payload is a :class:`~broker_jobs.errors.FollowUpError`."""
        if task in self.app:
            spec = self.app.get(task)
            fields = {
                "max_attempts": spec.retry.max_attempts,
                "time_limit": spec.time_limit,
                **fields,
            }
        context = JobContext.for_test(task, **fields)
        parent = Job(
            id=context.job_id,
            task=task,
            idempotency_key=context.idempotency_key,
            attempt=context.attempt,
            traceparent=context.traceparent,
            tracestate=context.tracestate,
        )
        builder = functools.partial(build_follow_up, JobFactory(self.app, None), parent)
        return dataclasses.replace(context, _build_follow_up=builder)

    # -- running ------------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        return self.clock.now()

    @property
    def outcomes(self) -> Counter[str]:
        """What the worker did so far, by outcome: ``succeeded``, ``retried``,
        ``duplicate``, ``dead:<reason>`` (``dead:exhausted``, ``dead:schema``, ...)."""
        return self._past_outcomes + Counter(self._worker.outcomes)

    def run(self) -> int:
        """Run every job due now, and what they make due now, until none is; how many
        deliveries were run. The clock does not move.

        A sync handler still running ``overrun_grace`` seconds past its time limit is
        what makes a worker exit with code 70: its attempt is recorded as failed by its
        time limit (retried when due, or dead-lettered), :class:`HandlerStuckError` is
        raised here, and the kit goes on with a new worker, as a restarter would."""
        try:
            return self._on_loop(self._worker.run_ready())
        except HandlerStuckError:
            self._past_outcomes += self._worker.outcomes
            self._worker.replaced()
            self._worker = self._on_loop(self._make_worker())
            raise

    def advance(
        self, delta: timedelta | None = None, *, seconds: float = 0, minutes: float = 0,
        hours: float = 0, days: float = 0,
    ) -> int:  # fmt: skip
        """Move the clock forward, running each job when it falls due on the way
        (delayed jobs, retries after their backoff); how many deliveries were run."""
        step = (delta or timedelta()) + timedelta(
            seconds=seconds, minutes=minutes, hours=hours, days=days
        )
        if step < timedelta():
            raise KitError("the kit's clock only goes forward: advance by a positive time")
        return self.run_until(self.now + step)

    def run_until(self, moment: datetime) -> int:
        """Move the clock to ``moment``, running jobs as they fall due."""
        ran = self.run()
        while (event := self._next_event()) is not None and event <= moment:
            self.clock.set(max(event, self.now))
            self.broker.expire()
            ran += self.run()
        self.clock.set(max(moment, self.now))
        self.broker.expire()
        return ran + self.run()

    def run_all(self, *, limit: timedelta = RUN_ALL_LIMIT) -> int:
        """Run until no job is queued, delayed or retrying, moving the clock as far
        as that takes (at most ``limit``: past it, :class:`KitError`)."""
        give_up_at = self.now + limit
        ran = self.run()
        while (event := self._next_event()) is not None:
            if event > give_up_at:
                raise KitError(
                    f"jobs still wait after {limit} of test time: a job that retries forever"
                    " or schedules itself again? Use advance() for a bounded span"
                )
            ran += self.run_until(event)
        return ran

    def run_schedules(self, until: datetime | timedelta) -> list[Job]:
        """Emit the app's schedules' fires from now to ``until`` (a time, or a span
        from now) as a beat leader would, each at its time, running jobs on the way;
        the jobs emitted (their keys are the fires' deterministic keys)."""
        end = self.now + until if isinstance(until, timedelta) else until
        emitter = Emitter(JobFactory(self.app, None))
        fires = sorted(
            (fire, schedule.name, schedule)
            for schedule in load_schedules(self.app)
            for fire in schedule.timing.fires(self.now, end)
        )
        emitted = []
        for fire, _, schedule in fires:
            self.run_until(fire)
            job, message, exchange, routing_key = emitter.job_for(schedule, fire)
            if not self.broker.publish(exchange, routing_key, wire_of(message)):
                raise KitError(f"schedule {schedule.name}'s task {job.task!r} has no queue")
            emitted.append(job)
            self.run()
        self.run_until(end)
        return emitted

    def _next_event(self) -> datetime | None:
        times = [t for t in (self.broker.next_expiry(), self._worker.next_due) if t is not None]
        return min(times, default=None)

    # -- what happened ------------------------------------------------------------------

    def record(self, job: Job | str) -> JobRecord | None:
        """The ledger's record of a job (or of a key or job id)."""
        return self.store.lookup(job.id if isinstance(job, Job) else job)

    def result(self, job: Job | str) -> Any:
        """What the job's handler returned (JSON values), None if nothing."""
        return self.store.result(job.id if isinstance(job, Job) else job)

    def queued(self, task: str) -> list[Job]:
        """The jobs waiting in ``task``'s queues now (not the delayed ones)."""
        queues = self.app.queue_names(task)
        return [decode(message) for queue in queues for message in self.broker.messages(queue)]

    def dead_letters(self, task: str) -> list[DeadLetter]:
        """What the worker dead-lettered for ``task``, oldest first, with the reason."""
        queue = self.app.names.dead_letter_queue(task)
        return [_dead_letter(message) for message in self.broker.messages(queue)]

    def pending(self) -> int:
        """Messages anywhere in the kit: queued, in the delay ladder, held until due."""
        held = sum(self.broker.depth(queue) for queue in self.broker.queue_names())
        dead = sum(
            self.broker.depth(self.app.names.dead_letter_queue(spec.name)) for spec in self.app
        )
        return held - dead + self._worker.holding

    # -- the kit's own loop ---------------------------------------------------------------

    def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            work.close()
            raise KitError("this kit is closed: make a new JobsKit")
        if threading.current_thread() is self._thread:
            work.close()
            raise KitError("a handler cannot drive the kit that runs it")
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def close(self) -> None:
        """Stop the kit's worker and give the system clock back."""
        if self._closed:
            return
        try:
            self._worker.close()  # threads only: nothing of it runs between calls
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self._stack.close()


def _dead_letter(message: WireMessage) -> DeadLetter:
    headers = message.headers
    attempts = headers.get(n.HEADER_DEAD_ATTEMPTS)
    try:
        job_id: str | None = decode(message).id
    except DecodeError:
        job_id = message.message_id
    return DeadLetter(
        job_id=job_id,
        reason=_text(headers.get(n.HEADER_DEAD_REASON)),
        error=_text(headers.get(n.HEADER_DEAD_ERROR)),
        attempts=int(attempts) if attempts is not None else None,
        message=message,
    )


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
