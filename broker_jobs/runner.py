"""The execution protocol for one delivery (docs/worker.md).

    receive -> decode + validate -> hold until due -> claim in the store
      DONE / STALE          -> ack (a duplicate)
      BUSY (live lease)     -> publish a re-check through the delay path, ack
      CLAIMED               -> run
        success             -> record SUCCEEDED, ack
        retryable failure   -> publish the next attempt (confirmed), record RETRYING, ack
        otherwise           -> dead-letter (confirmed), record DEAD, ack

Every ack comes after the outcome was recorded or the replacing message confirmed,
so a crash at any step leaves the delivery unacked: RabbitMQ redelivers it and the
store's record decides what happens then. Nothing here raises for a bad job.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import aio_pika
import aio_pika.abc
from aiormq.abc import DeliveredMessage
from pydantic import BaseModel

from broker_jobs.app import App, TaskSpec
from broker_jobs.async_publisher import AsyncPublisher
from broker_jobs.dead_letters import DeathCause, dead_letter_message, publish_dead_letter
from broker_jobs.due import seconds_until_due
from broker_jobs.envelope import Job, decode, utc_now
from broker_jobs.errors import BrokerJobsError, DecodeError
from broker_jobs.execution import Executor
from broker_jobs.pipeline import Pipeline, wire_message
from broker_jobs.store.base import ClaimOutcome, LeaseLostError, Status, Store
from topology import names as n
from topology.delay import MAX_HOLD
from topology.model import QueueType

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class RunnerSettings:
    worker_id: str
    #: Seconds a claim stays ours without renewal; renewed every third of it.
    lease: float = 60.0
    confirm_timeout: float = 10.0

    @property
    def recheck_every(self) -> float:
        """How often a delivery whose job runs under a live lease looks again."""
        return min(5.0, self.lease / 4)

    @property
    def hold_busy_for(self) -> float:
        """How long such a delivery is held before it is handed back to the ladder:
        two leases cover a holder that died (its lease lapses), far below the
        broker's consumer_timeout."""
        return 2 * self.lease


