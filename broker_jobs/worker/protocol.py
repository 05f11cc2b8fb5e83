"""The execution protocol for one delivery (docs/internals/execution.md).

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

Why one module of some 720 lines: it is the one place that decides each step of a
delivery for both routes (the fast path calls ``run_when_free``, ``after_success``,
``after_failure``); split, every step would be read across files, and the order of
record-then-ack is what a reader must be able to check in one go.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

import aio_pika.abc
import aiormq.exceptions
from pydantic import BaseModel

from broker_jobs.app import App, TaskSpec
from broker_jobs.clock import utc_now
from broker_jobs.dead_letter import dead_letter_from
from broker_jobs.due import InvalidDelayError, due_time, seconds_until_due
from broker_jobs.envelope import Job
from broker_jobs.errors import (
    BrokerConnectionError,
    BrokerJobsError,
    ConfirmTimeoutError,
    DecodeError,
)
from broker_jobs.publish.async_publisher import AsyncPublisher
from broker_jobs.store.base import (
    ExecutionOutcome,
    JobRecord,
    LeaseLostError,
    Output,
    Status,
    Store,
    StoreError,
)
from broker_jobs.store.processes import Liveness, liveness
from broker_jobs.worker.calling import bound_handler
from broker_jobs.worker.claims import BUSY, RUN, claim_verdict
from broker_jobs.worker.dead_holders import DeadHolders
from broker_jobs.worker.dead_letters import DeathCause, dead_letter_message, publish_dead_letter
from broker_jobs.worker.delivery import Delivery, WrongQueueError, decode_for_queue, wire_message
from broker_jobs.worker.delivery_limit import Rescue, at_delivery_limit, judge_last_delivery
from broker_jobs.worker.execution import (
    STUCK_RETRY_FLOOR,
    Executor,
    RunLimit,
    TimeLimitExceeded,
    handler_failure,
)
from broker_jobs.worker.follow_ups import FollowUps
from broker_jobs.worker.ledger_gate import LedgerGate, LedgerGaveUp, StalledCalls
from broker_jobs.worker.link import BrokerLink, LinkStoppedError
from broker_jobs.worker.observer import JobObserver, Run
from broker_jobs.worker.overrun import Overruns
from broker_jobs.worker.publish_outage import PublishOutage
from broker_jobs.worker.settings import ProtocolSettings
from broker_jobs.worker.settling import Finished, Settled, Settling
from broker_jobs.worker.strikes import Strikes
from topology import names as n
from topology.delay import MAX_HOLD

log = logging.getLogger(__name__)
T = TypeVar("T")

#: What a publish raises when the link, not the broker's judgement, failed it: made
#: again on the next connection (a confirm timeout too: the same id and key is safe).
LINK_ERRORS: tuple[type[BaseException], ...] = (
    BrokerConnectionError,
    ConfirmTimeoutError,
    TimeoutError,
    ConnectionError,
    aiormq.exceptions.ChannelInvalidStateError,
)
#: Seconds between two publishes of a job while the link is up but the publish fails.
RETRY_PUBLISH_AFTER = 0.5


def _recorded_by(lost: LeaseLostError, holder: str | None, outcome: Status) -> bool:
    """Whether the record a lost lease met shows ``outcome`` recorded by ``holder``
    itself (an earlier try's commit, see :meth:`JobRecord.outcome_by`)."""
    record = lost.record
    return holder is not None and record is not None and record.outcome_by(holder) is outcome


class Runner:
    """Applies the execution protocol to each delivery of the app's tasks, over as
    many connections as the worker's link goes through."""

    def __init__(
        self,
        app: App,
        store: Store,
        *,
        executor: Executor,
        publisher: AsyncPublisher,
        link: BrokerLink,
        settings: ProtocolSettings,
        observer: JobObserver | None = None,
    ) -> None:
        self._app = app
        self._store = store
        self._executor = executor
        self._publisher = publisher
        #: Says once that publishes fail (a blocked broker), not once per try.
        self.publish_outage = PublishOutage()
        self._link = link
        self._settings = settings
        #: Logs each outcome and, given metrics, counts it (both paths report there).
        self.observer = observer or JobObserver(app.namespace, settings.worker_id)
        #: Sync handlers past their time limit, on both paths.
        self.overruns = Overruns(settings.overrun_grace, self.observer)
        #: Holds deliveries while the store fails, on both paths.
        self.ledger = LedgerGate(repr(store), self.observer)
        #: Store calls in flight: a stalled one counts as the ledger failing.
        self.stalls = StalledCalls(self.ledger)
        #: Renewing, recording successes, acking: the steps both paths end with.
        self.settling = Settling(
            store, self.ledger, self.observer, recorded=self.recorded, in_store=self.in_store
        )
        self.outcomes = self.settling.outcomes
        #: The next steps handlers ask for, published after their success (both paths).
        self.follow_ups = FollowUps(
            app,
            store,
            publish_job=self._publish_follow_up,
            recorded=self.recorded,
            stopping=lambda: self._stopping,
        )
        # One thread for the store's short calls: several threads would only take
        # turns at the GIL and at SQLite's write lock (measured: slower, not faster).
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="broker-jobs-store")
        #: Messages whose processing failed unexpectedly: dead-lettered the 2nd time.
        self._strikes = Strikes()
        #: Holders of busy claims known dead (killed on this host): not waited for.
        self._dead_holders = DeadHolders(store, app.namespace)
        self._stopping = False
        #: Tasks whose jobs must not start (paused: :mod:`broker_jobs.worker.controls`).
        self.paused: frozenset[str] = frozenset()
        self._deliveries = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

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
    def settings(self) -> ProtocolSettings:
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
        """Whether a delivery is in hand on the per-delivery path."""
        return bool(self._tasks)

    @property
    def in_hand(self) -> int:
        """Deliveries in hand on the per-delivery path."""
        return len(self._tasks)

    def must_not_start(self, message: Delivery) -> bool:
        """A job not started yet is left unsettled when the worker stops or the
        delivery's channel is lost (the broker redelivers it; its copy runs), and
        returned to its queue when its task is paused (:meth:`not_started`)."""
        return self._stopping or message.acks.lost or message.task in self.paused

    async def not_started(self, message: Delivery, task: str) -> None:
        """A delivery whose job did not start. A paused task's goes back to its queue
        now (a nack with requeue: on a quorum queue that counts as a delivery, and a
        job it brings to the delivery limit is rescued there, not dead-lettered, as it
        was not running); any other is left unsettled (the worker stops, or the channel
        is gone: the broker returns it when the channel closes)."""
        if task in self.paused and not self._stopping and not message.acks.lost:
            await self.settling.give_back(message.acks, message.tag, task, outcome="paused")
        else:
            self.settling.leave(message.acks, message.tag)

    async def finish(self, grace: float) -> int:
        """After ``stopping`` was set: let the per-delivery path's jobs settle within
        ``grace`` seconds; the rest is cancelled (and left unsettled). How many were."""
        if not self._tasks:
            return 0
        _, pending = await asyncio.wait(self._tasks, timeout=grace)
        for task in pending:
            task.cancel()
        return len(pending)

    def next_holder(self) -> str:
        """A holder id of its own for each delivery: two copies of one job in this
        worker at once must not both count as "ours"."""
        return f"{self._settings.worker_id}#{next(self._deliveries)}"

    def spawn(
        self,
        message: Delivery,
        task: str,
        outcome: Coroutine[Any, Any, str | None],
    ) -> None:
        """Settle a delivery on the per-delivery path: await ``outcome``, then ack."""
        running = asyncio.create_task(self._settle(message, task, outcome))
        self._tasks.add(running)
        running.add_done_callback(self._tasks.discard)

    async def _settle(
        self,
        message: Delivery,
        task: str,
        outcome_of: Coroutine[Any, Any, str | None],
    ) -> None:
        try:
            outcome = await outcome_of
        except (LedgerGaveUp, StoreError):
            # Our outage, not the job's: never handed back in a loop (each return
            # would count against the queue's delivery limit). Left unsettled: the
            # broker returns it when the channel goes, and its record decides then.
            outcome = None
        except Exception as error:
            outcome = await self._after_unexpected(message, task, error)
            if outcome is None:
                return
        if outcome is None:  # stopping, paused, or the channel lost, before the job started
            await self.not_started(message, task)
            return
        await self.settling.ack(message.acks, [Settled(message.tag, task, outcome)])

    async def _after_unexpected(self, message: Delivery, task: str, error: Exception) -> str | None:
        """A delivery whose processing raised ``error``, which no rule expected: given
        back, or dead-lettered the second time (:mod:`~broker_jobs.worker.strikes`).
        The dead letter's outcome, or None once it was given back."""
        message_id = message.properties.message_id
        if self._strikes.out(message_id):
            log.error(
                "processing message %s of %s failed again (%s: %s); dead-lettering it",
                message_id,
                task,
                type(error).__name__,
                error,
                exc_info=error,
            )
            cause = DeathCause.from_exception("worker-error", error, 0)
            try:
                return await self._dead_letter(message, task, cause, record=False)
            except Exception:
                log.exception("dead-lettering message %s failed; returning it", message_id)
        else:
            log.exception("processing a %s delivery failed; returning it to the queue", task)
        await self.settling.give_back(message.acks, message.tag, task)
        return None

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
            return self.stalls.track(submit(call.__name__, *args, after=after, **kwargs))

        def in_thread() -> T:
            result = call(*args, **kwargs)
            if after is not None:
                after(result)
            return result

        return self.stalls.track(
            asyncio.get_running_loop().run_in_executor(self._store_thread, in_thread)
        )

    async def recorded(
        self,
        call: Callable[..., T],
        *args: Any,
        give_up: Callable[[], bool] | None = None,
        **kwargs: Any,
    ) -> T:
        """:meth:`in_store`, held through a ledger outage (:class:`LedgerGate`): tried
        again until the store answers; ``give_up()`` true after a failure raises
        :class:`LedgerGaveUp` instead."""
        return await self.ledger.call(lambda: self.in_store(call, *args, **kwargs), give_up=give_up)

    def held(self) -> str | None:
        """Why the worker holds its deliveries now (None: it does not): a handler
        stuck past its time limit, the ledger failing, the broker confirming none of
        its publishes. ``/readyz``'s 503 and the heartbeat's ``held``; only reads."""
        return self.overruns.describe() or self.ledger.describe() or self.publish_outage.describe()

    async def record_outcome(
        self,
        outcome: Status,
        call: Callable[..., None],
        key: str,
        holder: str | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """:meth:`recorded` for ``holder``'s ``outcome`` of ``key`` (``store.retry``,
        ``store.dead``), whose replacement (the next attempt, the dead letter) is
        confirmed already. A try after the ledger failed that meets a lost lease met
        the earlier try's commit, whose answer the failure took: the record shows
        ``outcome`` by ``holder``, or has moved on since (the next attempt claimed it
        as the ledger came back). Recorded either way, so the delivery is acked, not
        held unacked as a lease lost on a first try is."""
        tries = 0

        def attempt() -> asyncio.Future[None]:
            nonlocal tries
            tries += 1
            return self.in_store(call, key, holder, *args, **kwargs)

        try:
            await self.ledger.call(attempt)
        except LeaseLostError as lost:
            if tries == 1:
                raise
            record = lost.record
            if record is not None and not _recorded_by(lost, holder, outcome):
                log.info(
                    "job key %s: writing its outcome (%s) again after the ledger failed"
                    " found the record moved on (%s, by %s); the first try's commit may"
                    " have gone through. Its replacement was confirmed: the delivery is acked",
                    key,
                    outcome.value,
                    record.state_label,
                    record.worker or "nobody",
                )

    async def release(self, job: Job, holder: str) -> None:
        """Give ``holder``'s claim back (a job not started, or abandoned) so that its
        redelivery runs at once; tried once: if the store fails, the lease lapses."""
        try:
            await self.in_store(self._store.release, job.idempotency_key, holder)
        except StoreError as error:
            self.ledger.failed(error)
            log.warning("job %s's claim could not be given back; its lease will lapse", job.id)
        else:
            self.ledger.answered()

    def close(self) -> None:
        self._store_thread.shutdown(wait=True)

    async def process(self, message: Delivery, task: str) -> str | None:
        """The whole protocol for a delivery of ``task``'s queue."""
        try:
            job = decode_for_queue(wire_message(message), task, message.routing_key)
            spec = self._app.get(job.task)
            payload = spec.validate(job.payload)
        except DecodeError as error:
            return await self._dead_letter(message, task, DeathCause(error.reason, str(error)))
        except WrongQueueError as error:
            # Not recorded under its key: that would let a publisher of one task mark
            # another task's job with the same key dead without running it.
            cause = DeathCause("wrong-queue", error.explain(task))
            return await self._dead_letter(message, task, cause, record=False)
        except BrokerJobsError as error:  # the payload fails the task's model
            return await self._dead_letter(message, task, DeathCause("schema", str(error)))
        return await self.process_decoded(message, job, spec, payload)

    async def process_decoded(
        self,
        message: Delivery,
        job: Job,
        spec: TaskSpec[Any],
        payload: BaseModel,
    ) -> str | None:
        """The protocol from a decoded, valid job on: hold until due, claim, run."""
        hold = seconds_until_due(job, utc_now())
        if hold > MAX_HOLD:
            # Published for later without going through the ladder (by hand, or by a
            # foreign publisher): send it through the ladder rather than hold it.
            if self.must_not_start(message):
                return None
            try:
                await self._publish_again(message, job, eta=job.due_at)
            except InvalidDelayError as error:  # due beyond what the ladder can hold
                cause = DeathCause("envelope", f"bj-due-at: {error}")
                return await self._dead_letter(message, job.task, cause, record=False)
            return "rerouted"
        await asyncio.sleep(hold)
        return await self.run_when_free(message, job, spec, payload)

    async def run_when_free(
        self,
        message: Delivery,
        job: Job,
        spec: TaskSpec[Any],
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
            async with self._executor.slot(job.priority):
                if self.must_not_start(message):
                    return None
                outcome = await self._claim_and_run(message, job, spec, payload)
            if outcome != BUSY:
                return outcome
            if self.must_not_start(message):
                return None
            if asyncio.get_running_loop().time() >= deadline:
                try:
                    await self._publish_again(message, job, delay=settings.hold_busy_for)
                except LinkStoppedError:
                    return None
                return "busy"
            await asyncio.sleep(settings.recheck_every)

    async def _claim_and_run(
        self,
        message: Delivery,
        job: Job,
        spec: TaskSpec[Any],
        payload: BaseModel,
    ) -> str | None:
        settings, store = self._settings, self._store
        # Each delivery claims under its own holder id: two copies of one job in
        # this worker at once must not both count as "ours".
        holder = self.next_holder()
        judged = await self._at_delivery_limit(message, job, spec)
        if isinstance(judged, Rescue):
            return await self._rescue(message, job, judged)
        death = judged
        claim_it = functools.partial(
            self.recorded, store.claim, job, holder, settings.lease,
            give_up=lambda: self.must_not_start(message),
        )  # fmt: skip
        claim = await claim_it()
        verdict = claim_verdict(job, claim, self.observer)
        if verdict == BUSY and await self._lapse_if_holder_dead(job, claim.record):
            claim = await claim_it()
            verdict = claim_verdict(job, claim, self.observer)
        if verdict != RUN:
            if verdict == BUSY:
                return verdict  # held by the caller
            # Skipped; a success's follow-ups its worker did not confirm go out first.
            sent = await self.follow_ups.after_duplicate(job, spec, claim.record)
            return verdict if sent else None
        if spec.handler is None:
            death = DeathCause("no-handler", "this app has no handler")
        if death is not None:
            return await self._dead_letter(message, job.task, death, job, holder)
        return await self._run(message, job, spec, payload, holder)

    async def _lapse_if_holder_dead(self, job: Job, record: JobRecord) -> bool:
        """End the lease of a claim whose holder is a process known gone
        (:mod:`~broker_jobs.worker.dead_holders`): whether it was ended."""
        holder = record.worker
        if holder is None:
            return False
        now = utc_now()
        if not await self.in_store(self._dead_holders.is_dead, holder, now):
            return False
        await self.recorded(self._store.lapse, job.idempotency_key, holder)
        log.info(
            "job %s (key %s) was held by %s, a process of this host that is gone (no such"
            " pid, no heartbeat): its lease ended now instead of at %s; taking it over",
            job.id,
            job.idempotency_key,
            holder,
            record.lease_until.isoformat() if record.lease_until else "its end",
            extra={"job_id": job.id, "key": job.idempotency_key, "task": job.task},
        )
        return True

    async def _run(
        self,
        message: Delivery,
        job: Job,
        spec: TaskSpec[Any],
        payload: BaseModel,
        holder: str,
    ) -> str | None:
        """Run the claimed job's handler; record the outcome."""
        settings = self._settings
        assert spec.handler is not None  # checked by the caller
        if spec.transactional:
            return await self._run_in_transaction(message, job, spec, payload, holder)
        run = self.observer.run(job)
        call = bound_handler(spec, job, settings.worker_id, self.follow_ups)
        try:
            returned = await self._executor.run(
                call.function,
                payload,
                run,
                RunLimit(spec.time_limit, job, self.overruns),
                renew_lease=functools.partial(self.settling.renew, job, holder, settings.lease),
                renew_every=settings.lease / 3,
                level=job.priority,
            )
        except asyncio.CancelledError:  # the worker stops: left unsettled
            raise
        except BaseException as error:  # the handler's failure, decided by its policy
            failure = handler_failure(error)
            return await self.after_failure(message, job, spec, failure, holder, run=run)
        output = call.output(returned)
        recorded = await self.settling.record_successes([Finished(job, holder, run, output)])
        return await self.after_success(job, output if recorded else None)

    async def after_success(self, job: Job, output: Output | None) -> str | None:
        """A success is recorded: its follow-ups published (confirmed) before the ack;
        None (the delivery left unacked) if the worker stops before they all were."""
        if output is None or not output.follow_ups:
            return "succeeded"
        return "succeeded" if await self.follow_ups.send(job, output.follow_ups) else None

    async def _run_in_transaction(
        self,
        message: Delivery,
        job: Job,
        spec: TaskSpec[Any],
        payload: BaseModel,
        holder: str,
    ) -> str | None:
        """The handler's writes and the success record in one store transaction."""
        worker_id = self._settings.worker_id
        run = self.observer.run(job)
        outputs: list[Output | None] = [None]

        def effects(db: object) -> Output | None:
            with run:  # inside the transaction: a lease lost before it runs nothing
                call = bound_handler(spec, job, worker_id, self.follow_ups)
                outputs[0] = call.output(call.function(payload, db))
            return outputs[0]  # kept with the success, in the same transaction

        store, ledger = self._store, self.ledger
        tried_before = False
        while True:
            try:
                await asyncio.to_thread(store.succeed_with, job.idempotency_key, holder, effects)
            except LeaseLostError as lost:
                if tried_before and _recorded_by(lost, holder, Status.SUCCEEDED):
                    break  # the commit went through before the connection broke
                ledger.answered()
                self.observer.lease_lost(job.task)
                log.warning("job %s: lease taken over before its transaction; not run", job.id)
                return "duplicate"
            except asyncio.CancelledError:
                raise
            except BaseException as raised:  # rolled back
                error = handler_failure(raised)
                if not isinstance(error, StoreError) and not store.is_outage(error):
                    # The handler's failure: decided by the task's policy.
                    return await self.after_failure(message, job, spec, error, holder, run=run)
                # The database's outage, not the job's: no attempt spent; the
                # transaction runs again once the ledger answers.
                ledger.failed(error)
                tried_before = True
                await ledger.pause()
                continue
            break
        ledger.answered()
        self.observer.succeeded(job, run)
        return await self.after_success(job, outputs[0])

    async def after_failure(
        self,
        message: Delivery,
        job: Job,
        spec: TaskSpec[Any],
        error: Exception,
        holder: str,
        *,
        run: Run | None = None,
    ) -> str | None:
        """A run of ``job`` failed with ``error``: publish its next attempt, or
        dead-letter it, as its task's retry policy decides."""
        stuck = isinstance(error, TimeLimitExceeded) and error.stuck
        decision = spec.retry.decide(error, job.attempt)
        outcome: str | None
        if decision.delay is not None:
            delay = decision.delay
            if stuck:
                # This process exits once its other jobs settled (within --grace), the
                # stuck thread with it: the attempt starts once it is gone.
                delay = max(delay, self._settings.shutdown_grace + STUCK_RETRY_FLOOR)
            due = utc_now() + timedelta(seconds=delay)
            # The next attempt is confirmed before this one is recorded and acked.
            try:
                await self._publish_again(message, job.copy(attempt=job.attempt + 1), delay=delay)
            except LinkStoppedError:
                await self._abandon(job, holder)
                return None
            text = f"{type(error).__name__}: {error}"
            # A failure is rare: its payload is kept with it (for the job's page).
            await self.record_outcome(
                Status.RETRYING,
                self._store.retry,
                job.idempotency_key,
                holder,
                text,
                due,
                payload=job.payload,
            )
            self.observer.retrying(job, run, error, due)
            outcome = "retried"
        else:
            reason = "permanent" if decision.permanent else "exhausted"
            cause = DeathCause.from_exception(reason, error, job.attempt)
            outcome = await self._dead_letter(message, job.task, cause, job, holder, run=run)
        if stuck and outcome is not None:
            self.overruns.recorded(job)  # the worker's exit says which were recorded
        return outcome

    async def _dead_letter(
        self,
        message: Delivery,
        task: str,
        cause: DeathCause,
        job: Job | None = None,
        holder: str | None = None,
        *,
        record: bool = True,
        run: Run | None = None,
    ) -> str | None:
        """Publish the delivery to ``task``'s dead-letter queue with ``cause``
        (confirmed), then record the job dead (unless ``record`` is False)."""
        properties = message.properties
        kept = {
            "content_type": properties.content_type,
            "content_encoding": properties.content_encoding,
            "message_id": properties.message_id,
            "type": properties.message_type,
            "timestamp": properties.timestamp,
        }
        dead = dead_letter_message(
            message.body, {"headers": message.headers, **kept}, cause, self._settings.worker_id
        )
        names, timeout = self._app.names, self._settings.confirm_timeout
        try:
            await self._confirmed(
                lambda channel: publish_dead_letter(channel, names, task, dead, timeout)
            )
        except LinkStoppedError:
            await self._abandon(job, holder)
            return None
        # Indexed in the ledger with the record (docs/operations.md, "dead letters"):
        # what the operator's commands read instead of the queue.
        letter = dead_letter_from(
            task, dead.headers or {}, {**kept, "delivery_mode": 2}, message.body
        )
        header_key = message.headers.get(n.HEADER_IDEMPOTENCY_KEY)
        key = header_key if isinstance(header_key, str) and header_key else None
        if not record:
            await self.recorded(self._store.index_dead_letters, [letter])
        elif job is not None:
            await self.record_outcome(
                Status.DEAD,
                self._store.dead,
                job.idempotency_key,
                holder,
                cause.error,
                job=job,
                payload=job.payload,
                letter=letter,
            )
        elif properties.message_id:
            # A poison message never became a job: the ledger still says it is dead,
            # under its message id, never its key: a bad message (anyone's) must not
            # settle the key's job, of this task or another, before it comes.
            await self.recorded(
                self._store.dead,
                properties.message_id,
                None,
                f"{cause.reason}: {cause.error}",
                job_id=properties.message_id,
                task=task,
                letter=letter,
            )
        else:
            await self.recorded(self._store.index_dead_letters, [letter])
        header_attempt = message.headers.get(n.HEADER_ATTEMPT)
        self.observer.dead(
            task,
            cause.reason,
            cause.error,
            job=job,
            job_id=properties.message_id,
            key=key,
            attempt=header_attempt if type(header_attempt) is int else None,
            run=run,
        )
        return f"dead:{cause.reason}"

    async def _publish_follow_up(self, job: Job) -> None:
        """Publish ``job``, a next step a handler asked for, due at its ``due_at``;
        confirmed before the caller acks the delivery that asked for it."""

        async def publish(_: aio_pika.abc.AbstractChannel) -> None:
            await self._publisher.publish(
                job.task,
                job.payload,
                job_id=job.id,
                idempotency_key=job.idempotency_key,
                attempt=job.attempt,
                traceparent=job.traceparent,
                tracestate=job.tracestate,
                eta=job.due_at,
                priority=job.priority,
            )

        await self._confirmed(publish)

    async def _publish_again(
        self,
        message: Delivery,
        job: Job,
        *,
        delay: float | None = None,
        eta: datetime | None = None,
    ) -> None:
        """Publish ``job`` (same id, key and trace; its next attempt for a retry) as
        the message that replaces ``message``, due after ``delay`` seconds or at
        ``eta``: the body and the publisher's own headers as they came
        (:func:`~broker_jobs.envelope.encode_again`); confirmed before the caller
        acks ``message``."""
        again = job.copy(due_at=due_time(utc_now(), delay, eta))
        original = wire_message(message)

        async def publish(_: aio_pika.abc.AbstractChannel) -> None:
            await self._publisher.publish_again(again, original)

        await self._confirmed(publish)

    async def _confirmed(
        self, publish: Callable[[aio_pika.abc.AbstractChannel], Awaitable[object]]
    ) -> None:
        """``publish(channel)`` until the broker confirms it: a publish that meets a
        lost link is made again on the next connection, before the delivery it
        replaces counts as settled. Raises :class:`LinkStoppedError` if the worker
        is asked to stop while the broker is away; the broker's own refusals
        (a nack, an unroutable job, a missing exchange) are raised as they come."""
        while True:
            channel = await self._link.wait_up()
            began = self.publish_outage.now()
            try:
                await publish(channel)
            except Exception as error:
                if self._link.is_up and not isinstance(error, LINK_ERRORS):
                    raise
                self.publish_outage.failed(error, began)
                if self._link.is_up:  # the publisher's own connection: it reconnects
                    await asyncio.sleep(RETRY_PUBLISH_AFTER)
                continue
            self.publish_outage.confirmed()
            return

    async def _abandon(self, job: Job | None, holder: str | None) -> None:
        """The worker stops while the broker is away: what this delivery had to
        publish (a retry, a dead letter) never got out. Its claim is given back, so
        that its redelivery runs the attempt again at once (not after the lease)."""
        if job is not None and holder is not None:
            await self.release(job, holder)

    async def _at_delivery_limit(
        self, message: Delivery, job: Job, spec: TaskSpec[Any]
    ) -> DeathCause | Rescue | None:
        """On the last delivery its quorum queue allows, the ledger decides whether the
        job is a crash loop (dead-lettered here, one run before the broker would, and
        recorded dead) or a job whose workers died while it waited (rescued as a fresh
        message): see :mod:`broker_jobs.worker.delivery_limit`. The broker's limit stays
        the backstop (a crash before the claim, a job that crashes the worker at decode).
        """
        options = spec.queue
        count = message.headers.get(n.HEADER_DELIVERY_COUNT)
        if not at_delivery_limit(options, count):
            return None
        assert isinstance(count, int)  # checked by at_delivery_limit
        give_up = functools.partial(self.must_not_start, message)
        record = await self.recorded(self._store.get, job.idempotency_key, give_up=give_up)
        crashes = 0
        if record is not None and record.status is Status.RUNNING:
            executions = await self.recorded(
                self._store.executions, job.idempotency_key, give_up=give_up
            )
            crashes = sum(e.outcome is ExecutionOutcome.LOST for e in executions)
        judged = judge_last_delivery(
            count=count,
            limit=options.delivery_limit,
            attempt=job.attempt,
            record=record,
            crashes_before=crashes,
            now=utc_now(),
        )
        if isinstance(judged, DeathCause) and record is not None and record.worker:
            said = await asyncio.to_thread(self._holder_heartbeat, record.worker)
            judged = replace(judged, error=f"{judged.error} ({said})")
        return judged

    def _holder_heartbeat(self, holder: str) -> str:
        """What the heartbeats say of the process behind claim ``holder`` (its worker
        id, then ``#`` and a delivery number): dead or alive, for the crash loop's
        dead letter."""
        worker_id = holder.rpartition("#")[0] or holder
        try:
            found = [p for p in self._store.processes(self.app.namespace) if p.id == worker_id]
        except Exception:  # the dead letter goes out without it
            return "its worker's heartbeat could not be read"
        if not found:
            return "its worker kept no heartbeat in this ledger"
        now, beat = utc_now(), found[0]
        ago = f"{(now - beat.seen_at).total_seconds():.0f} s ago"
        state = liveness(beat, now)
        if state is Liveness.LOST:
            return f"its worker on {beat.host} fell silent {ago}: lost (dead, or cut off)"
        if state is Liveness.STOPPED:
            return f"its worker on {beat.host} stopped {ago}"
        return f"its worker on {beat.host} last kept its heartbeat {ago}"

    async def _rescue(self, message: Delivery, job: Job, rescue: Rescue) -> str | None:
        """Publish ``job`` again as a fresh message (confirmed); the caller acks."""
        try:
            await self._publish_again(message, job, delay=rescue.delay)
        except LinkStoppedError:
            return None
        log.info(
            "job %s (key %s, %s attempt %d) delivered %d times, at its queue's delivery"
            " limit: published again as a fresh message%s (%s)",
            job.id,
            job.idempotency_key,
            job.task,
            job.attempt,
            rescue.count + 1,
            f", due in {rescue.delay:.0f} s" if rescue.delay else "",
            rescue.why,
        )
        return "rescued"
