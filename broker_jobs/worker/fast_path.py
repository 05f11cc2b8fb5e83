"""The worker's fast path: the common delivery, processed in batches (docs/internals/execution.md).

Most deliveries are a job due now, for a plain (sync or async) handler, free to claim, that
succeeds. Processed one task per delivery, each cost ~1.4 ms of CPU, mostly in hand-offs
between the event loop and the store and handler threads (measured with
bench/throughput/). Here they flow in batches:

    deliveries -> decode + validate (on the loop, as each arrives)
      -> a loop iteration's arrivals claimed in ONE store call: at once on the loop
         where the store can do it without waiting (Store.try_claim_many), else
         queued for the store's thread
      -> right after the commit (on the loop, or the store's thread) the claimed
         jobs go to the handler threads (each hand-off between threads costs the
         GIL); jobs of async handlers start on the loop
      -> handlers run under their time limit and lease; the loop hears of their
         outcomes with one wake-up per batch
      -> the successes recorded: ONE store call per batch
      -> then those deliveries acked (one ``multiple`` frame where it can); where
         the store records at once and the ack frame can be written at once, both
         in the loop turn that took the outcomes, else by the recorder task

The protocol is the runner's: every ack follows its recorded outcome; a claimed job
waiting for a handler thread has its lease renewed like a running one, and on
shutdown gives its claim back if it has not started. Whatever is not the common
case leaves the fast path for the runner's per-delivery protocol, unchanged: a
delivery that does not decode, a job to hold until due, a transactional
handler, the last delivery a quorum queue allows (crash-loop check), a job busy
elsewhere, and a failure to retry or dead-letter.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from aiormq.abc import DeliveredMessage
from pamqp import commands
from pydantic import BaseModel

from broker_jobs.app import TaskSpec
from broker_jobs.clock import utc_now
from broker_jobs.due import seconds_until_due
from broker_jobs.envelope import Job
from broker_jobs.store.base import Claim, ClaimOutcome, Output, StoreError
from broker_jobs.watched_loop import call_soon_from_thread
from broker_jobs.worker.acks import ChannelAcks
from broker_jobs.worker.calling import bound_handler
from broker_jobs.worker.claims import BUSY, RUN, claim_verdict
from broker_jobs.worker.delivery import Delivery, decode_for_queue, delivered_wire_message
from broker_jobs.worker.delivery_limit import at_delivery_limit
from broker_jobs.worker.execution import RunLimit, handler_failure, run_async_handler
from broker_jobs.worker.ledger_gate import LedgerGaveUp
from broker_jobs.worker.observer import Run
from broker_jobs.worker.overrun import LimitWatch, RunGuard
from broker_jobs.worker.protocol import Runner
from broker_jobs.worker.settling import Finished, Settled
from topology import names as n

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Item:
    """One delivery on the fast path."""

    delivered: DeliveredMessage
    #: The acks of the channel it came from (lost with it).
    acks: ChannelAcks
    task: str
    job: Job
    spec: TaskSpec[Any]
    payload: BaseModel
    holder: str = ""
    #: When its claim was taken or its lease last renewed (``time.monotonic()``), for
    #: the renewal sweep; None: not renewed (not claimed yet, or its lease was lost).
    renewed_at: float | None = None
    renewing: asyncio.Task[None] | None = None
    settled: bool = False
    #: The handler's run (set when it starts): its duration for the outcome's line.
    run: Run | None = None
    #: A limited sync handler's time limit (set when it starts on its thread).
    watch: LimitWatch | None = None
    #: What its success keeps (a result, follow-ups): recorded on its own, not in
    #: the batch (set when its handler returns).
    output: Output | None = None

    @functools.cached_property
    def message(self) -> Delivery:
        """aio-pika's view of the delivery, made only when the runner's per-delivery
        protocol takes the job over (a retry, a duplicate, a job busy elsewhere):
        making one costs ~40 us of the loop, per delivery, before the job starts."""
        return Delivery(self.delivered, self.acks, self.task)

    @property
    def tag(self) -> int:
        return self.delivered.delivery_tag or 0

    def must_not_start(self, runner: Runner) -> bool:
        """Not started yet, and the worker stops or the delivery's channel is lost:
        left unsettled (its claim given back), the broker redelivers it; or its task
        is paused: returned to its queue (:meth:`Runner.not_started`)."""
        return runner.stopping or self.acks.lost or self.task in runner.paused


class FastPath:
    """Batches of deliveries for one runner: claimed as they arrive, run on the handler
    threads, their successes recorded by a recorder task. Start with :meth:`start`;
    feed with :meth:`deliver`."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Decoded deliveries waiting for this loop iteration's claim.
        self._arrived: list[_Item] = []
        #: Acks of duplicates and give-backs after a failed claim.
        self._side_tasks: set[asyncio.Task[None]] = set()
        #: Claimed jobs of async handlers, running (or waiting for a slot) on the loop.
        self._async_jobs: set[asyncio.Task[None]] = set()
        #: What handler threads report (an error, None for success, or _SKIPPED),
        #: taken on the loop: one wake-up for all reports made meanwhile.
        self._reports: deque[tuple[_Item, object]] = deque()
        #: Time limits of handlers started on threads, to arm on the loop: taken with
        #: the reports, after them, so a run that ended meanwhile gets no timer.
        self._to_arm: deque[tuple[LimitWatch, float]] = deque()
        self._take_called = False
        self._finished: list[tuple[_Item, BaseException | None]] = []
        self._done = asyncio.Event()
        #: The recorder task runs (from start() to stop()): successes may be recorded
        #: at once in its stead; once stopped, nothing more is recorded or acked.
        self._recording = False
        #: Deliveries taken from the queue and not yet settled or left.
        self._in_hand = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._working = asyncio.Event()  # the opposite of _idle
        self._tasks: list[asyncio.Task[None]] = []
        #: Claimed jobs not settled yet (running, or waiting for a handler thread).
        self._claimed_jobs: set[_Item] = set()
        #: Sync jobs whose handler did not return within the overrun grace.
        self._stuck_jobs: set[_Item] = set()
        #: Sync jobs handed to the handler threads and not started: whoever removes
        #: one (the thread that starts it, or the loop returning it) owns it.
        self._waiting: set[_Item] = set()
        #: Consumer tags of ended boosts (worker.prefetch_boost): when their
        #: deliveries still waiting for a thread go back to the queue (monotonic).
        self._ended_boosts: dict[str, float] = {}
        self._leftover_wait = 0.0
        #: Deliveries taken, ever (burst mode waits for a first one a while).
        self.received = 0

    @property
    def busy(self) -> bool:
        return self._in_hand > 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._recording = True
        self._tasks = [
            asyncio.create_task(self._record(), name="broker-jobs recorder"),
            asyncio.create_task(self._renew_leases(), name="broker-jobs lease renewals"),
        ]
        for task in self._tasks:
            task.add_done_callback(_report_crash)

    async def stop(self) -> None:
        self._recording = False
        tasks = [*self._tasks, *self._side_tasks, *self._async_jobs]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def deliver(self, delivered: DeliveredMessage, task: str, acks: ChannelAcks) -> None:
        """Take a delivery (the consumer's callback): decoded now, claimed with the
        others of this loop iteration in one store call."""
        runner = self._runner
        self.received += 1
        if runner.stopping or task in runner.paused:  # after its consumer was cancelled
            runner.spawn(Delivery(delivered, acks, task), task, _not_started())
            return
        item = self._fast(delivered, task, acks)
        if item is None:
            return
        self._in_hand += 1
        self._idle.clear()
        self._arrived.append(item)
        if self._in_hand == 1:  # nothing else in hand: no batch to wait for, claim now
            self._working.set()
            self._claim_arrived()
        elif len(self._arrived) == 1:  # busy: this loop turn's arrivals in one claim
            asyncio.get_running_loop().call_soon(self._claim_arrived)

    async def wait_working(self) -> None:
        """Wait until a delivery is in hand."""
        await self._working.wait()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until every claimed job settled; False after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- decode, claim, start ---------------------------------------------------------------

    def _fast(self, delivered: DeliveredMessage, task: str, acks: ChannelAcks) -> _Item | None:
        """The delivery as a fast-path item, or None after handing it to the runner
        (decoded already where it could be: a message is decoded once)."""
        runner = self._runner
        try:
            job = decode_for_queue(delivered_wire_message(delivered), task, delivered.routing_key)
            spec = runner.app.get(job.task)
            payload = spec.validate(job.payload)
        except Exception:  # BrokerJobsError, or anything odd: the runner's path decides
            message = Delivery(delivered, acks, task)
            runner.spawn(message, task, runner.process(message, task))  # dead-letters it
            return None
        handler = spec.handler
        if (
            handler is None
            or spec.transactional
            or seconds_until_due(job, utc_now()) > 0
            or at_delivery_limit(spec.queue, _delivery_count(delivered))
        ):
            message = Delivery(delivered, acks, task)
            runner.spawn(message, task, runner.process_decoded(message, job, spec, payload))
            return None
        return _Item(delivered, acks, task, job, spec, payload)

    def _claim_arrived(self) -> None:
        """Claim this iteration's arrivals in one store call: here, at once, where the
        store can do it without waiting (:meth:`Store.try_claim_many`), else queued
        for the store's thread. The claimed jobs' handlers start right after the
        commit (:meth:`_start`); the loop keeps their leases renewed (:meth:`_claimed`)."""
        arrived, self._arrived = self._arrived, []
        runner = self._runner
        items = []
        for item in arrived:
            if item.must_not_start(runner):  # not claimed: left, or returned if paused
                runner.spawn(item.message, item.task, _not_started())
                self._release(item)
            else:
                items.append(item)
        if not items:
            return
        for item in items:
            item.holder = runner.next_holder()
        store, lease = runner.store, runner.settings.lease
        pairs = [(item.job, item.holder) for item in items]
        try:
            claims = store.try_claim_many(pairs, lease)
        except Exception:  # claim_many meets it again, and the failure is handled there
            claims = None
        if claims is not None:  # claimed at once, here: no hop through the store's thread
            self._start(items, claims)
            self._claimed(items, claims)
            return
        claiming = runner.in_store(
            store.claim_many, pairs, lease, after=functools.partial(self._start, items)
        )
        claiming.add_done_callback(functools.partial(self._claimed_later, items))

    def _claimed_later(self, items: list[_Item], claiming: asyncio.Future[list[Claim]]) -> None:
        error = claiming.exception()
        if error is None:
            self._runner.ledger.answered()
            self._claimed(items, claiming.result())
            return
        if isinstance(error, StoreError):  # our outage: held, claimed once the store answers
            self._runner.ledger.failed(error)
            self._spawn(self._claim_when_the_ledger_answers(items))
            return
        log.error(
            "claiming %d jobs failed; returning them to the queue", len(items), exc_info=error
        )
        self._spawn(self._give_back(items))

    async def _claim_when_the_ledger_answers(self, items: list[_Item]) -> None:
        """Claim ``items`` (unacked, no claim taken) once the store answers; a
        stopping worker leaves them unsettled instead (the broker returns them)."""
        runner = self._runner
        store, lease = runner.store, runner.settings.lease
        pairs = [(item.job, item.holder) for item in items]
        await runner.ledger.pause()
        try:
            claims = await runner.recorded(
                store.claim_many,
                pairs,
                lease,
                after=functools.partial(self._start, items),
                give_up=lambda: runner.stopping,
            )
        except LedgerGaveUp:
            for item in items:
                runner.settling.leave(item.acks, item.tag)
                self._release(item)
            return
        self._claimed(items, claims)

    def _claimed(self, items: list[_Item], claims: list[Claim]) -> None:
        runner = self._runner
        now = time.monotonic()
        for item, claim in zip(items, claims, strict=True):
            verdict = claim_verdict(item.job, claim, runner.observer)
            if verdict == RUN:
                if not item.settled:  # (a quick handler may have finished already)
                    self._claimed_jobs.add(item)
                    item.renewed_at = now
                    if item.spec.is_async:
                        self._spawn(self._run_async(item), self._async_jobs)
            elif verdict == BUSY:  # held and re-checked by the runner
                outcome = runner.run_when_free(item.message, item.job, item.spec, item.payload)
                runner.spawn(item.message, item.task, outcome)
                self._release(item)
            else:  # a duplicate (done already, an older attempt) or cancelled
                self._spawn(self._ack_skipped(item, verdict, claim))

    async def _ack_skipped(self, item: _Item, outcome: str, claim: Claim) -> None:
        runner = self._runner
        try:
            # A success's follow-ups that its worker did not confirm go out first.
            if await runner.follow_ups.after_duplicate(item.job, item.spec, claim.record):
                await runner.settling.ack(item.acks, [Settled(item.tag, item.task, outcome)])
            else:
                runner.settling.leave(item.acks, item.tag)
        finally:
            self._release(item)  # only now: a stopping worker waits for the ack

    def _spawn(
        self, work: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]] | None = None
    ) -> None:
        into = self._side_tasks if tasks is None else tasks
        task = asyncio.create_task(work)
        into.add(task)
        task.add_done_callback(into.discard)

    def _start(self, items: list[_Item], claims: list[Claim]) -> None:
        """Right after the claims committed (on the loop, or on the store's thread):
        each claimed job goes to the handler threads (they bound what runs at once)."""
        starting = [
            item
            for item, claim in zip(items, claims, strict=True)
            if claim.outcome is ClaimOutcome.CLAIMED and not item.spec.is_async
        ]
        calls = [functools.partial(self._run, item) for item in starting]
        self._waiting.update(starting)
        try:
            self._runner.executor.post_all(calls, [item.job.priority for item in starting])
        except RuntimeError:  # the pool is shut down: the worker is exiting
            self._waiting.difference_update(starting)
            for item in starting:
                self._report(item, _SKIPPED)

    def _run(self, item: _Item) -> None:
        """On a handler thread: run the job, unless the worker is stopping or the
        delivery's channel is lost (a job not started gives its claim back and stays
        unacked; the broker returns it), or the loop took it back (:meth:`boost_ended`)."""
        try:
            self._waiting.remove(item)  # atomic: the loop may be taking it back
        except KeyError:
            return  # returned to its queue by the loop
        if item.must_not_start(self._runner):
            self._report(item, _SKIPPED)
            return
        runner = self._runner
        guard = RunGuard()
        limit = RunLimit(item.spec.time_limit, item.job, runner.overruns)
        # Stuck past its limit and the grace: it waits for settle_stuck (the worker
        # is replaced).
        item.watch = watch = limit.watch(guard, functools.partial(self._stuck_jobs.add, item))
        if watch is not None:
            self._to_arm.append((watch, time.monotonic()))
            self._take_soon()
        call = bound_handler(item.spec, item.job, runner.settings.worker_id, runner.follow_ups)
        item.run = run = runner.observer.run(item.job)
        try:
            with run:
                returned = guard.call(call.function, item.payload)
            item.output = call.output(returned)
        except BaseException as error:  # reported; the loop decides (retry, dead letter)
            self._report(item, error)
        else:
            self._report(item, None)

    async def _run_async(self, item: _Item) -> None:
        """On the loop: an async handler, at most ``concurrency`` of them at once (the
        slots the per-delivery path uses too), cancelled at its time limit."""
        runner = self._runner
        async with runner.executor.slot(item.job.priority):
            if item.must_not_start(runner):  # not started: the claim goes back, the delivery too
                self._give_claim_back(item)
                return
            call = bound_handler(item.spec, item.job, runner.settings.worker_id, runner.follow_ups)
            error: BaseException | None = None
            item.run = run = runner.observer.run(item.job)
            try:
                returned = await run_async_handler(
                    call.function, item.payload, run, item.spec.time_limit
                )
                item.output = call.output(returned)
            except asyncio.CancelledError:  # the worker is going: left unsettled
                raise
            except BaseException as raised:  # reported; the loop decides (retry, dead letter)
                error = raised
            self._settle(item, error)

    def _report(self, item: _Item, outcome: object) -> None:
        """From any thread: the job's outcome, for the loop."""
        self._reports.append((item, outcome))
        self._take_soon()

    def _take_soon(self) -> None:
        """From any thread: have the loop take the reports and time limits, with one
        call for all those made until it does (a call per job cost a wake-up each)."""
        if not self._take_called:
            self._take_called = True
            self._call_soon(self._take_reports)

    def _call_soon(self, callback: Callable[..., object], *args: object) -> None:
        assert self._loop is not None  # set by start()
        call_soon_from_thread(self._loop, callback, *args)

    def _take_reports(self) -> None:
        self._take_called = False  # before taking: a report made now calls again
        reports = self._reports
        while reports:
            item, outcome = reports.popleft()
            if outcome is _SKIPPED:
                self._give_claim_back(item)
            else:
                assert outcome is None or isinstance(outcome, BaseException)
                self._end(item, outcome)  # recorded below, at once or by the recorder
        to_arm = self._to_arm
        while to_arm:
            watch, started = to_arm.popleft()
            watch.arm(started)  # a run settled above is ended: no timer
        if self._finished and not self._succeed_at_once():
            self._done.set()

    def settle_stuck(self) -> None:
        """The worker replaces itself: each stuck job's attempt failed by its time
        limit (retried or dead-lettered, recorded, acked); their threads die with
        the process."""
        for item in list(self._stuck_jobs):
            assert item.watch is not None  # only a limited run gets stuck
            self._settle(item, item.watch.stuck_error())

    @property
    def in_hand(self) -> int:
        """Deliveries taken from the queue and not yet settled or left."""
        return self._in_hand

    async def _renew_leases(self) -> None:
        """Every sixth of the lease, renew the lease of each claimed job (running, or
        waiting for a thread) last renewed a third of the lease ago or more: renewed
        between a third and half of the lease after the last time, one sweep for all
        (a timer per job cost ~7 % of the loop's time at 4,000 jobs/s). The same sweep
        returns what ended boosts left waiting (:meth:`boost_ended`)."""
        lease = self._runner.settings.lease
        while True:
            await asyncio.sleep(lease / 6)
            now = time.monotonic()
            due = now - lease / 3
            for item in list(self._claimed_jobs):
                renewed = item.renewed_at
                if renewed is not None and renewed <= due and item.renewing is None:
                    item.renewing = asyncio.create_task(self._renew(item))
            if self._ended_boosts:
                self._return_leftovers(now)

    def boost_ended(self, tags: Iterable[str], after: float) -> None:
        """The second consumers ``tags`` were cancelled (worker.prefetch_boost): their
        deliveries still waiting for a handler thread ``after`` seconds from now go
        back to the queue. They were taken while jobs ran short; if jobs turned long,
        the deep buffer would keep them waiting toward the broker's consumer_timeout,
        and the remaining consumer's own buffer is the bound the worker keeps."""
        self._leftover_wait = after
        self._ended_boosts.update(dict.fromkeys(tags, time.monotonic() + after))

    def _return_leftovers(self, now: float) -> None:
        if self._runner.ledger.is_down:
            # Our outage, not the jobs': nothing goes back for it, and the wait
            # starts again once the ledger answers.
            self._ended_boosts = dict.fromkeys(self._ended_boosts, now + self._leftover_wait)
            return
        ended = {tag for tag, at in self._ended_boosts.items() if at <= now}
        if not ended:
            return
        for tag in ended:
            del self._ended_boosts[tag]
        runner = self._runner
        # (Stopping, paused, a lost channel: its thread settles it.)
        returned = self._return_waiting_where(
            lambda item: not item.must_not_start(runner) and _consumer_tag(item.delivered) in ended
        )
        if returned:
            log.info(
                "%d deliveries taken while jobs ran short still wait for a handler thread:"
                " returned to their queues (docs/worker.md, Prefetch)", returned,
            )  # fmt: skip

    def return_waiting(self) -> int:
        """The worker stops: every job still waiting for a handler thread gives its
        claim back and its delivery goes back to the queue now, for another worker,
        instead of when a thread frees up (never, while handlers are stuck: they
        waited for this process to go and for their leases to lapse). How many."""
        return self._return_waiting_where(lambda _item: True)

    def _return_waiting_where(self, chosen: Callable[[_Item], bool]) -> int:
        """The ``chosen`` jobs still waiting for a handler thread, returned
        (:meth:`_return_late`); how many."""
        returned = 0
        for item in list(self._waiting):
            if not chosen(item):
                continue
            try:
                self._waiting.remove(item)  # atomic: a thread may be starting it
            except KeyError:
                continue  # started (or starting): it runs, or sees the stop
            self._return_late(item)
            returned += 1
        return returned

    def _return_late(self, item: _Item) -> None:
        """A job left waiting by an ended boost: its claim given back, then its
        delivery returned to the queue (another worker, or this one's remaining
        consumer, takes it in turn)."""
        self._unclaim(item)
        runner = self._runner

        async def back() -> None:
            try:
                await runner.release(item.job, item.holder)
                await runner.settling.give_back(item.acks, item.tag, item.task)
            finally:
                self._release(item)

        self._spawn(back())

    async def _renew(self, item: _Item) -> None:
        runner = self._runner
        try:
            kept = await runner.settling.renew(item.job, item.holder, runner.settings.lease)
        finally:
            item.renewing = None
        item.renewed_at = time.monotonic() if kept else None  # lost: not renewed again

    def _settle(self, item: _Item, error: BaseException | None) -> None:
        """:meth:`_end` the run, and wake the recorder task to record it."""
        if self._end(item, error):
            self._done.set()

    def _end(self, item: _Item, error: BaseException | None) -> bool:
        """The run ended with ``error`` (None: it returned): queued in ``_finished``
        to be recorded; False if it was settled before (as stuck: this is its thread
        finishing late)."""
        if item.settled:
            return False
        item.settled = True
        if item.watch is not None:
            error = item.watch.outcome(error)
            self._stuck_jobs.discard(item)
        self._claimed_jobs.discard(item)
        if item.renewing is not None:
            item.renewing.cancel()
        self._finished.append((item, error))
        return True

    def _give_claim_back(self, item: _Item) -> None:
        """A job not started: its claim given back, its delivery left unsettled (the
        broker returns it when its channel goes)."""
        self._unclaim(item)
        runner = self._runner

        async def release() -> str | None:
            try:
                await runner.release(item.job, item.holder)
            finally:
                self._release(item)
            return None  # left unsettled: the broker gives it back

        runner.spawn(item.message, item.task, release())

    def _unclaim(self, item: _Item) -> None:
        """``item`` will not run here: settled for this path, out of the claimed jobs
        (the lease sweep's), its renewal in flight stopped; its claim is released next."""
        item.settled = True
        self._claimed_jobs.discard(item)
        if item.renewing is not None:
            item.renewing.cancel()

    # -- the recorder: successes in one store call, then acks ---------------------------

    async def _record(self) -> None:
        while True:
            await self._done.wait()
            self._done.clear()
            while self._finished:
                finished, self._finished = self._finished, []
                succeeded = []
                for item, error in finished:
                    if error is not None:
                        self._fail(item, error)
                    elif item.output is not None and item.output.follow_ups:
                        # Published before the ack: on its own, off the batch.
                        self._spawn(self._succeed_with_follow_ups(item))
                    else:
                        succeeded.append(item)
                if succeeded:
                    await self._succeed(succeeded)

    def _succeed_at_once(self) -> bool:
        """The finished jobs, all successes, recorded and acked in this loop turn
        where neither needs waiting (a store that records at once, an ack written at
        once), not a turn later by the recorder: a worker given jobs one at a time
        saves a loop turn per job. False where anything would wait or is not a plain
        success (a failure, an output to keep): nothing done, the recorder's work."""
        finished = self._finished
        if not self._recording or any(
            error is not None or item.output is not None for item, error in finished
        ):
            return False
        items = [item for item, _ in finished]
        try:
            recorded = self._runner.settling.record_at_once(_successes(items))
        except Exception:  # the recorder meets it again, and returns the deliveries
            return False
        if recorded is None:
            return False
        self._finished = []
        for acks, group in _by_channel(items):
            settled = _settled(group)
            if self._runner.settling.ack_at_once(acks, settled):
                for item in group:
                    self._release(item)
            else:  # a frame is being sent: this one waits its turn
                self._spawn(self._ack(acks, group))
        return True

    async def _succeed(self, items: list[_Item]) -> None:
        try:
            await self._runner.settling.record_successes(_successes(items))
        except Exception:
            log.exception("recording %d successes failed; returning them", len(items))
            await self._give_back(items)
            return
        for acks, group in _by_channel(items):
            await self._ack(acks, group)

    async def _ack(self, acks: ChannelAcks, items: list[_Item]) -> None:
        """Ack recorded successes of one channel; only then are they settled (a
        stopping worker waits for the acks)."""
        await self._runner.settling.ack(acks, _settled(items))
        for item in items:
            self._release(item)

    async def _succeed_with_follow_ups(self, item: _Item) -> None:
        """A success with follow-ups: recorded with them, its follow-ups published
        (confirmed), then acked (docs/worker.md, Next steps)."""
        runner = self._runner
        finished = Finished(item.job, item.holder, item.run, item.output)
        try:
            recorded = await runner.settling.record_successes([finished])
        except Exception:
            log.exception("recording job %s's success failed; returning it", item.job.id)
            await self._give_back([item])
            return
        try:
            outcome = await runner.after_success(item.job, item.output if recorded else None)
            if outcome is None:  # stopping before its follow-ups were confirmed
                runner.settling.leave(item.acks, item.tag)
            else:
                await runner.settling.ack(item.acks, [Settled(item.tag, item.task, outcome)])
        finally:
            self._release(item)

    def _fail(self, item: _Item, error: BaseException) -> None:
        """The handler's failure goes to the runner's retry policy (per delivery)."""
        runner = self._runner
        error = handler_failure(error)

        async def after_failure() -> str | None:
            try:
                return await runner.after_failure(
                    item.message, item.job, item.spec, error, item.holder, run=item.run
                )
            finally:
                self._release(item)

        runner.spawn(item.message, item.task, after_failure())

    async def _give_back(self, items: list[_Item]) -> None:
        """The store failed: the deliveries go back to the queue; their redeliveries
        meet the store's records again."""
        for item in items:
            await self._runner.settling.give_back(item.acks, item.tag, item.task)
            self._release(item)

    def _release(self, item: _Item) -> None:
        self._in_hand -= 1
        if self._in_hand == 0:
            self._idle.set()
            self._working.clear()