@dataclass
class Outcomes:
    """Counters of what the runner did, by outcome (for logs, tests and metrics)."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: str) -> None:
        self.counts[outcome] += 1


class Runner:
    """Applies the execution protocol to each delivery of the app's tasks."""

    def __init__(
        self,
        app: App,
        store: Store,
        *,
        executor: Executor,
        publisher: AsyncPublisher,
        channel: aio_pika.abc.AbstractChannel,
        settings: RunnerSettings,
    ) -> None:
        self._app = app
        self._store = store
        self._executor = executor
        self._publisher = publisher
        self._channel = channel
        self._settings = settings
        self.outcomes = Outcomes()
        # One thread for the store's short calls: several threads would only take
        # turns at the GIL and at SQLite's write lock (measured: slower, not faster).
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="broker-jobs-store")
        self._stopping = False
        self._deliveries = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._pipeline = Pipeline(self)

    # -- what the worker and the fast path use ---------------------------------------------

    @property
    def app(self) -> App:
        return self._app

    @property
    def store(self) -> Store:
        return self._store

    @property
    def executor(self) -> Executor:
        return self._executor

    @property
    def settings(self) -> RunnerSettings:
        return self._settings

    @property
    def stopping(self) -> bool:
        """Set by the worker on shutdown: jobs not started yet are left unsettled."""
        return self._stopping

    @stopping.setter
    def stopping(self, stopping: bool) -> None:
        # Read by the handler threads too: a claimed job not started by then gives
        # its claim back instead of running (docs/worker.md, graceful shutdown).
        self._stopping = stopping

    @property
    def busy(self) -> bool:
        """Whether any delivery is in hand (burst mode waits for this to end)."""
        return self._pipeline.busy or bool(self._tasks)

    def start(self) -> None:
        self._pipeline.start()

    def deliver(self, delivered: DeliveredMessage, task: str) -> None:
        """Take a delivery from ``task``'s queue (the consumer's callback)."""
        self._pipeline.deliver(delivered, task)

    async def finish(self, grace: float) -> None:
        """After ``stopping`` was set: let running jobs settle within ``grace`` seconds;
        deliveries not started stay unsettled (the broker gives them back)."""
        deadline = asyncio.get_running_loop().time() + grace
        if not await self._pipeline.wait_idle(grace):
            log.warning("jobs did not finish within the grace period")
        await self._pipeline.stop()
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=remaining)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("%d jobs did not finish within the grace period", len(pending))

    def next_holder(self) -> str:
        """A holder id of its own for each delivery: two copies of one job in this
        worker at once must not both count as "ours"."""
        return f"{self._settings.worker_id}#{next(self._deliveries)}"

    def spawn(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        task: str,
        outcome: Coroutine[Any, Any, str | None],
    ) -> None:
        """Settle a delivery on the per-delivery path: await ``outcome``, then ack."""
        running = asyncio.create_task(self._settle(message, task, outcome))
        self._tasks.add(running)
        running.add_done_callback(self._tasks.discard)

    async def _settle(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        task: str,
        outcome_of: Coroutine[Any, Any, str | None],
    ) -> None:
        try:
            outcome = await outcome_of
            if outcome is None:
                # Stopping before the job started: leave it unsettled; closing the
                # channel returns it to the queue for another worker.
                self.outcomes.add("left")
                return
        except Exception:
            log.exception("processing a %s delivery failed; returning it to the queue", task)
            await self.give_back(message, task)
            return
        await self.ack(message, task, outcome)

    async def give_back(self, message: aio_pika.abc.AbstractIncomingMessage, task: str) -> None:
        """Our own failure (the store unreachable): return the delivery to the queue;
        its redelivery meets the store's record again."""
        self._pipeline.forget(message)
        await message.nack(requeue=True)
        self.outcomes.add("returned")

    async def ack(
        self, message: aio_pika.abc.AbstractIncomingMessage, task: str, outcome: str
    ) -> None:
        """Ack a settled delivery (its outcome recorded) and count the outcome."""
        self._pipeline.forget(message)
        try:
            await message.ack()
        except Exception:  # the outcome is recorded: the redelivery will find it done
            log.warning("acking a %s delivery failed; it will be redelivered", task)
            self.outcomes.add("ack-failed")
            return
        self.outcomes.add(outcome)

    def in_store(
        self,
        call: Callable[..., T],
        *args: Any,
        after: Callable[[T], None] | None = None,
        **kwargs: Any,
    ) -> asyncio.Future[T]:
        """``call(*args, **kwargs)`` off the loop, on the store's own thread, queued
        at once (a store with ``submit`` batches what waits there into one
        transaction); await the future for the result. ``after(result)`` runs on
        that thread as soon as the result is in."""
        submit = getattr(self._store, "submit", None)
        if submit is not None and getattr(call, "__self__", None) is self._store:
            return submit(call.__name__, *args, after=after, **kwargs)  # type: ignore[no-any-return]

        def in_thread() -> T:
            result = call(*args, **kwargs)
            if after is not None:
                after(result)
            return result

        return asyncio.get_running_loop().run_in_executor(self._store_thread, in_thread)

    def close(self) -> None:
        self._store_thread.shutdown(wait=True)

    async def process(self, message: aio_pika.abc.AbstractIncomingMessage, task: str) -> str | None:
        try:
            job = decode(wire_message(message))
            spec = self._app.get(job.task)
            payload = spec.validate(job.payload)
        except DecodeError as error:
            return await self._dead_letter(message, task, DeathCause(error.reason, str(error)))
        except BrokerJobsError as error:  # unknown task, invalid payload
            reason = "unknown-task" if job.task not in self._app else "schema"
            return await self._dead_letter(message, task, DeathCause(reason, str(error)))
        return await self.process_decoded(message, job, spec, payload)

    async def process_decoded(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        job: Job,
        spec: TaskSpec,
        payload: BaseModel,
    ) -> str | None:
        """The protocol from a decoded, valid job on: hold until due, claim, run."""
        hold = seconds_until_due(job, utc_now())
        if hold > MAX_HOLD:
            # Published for later without going through the ladder (by hand, or by a
            # foreign publisher): send it through the ladder rather than hold it.
            await self._republish(job, eta=job.due_at)
            return "rerouted"
        await asyncio.sleep(hold)
        return await self.run_when_free(message, job, spec, payload)

    async def run_when_free(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        job: Job,
        spec: TaskSpec,
        payload: BaseModel,
    ) -> str | None:
        """Claim and run, holding the delivery while the job runs under a live lease
        elsewhere. A worker that died mid-job leaves its lease to lapse and this
        delivery (the same message, redelivered) takes over: its delivery count is
        kept, so a job that kills every worker still meets the queue's delivery
        limit. A holder that stays alive longer gets a re-check through the ladder.
        """
        settings = self._settings
        deadline = asyncio.get_running_loop().time() + settings.hold_busy_for
        while True:
            async with self._executor.slots:
                if self.stopping:
                    return None
                outcome = await self._claim_and_run(message, job, spec, payload)
            if outcome != "busy":
                return outcome
            if asyncio.get_running_loop().time() >= deadline:
                await self._republish(job, delay=settings.hold_busy_for)
                return "busy"
            await asyncio.sleep(settings.recheck_every)

    async def _claim_and_run(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        job: Job,
        spec: TaskSpec,
        payload: BaseModel,
    ) -> str:
        settings, store = self._settings, self._store
        # Each delivery claims under its own holder id: two copies of one job in
        # this worker at once must not both count as "ours".
        holder = self.next_holder()
        death = await self._crash_loop(message, job, spec)
        claim = await self.in_store(store.claim, job, holder, settings.lease)
        if claim.outcome in (ClaimOutcome.DONE, ClaimOutcome.STALE):
            return "duplicate"
        if claim.outcome is ClaimOutcome.BUSY:
            return "busy"
        if spec.handler is None:
            death = DeathCause("no-handler", "this app has no handler")
        if death is not None:
            return await self._dead_letter(message, job.task, death, job, holder)
        return await self._run(message, job, spec, payload, holder)

    async def _run(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        job: Job,
        spec: TaskSpec,
        payload: BaseModel,
        holder: str,
    ) -> str:
        """Run the claimed job's handler; record the outcome."""
        settings, store = self._settings, self._store
        assert spec.handler is not None  # checked by the caller
        if spec.transactional:
            return await self._run_in_transaction(message, job, spec, payload, holder)
        try:
            await self._executor.run(
                spec.handler,
                payload,
                spec.time_limit,
                self._renewer(job, holder),
                settings.lease / 3,
            )
        except Exception as error:  # the handler's failure, decided by its policy
            return await self.after_failure(message, job, spec, error, holder)
        try:
            await self.in_store(store.succeed, job.idempotency_key, holder)
        except LeaseLostError:
            log.warning("job %s finished after its lease was taken over", job.id)
        return "succeeded"

    async def _run_in_transaction(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        job: Job,
        spec: TaskSpec,
        payload: BaseModel,
        holder: str,
    ) -> str:
        """The handler's writes and the success record in one store transaction."""
        handler = spec.handler
        assert handler is not None

        def effects(db: object) -> None:
            handler(payload, db)

        try:
            await asyncio.to_thread(self._store.succeed_with, job.idempotency_key, holder, effects)
        except LeaseLostError:
            log.warning("job %s: lease taken over before its transaction; not run", job.id)
            return "duplicate"
        except Exception as error:  # rolled back: decided by the task's policy
            return await self.after_failure(message, job, spec, error, holder)
        return "succeeded"

    async def after_failure(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        job: Job,
        spec: TaskSpec,
        error: Exception,
        holder: str,
    ) -> str:
        decision = spec.retry.decide(error, job.attempt)
        if decision.delay is not None:
            due = utc_now() + timedelta(seconds=decision.delay)
            # The next attempt is confirmed before this one is recorded and acked.
            await self._republish(job.copy(attempt=job.attempt + 1), delay=decision.delay)
            text = f"{type(error).__name__}: {error}"
            await self.in_store(self._store.retry, job.idempotency_key, holder, text, due)
            return "retried"
        reason = "permanent" if "permanent" in decision.reason else "exhausted"
        cause = DeathCause.from_exception(reason, error, job.attempt)
        return await self._dead_letter(message, job.task, cause, job, holder)

    async def _dead_letter(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        task: str,
        cause: DeathCause,
        job: Job | None = None,
        holder: str | None = None,
    ) -> str:
        properties = message.properties
        dead = dead_letter_message(
            message.body,
            {
                "headers": message.headers,
                "content_type": properties.content_type,
                "content_encoding": properties.content_encoding,
                "message_id": properties.message_id,
                "type": properties.message_type,
                "timestamp": properties.timestamp,
            },
            cause,
            self._settings.worker_id,
        )
        await publish_dead_letter(
            self._channel, self._app.names, task, dead, self._settings.confirm_timeout
        )
        if job is not None:
            await self.in_store(self._store.dead, job.idempotency_key, holder, cause.error, job=job)
        elif properties.message_id:
            # A poison message never became a job: the ledger still says it is dead,
            # under its idempotency key if it had a readable one, else its id.
            key = message.headers.get(n.HEADER_IDEMPOTENCY_KEY)
            await self.in_store(
                self._store.dead,
                key if isinstance(key, str) and key else properties.message_id,
                None,
                f"{cause.reason}: {cause.error}",
                job_id=properties.message_id,
                task=task,
            )
        log.warning("dead-lettered a %s job (%s): %s", task, cause.reason, cause.error[:200])
        return f"dead:{cause.reason}"

    async def _republish(
        self, job: Job, *, delay: float | None = None, eta: datetime | None = None
    ) -> None:
        """Publish ``job`` again, same id, key, attempt and trace, through the delay
        path; confirmed before the caller acks the delivery it replaces."""
        await self._publisher.publish(
            job.task,
            job.payload,
            job_id=job.id,
            idempotency_key=job.idempotency_key,
            attempt=job.attempt,
            traceparent=job.traceparent,
            tracestate=job.tracestate,
            delay=delay,
            eta=eta,
        )

    async def _crash_loop(
        self, message: aio_pika.abc.AbstractIncomingMessage, job: Job, spec: TaskSpec
    ) -> DeathCause | None:
        """The cause to dead-letter a job whose runs keep killing their workers.

        On the last delivery its quorum queue allows, a job the ledger shows running
        under a lapsed lease was being run when its worker died. Run again and dying
        again, the queue would dead-letter it with nobody left to record it: the
        ledger would say "running" forever. So it is dead-lettered here, one run
        before the broker would, and recorded dead. The broker's limit stays the
        backstop (a crash before the claim, a job that crashes the worker at decode).
        """
        options = spec.queue
        count = message.headers.get(n.HEADER_DELIVERY_COUNT)
        if (
            options.queue_type is not QueueType.QUORUM
            or not isinstance(count, int)
            or count < options.delivery_limit
        ):
            return None
        record = await self.in_store(self._store.get, job.idempotency_key)
        now = utc_now()
        if (
            record is None
            or record.status is not Status.RUNNING
            or record.worker is None  # released on a graceful stop: not a crash
            or (record.lease_until is not None and record.lease_until > now)
        ):
            return None
        return DeathCause(
            "crash-loop",
            f"its worker died while running it: delivered {count + 1} times, the queue's"
            f" delivery limit is {options.delivery_limit}; last holder {record.worker}",
            job.attempt,
        )

    def _renewer(self, job: Job, holder: str) -> Callable[[], Awaitable[None]]:
        async def renew() -> None:
            await self.in_store(
                self._store.renew, job.idempotency_key, holder, self._settings.lease
            )

        return renew