def _successes(items: list[_Item]) -> list[Finished]:
    return [Finished(item.job, item.holder, item.run, item.output) for item in items]


def _settled(items: list[_Item]) -> list[Settled]:
    return [Settled(item.tag, item.task, "succeeded") for item in items]


def _by_channel(items: list[_Item]) -> list[tuple[ChannelAcks, list[_Item]]]:
    """``items`` grouped by the channel they came from: usually one; after a
    reconnect, jobs of the lost one finish too."""
    return [(acks, list(group)) for acks, group in groupby(items, key=lambda item: item.acks)]


def _consumer_tag(delivered: DeliveredMessage) -> str | None:
    delivery = delivered.delivery
    return delivery.consumer_tag if isinstance(delivery, commands.Basic.Deliver) else None


async def _not_started() -> str | None:
    """The outcome of a delivery whose job does not start: none (the runner leaves it
    unsettled, or returns it to its queue if its task is paused)."""
    return None


#: What a skipped job's thread returns instead of running the handler.
_SKIPPED = object()


def _report_crash(task: asyncio.Task[None]) -> None:
    """A recorder that ended other than by cancellation is a bug: say
    so loudly (deliveries in hand stay unacked and return when the worker stops)."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("the worker's %s stopped", task.get_name(), exc_info=task.exception())


def _delivery_count(delivered: DeliveredMessage) -> object:
    return (delivered.header.properties.headers or {}).get(n.HEADER_DELIVERY_COUNT)
