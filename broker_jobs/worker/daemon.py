"""The worker daemon: consumes task queues and runs each delivery through the
execution protocol (:mod:`broker_jobs.worker.protocol`, the common case through the
fast path, :mod:`broker_jobs.worker.fast_path`), over as many connections as it
takes (:mod:`broker_jobs.worker.link`).

When a connection or its channel is lost, the deliveries in hand stay unsettled
(their tags died with the channel; the broker redelivers them): handlers already
running finish and record their outcomes in the store, whose records answer the
redelivered copies; claimed jobs not started give their claims back. Then the worker
connects again and consumes again.

Shutdown order matters: first the consumers are cancelled (no new deliveries),
then running jobs get ``grace`` seconds to finish and settle, then the connection
closes, which returns whatever was delivered but not started to the queue.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence

import aio_pika.abc

from broker_jobs.amqp.connecting import CONNECT_ERRORS
from broker_jobs.amqp.declaring import declare_at_start, existing_queues
from broker_jobs.app import App
from broker_jobs.clock import utc_now
from broker_jobs.errors import (
    BrokerConnectionError,
    ConfigurationError,
    ConsumerCancelledError,
    HandlerStuckError,
    ReconnectTimeoutError,
)
from broker_jobs.observe.heartbeat import Heartbeat, Pulse, process_record
from broker_jobs.observe.worker_metrics import WorkerMetrics
from broker_jobs.plural import plural
from broker_jobs.publish.async_publisher import AsyncPublisher
from broker_jobs.store.base import Store, StoreError
from broker_jobs.store.processes import ProcessKind, ProcessState
from broker_jobs.urls import BrokerURL, BrokerURLs
from broker_jobs.worker.controls import ControlWatch
from broker_jobs.worker.execution import Executor
from broker_jobs.worker.fast_path import FastPath
from broker_jobs.worker.frame_reading import tolerate_unreadable_headers
from broker_jobs.worker.ledger_gate import LedgerGate
from broker_jobs.worker.link import BrokerLink, ExpectedDisconnects
from broker_jobs.worker.observer import JobObserver
from broker_jobs.worker.prefetch_boost import PrefetchBoost
from broker_jobs.worker.protocol import Runner
from broker_jobs.worker.rerouting import Rerouting
from broker_jobs.worker.session import Cancelled, Lost, Session, SessionEnded, describe_loss
from broker_jobs.worker.settings import ProtocolSettings, WorkerSettings
from broker_jobs.worker.stop_signals import Asked, StopSignals
from topology.delay import MAX_HOLD
from topology.priority import AGING_SHARE, PriorityPolicy

log = logging.getLogger(__name__)

#: What opening a session raises when the broker goes away meanwhile: connect again.
LINK_DOWN: tuple[type[BaseException], ...] = (*CONNECT_ERRORS, BrokerConnectionError)
#: Seconds between checks of the queues' depth in burst mode.
BURST_POLL = 0.1
#: Seconds a burst worker that has received nothing yet keeps waiting for a first
#: delivery although its queues read empty: a message the broker has handed to the
#: new consumer is no longer counted as ready, but may not have arrived yet (a
#: quorum queue commits the consumer's checkout to its log first: on RabbitMQ 4.0,
#: under load, a burst worker saw its queue empty and exited 0 with the job in transit).
BURST_FIRST_DELIVERY = 1.5
#: Seconds between prunings of the ledger, and after one that failed (an outage at
#: the worker's start is usually over within minutes: not an hour without pruning).
PRUNE_EVERY, PRUNE_RETRY = 3600.0, 300.0
#: Seconds between looks at whether the other jobs settled, before a replacement.
REPLACE_POLL = 0.05
#: Seconds a stopping worker waits for its cancelled chores to end: a look at
#: ``<ns>.unroutable`` may be closing its channel; a broker that stopped answering
#: must not hold the stop.
CHORES_WAIT = 2.0


class Drained(SessionEnded):
    """Burst mode: nothing runs and the queues are empty."""


class Stopped(SessionEnded):
    """The worker was asked to stop."""


class Replacing(SessionEnded):
    """A handler thread is stuck past its time limit: the process is to be replaced."""


class Worker:
    """Runs the handlers of some of an app's tasks until stopped (or drained, in
    burst mode). ``await worker.run()`` returns the outcome counts.

    ``url`` may name several nodes of one broker (a list, or a comma-separated
    string): the worker connects to the first that answers and, when it loses
    that one, to the others.

    ``metrics``: where to count jobs and the broker link (docs/metrics.md); the
    caller serves its registry (``broker-jobs worker --metrics-port``). Without it
    the worker only logs."""

    def __init__(
        self,
        url: str | BrokerURL | BrokerURLs | Sequence[str],
        app: App,
        store: Store,
        settings: WorkerSettings,
        *,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._urls = BrokerURLs.parse(url)
        self._app = app
        self._store = store
        self._settings = settings
        self._tasks = runnable_tasks(self._app, self._settings.tasks)
        check_transactions(app, self._tasks, store)
        self._check_time_limits()
        self._priorities = priority_policy(app, self._tasks)
        self._worker_id = settings.worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )
        self._metrics = metrics
        self._stopping = asyncio.Event()
        #: Consuming every task queue on the live connection (readiness).
        self._consuming = False
        self._runner: Runner | None = None
        self._fast_path: FastPath | None = None
        self._link: BrokerLink | None = None
        #: Sends on the delayed jobs a restarting broker misrouted, at each connection.
        self._rerouting = Rerouting(app.names, self._worker_id)

    @property
    def worker_id(self) -> str:
        return self._worker_id

    def stop(self) -> None:
        """Ask for a graceful stop (safe to call from a signal handler): no job
        starts from now on; running ones finish within the grace period."""
        self._stopping.set()
        if self._runner is not None:
            self._runner.stopping = True

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop gracefully; a second one exits at once, but a SIGTERM
        delivered twice is one request (:mod:`~broker_jobs.worker.stop_signals`)."""
        loop = asyncio.get_running_loop()
        signals = StopSignals()

        def on_signal(signum: signal.Signals) -> None:
            asked = signals.take(signum, time.monotonic())
            if asked is Asked.STOP:
                log.info("stopping: finishing running jobs (up to %g s)", self._settings.grace)
                self.stop()
            elif asked is Asked.AGAIN:
                log.info("%s again at once (a process group's kill?): still stopping", signum.name)
            else:
                log.warning("second signal: exiting now; unacked jobs will be redelivered")
                os._exit(1)

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)

    @property
    def outcomes(self) -> Counter[str]:
        """What the worker did so far, by outcome (``link-lost`` counts outages)."""
        return Counter(self._runner.outcomes.counts) if self._runner is not None else Counter()

    @property
    def connected_to(self) -> BrokerURL | None:
        """The node the worker consumes from; None while it has no broker."""
        link = self._link
        return link.url if link is not None and link.is_up else None

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: connected and consuming every task queue, or what it waits
        for. Only reads flags: asked on the metrics server's thread."""
        url = self.connected_to
        runner = self._runner
        if runner is not None:
            held = runner.held()
            if held is not None:
                return False, held
        if self._stopping.is_set():
            return False, "stopping"
        if url is None or not self._consuming:
            return False, f"not consuming: waiting for the broker ({self._urls.first})"
        return True, f"consuming {', '.join(self._tasks)} on {url}"

    @property
    def busy(self) -> bool:
        """Whether any delivery is in hand (burst mode waits for this to end)."""
        runner, fast_path = self._runner, self._fast_path
        return (runner is not None and runner.busy) or (fast_path is not None and fast_path.busy)

    def _received_any(self) -> bool:
        return self._fast_path is not None and self._fast_path.received > 0

    async def run(self) -> Counter[str]:
        """Consume until stopped (or drained); raises
        :class:`~broker_jobs.errors.ReconnectTimeoutError` after ``reconnect_timeout``
        seconds without a broker, :class:`~broker_jobs.errors.ConsumerCancelledError`
        when the broker cancels a consumer (after the running jobs settled)."""
        tolerate_unreadable_headers()
        with ExpectedDisconnects().installed():
            return await self._run()

    async def _run(self) -> Counter[str]:
        settings = self._settings
        name = f"broker-jobs worker {self._worker_id}"
        metrics = self._metrics
        link = self._link = BrokerLink(
            self._urls,
            name=name,
            settings=settings,
            stopping=self._stopping,
            metrics=metrics.link if metrics is not None else None,
        )
        publisher = AsyncPublisher(
            self._urls, self._app, declare=False, connection_name=f"{name} (retries)"
        )
        executor = Executor(
            settings.concurrency,
            self._priorities,
            max_wait=settings.consumer_timeout * AGING_SHARE,
        )
        runner = self._runner = self._new_runner(executor, publisher, link)
        runner.stopping = self._stopping.is_set()
        fast_path = self._fast_path = FastPath(runner)
        fast_path.start()
        # The hourly prune, the success lines' summary: until the worker ends.
        chores = [
            asyncio.create_task(self._prune_forever(runner.ledger)),
            asyncio.create_task(runner.observer.summarise()),
            asyncio.create_task(runner.stalls.watch()),
            asyncio.create_task(self._rerouting.look_forever()),
        ]
        controls = ControlWatch(
            self._store,
            self._app.namespace,
            task_queues(self._app, self._tasks),
            runner,
            worker_id=self._worker_id,
            every=settings.heartbeat_every,
            on_stop=lambda _: self.stop(),
        )
        if settings.prefetch is None:  # the default prefetch follows the pace
            chores.append(asyncio.create_task(self._boost(runner, fast_path, controls).run()))
        await controls.read()  # a new worker starts paused, or stops
        following = asyncio.create_task(controls.run())
        heartbeat = self._heartbeat(runner, fast_path)
        beating = asyncio.create_task(heartbeat.run())
        session: Session | None = None
        try:
            try:
                ended = await self._consume_until_ended(link, runner, fast_path, controls)
            except ReconnectTimeoutError:  # handlers still running get their grace
                runner.stopping = True
                await self._finish(runner, fast_path, settings.grace)
                raise
            session, why = ended if ended is not None else (None, Stopped())
            await self._wind_down(session, why, runner, fast_path)
            return runner.outcomes.counts
        finally:
            failure = sys.exception()  # the error it exits with, for its last heartbeat
            for chore in chores:
                chore.cancel()
            # A cancelled chore may still be cleaning up (a look closing its channel: a
            # round trip): let it, briefly, so that none is left pending as the loop ends.
            await asyncio.wait(chores, timeout=CHORES_WAIT)
            await self._rerouting.close()
            following.cancel()
            await controls.stopped()
            beating.cancel()
            await heartbeat.stopped(ended=failure)
            runner.observer.flush_summary()  # the last second's successes
            runner.ledger.close()  # the end of an outage it answered since
            runner.close()
            executor.shutdown()
            await publisher.close()
            if session is not None:
                await session.close()

    async def _wind_down(
        self, session: Session | None, why: SessionEnded, runner: Runner, fast_path: FastPath
    ) -> None:
        """Consuming ended for ``why``: no new deliveries, the jobs in hand finished
        (or returned, for a replacement) within the grace; raises the error the worker
        exits with, if it has one."""
        if session is not None:
            await session.cancel_consumers()
        runner.stopping = True
        grace = self._settings.grace
        if isinstance(why, Replacing):
            await self._replace(runner, fast_path, grace)
        await self._finish(runner, fast_path, grace)
        if isinstance(why, Cancelled):
            raise ConsumerCancelledError(why.queue)
        if isinstance(why, Replacing):
            overruns = runner.overruns
            raise HandlerStuckError(overruns.ever_stuck, overruns.unrecorded)

    def _new_runner(
        self, executor: Executor, publisher: AsyncPublisher, link: BrokerLink
    ) -> Runner:
        """The per-delivery protocol of this worker's jobs, and their observer."""
        settings = self._settings
        return Runner(
            self._app,
            self._store,
            executor=executor,
            publisher=publisher,
            link=link,
            settings=ProtocolSettings(
                self._worker_id,
                lease=settings.lease,
                overrun_grace=settings.overrun_grace,
                shutdown_grace=settings.grace,
            ),
            observer=JobObserver(
                self._app.namespace,
                self._worker_id,
                self._metrics,
                self._tasks,
                each_success=settings.success_lines == "each",
            ),
        )

    def _boost(self, runner: Runner, fast_path: FastPath, controls: ControlWatch) -> PrefetchBoost:
        """Each queue consumed a second time, deeper, while jobs run short
        (worker.prefetch_boost)."""
        counts = runner.outcomes.counts
        return PrefetchBoost(
            self._settings.prefetch_count,
            session=lambda: controls.session,
            completed=lambda: sum(counts.values()),
            working=fast_path.wait_working,
            is_working=lambda: fast_path.busy,
            on_unboost=fast_path.boost_ended,
        )

    def _heartbeat(self, runner: Runner, fast_path: FastPath) -> Heartbeat:
        """This process's heartbeat in the ledger: what it runs, its jobs in hand."""
        settings = self._settings
        record = process_record(
            ProcessKind.WORKER,
            self._worker_id,
            self._app.namespace,
            tasks=self._tasks,
            concurrency=settings.concurrency,
            processes=settings.processes,
            every=settings.heartbeat_every,
        )

        def pulse() -> Pulse:
            stopping = self._stopping.is_set() or runner.stopping
            return Pulse(
                state=ProcessState.STOPPING if stopping else ProcessState.RUNNING,
                in_flight=fast_path.in_hand + runner.in_hand,
                running=runner.observer.running_jobs(),
                paused=tuple(sorted(runner.paused)),
                held=runner.held(),
            )

        # A ledger outage the gate says already is not said again by the heartbeat.
        return Heartbeat(self._store, record, pulse=pulse, quiet=lambda: runner.ledger.in_outage)

    async def _consume_until_ended(
        self, link: BrokerLink, runner: Runner, fast_path: FastPath, controls: ControlWatch
    ) -> tuple[Session, SessionEnded] | None:
        """Connect, consume, and on a loss connect again; the last session and why it
        ended (stopped, drained, a consumer cancelled), or None if the worker was
        stopped while it had no broker."""
        declared = not self._settings.declare
        while True:
            connection = await link.connect()
            if connection is None:
                return None
            session = Session(connection)
            try:
                if not declared:
                    await declare_at_start(
                        link.url, self._app.topology(), f"broker-jobs worker {self._worker_id}"
                    )
                    declared = True
                queues = controls.consumed()
                await session.open(queues, self._settings.prefetch_count, fast_path.deliver)
                await controls.attach(session, queues)
            except LINK_DOWN as error:
                link.could_not_consume(describe_loss(error))
                await session.close()
                continue
            except BaseException:  # the topology is missing or in conflict: stop
                await session.close()
                raise
            assert session.channel is not None  # opened
            link.established(session.channel)
            log.info(
                "worker %s consuming %s on %s", self._worker_id, ", ".join(self._tasks), link.url
            )
            self._rerouting.connected(connection, link.urls.starting_at(link.url))
            self._consuming = True
            try:
                why = await self._until_ended(session, connection)
            finally:
                self._consuming = False
            await controls.attach(None, {})
            if not isinstance(why, Lost):
                return session, why
            assert session.acks is not None  # opened
            in_hand = session.acks.lose()
            link.lost(f"{why}; {in_hand} deliveries in hand will be redelivered")
            runner.outcomes.add("link-lost")
            await session.close()

    async def _until_ended(
        self, session: Session, connection: aio_pika.abc.AbstractConnection
    ) -> SessionEnded:
        """Why the session ended: lost, a consumer cancelled, stopped, or drained."""
        watchers = [
            asyncio.create_task(session.ended()),
            asyncio.create_task(self._stop_asked()),
            asyncio.create_task(self._stuck_seen()),
        ]
        if self._settings.burst:
            watchers.append(asyncio.create_task(self._until_drained(connection)))
        try:
            done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
            ended = done.pop()
            error = ended.exception()
            if error is not None:  # the burst probe met the loss first
                return Lost(describe_loss(error))
            return ended.result()
        finally:
            for watcher in watchers:
                watcher.cancel()

    async def _stop_asked(self) -> SessionEnded:
        await self._stopping.wait()
        return Stopped()

    async def _stuck_seen(self) -> SessionEnded:
        assert self._runner is not None  # made before consuming
        await self._runner.overruns.seen_stuck.wait()
        return Replacing()

    async def _replace(self, runner: Runner, fast_path: FastPath, grace: float) -> None:
        """A handler is stuck: consuming stopped, the other running jobs get ``grace``
        seconds to settle; then the stuck jobs' attempts are settled as failed by
        their time limit (their next attempt published, or dead-lettered; recorded;
        acked) and the worker exits, the stuck threads with it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        overruns = runner.overruns
        if returned := fast_path.return_waiting():  # behind the stuck threads: never run here
            log.info(
                "%s waiting for a handler thread returned to the broker", plural(returned, "job")
            )
        while fast_path.in_hand + runner.in_hand > len(overruns.stuck) and loop.time() < deadline:
            await asyncio.sleep(REPLACE_POLL)
        overruns.settle_stuck.set()
        fast_path.settle_stuck()

    async def _finish(self, runner: Runner, fast_path: FastPath, grace: float) -> None:
        """After ``stopping`` was set: let running jobs settle within ``grace`` seconds;
        deliveries not started stay unsettled (the broker gives them back)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        if returned := fast_path.return_waiting():
            log.info("%s not started yet returned to the broker", plural(returned, "job"))
        abandoned = 0 if await fast_path.wait_idle(grace) else fast_path.in_hand
        await fast_path.stop()
        abandoned += await runner.finish(max(0.0, deadline - loop.time()))
        if abandoned:
            # Counted among the outcomes: the summary must not say "no jobs".
            runner.outcomes.add("abandoned", abandoned)
            why = (
                "not settled within the grace period (%g s), the ledger not answering"
                " (their outcomes could not be recorded),"
                if runner.ledger.is_down
                else "still running after the grace period (%g s)"
            )
            log.warning(
                f"%s {why} %s abandoned: the broker gives the deliveries back,"
                " and each runs again once its lease (%g s) lapses (a longer --grace"
                " lets them finish)",
                plural(abandoned, "job"), grace, "was" if abandoned == 1 else "were",
                self._settings.lease,
            )  # fmt: skip

    async def _until_drained(self, connection: aio_pika.abc.AbstractConnection) -> SessionEnded:
        """Burst mode: return once nothing runs and the task queues and the delay
        ladder (where retries wait) are empty, twice in a row (a paused task's queue
        is not waited for: its jobs wait for its resume).

        Which queues exist is found once, on a blocking connection of its own (a
        passive declare of a missing queue, say a ladder never declared, closes its
        channel: reopening aio-pika channels at that pace made the broker see one
        opened twice); depths are then read on one channel."""
        task_of = task_queues(self._app, self._tasks)
        queues = list(task_of)

        def paused() -> frozenset[str]:
            return self._runner.paused if self._runner is not None else frozenset()

        queues += [queue.name for queue in self._app.topology().queues if ".delay." in queue.name]
        queues = await asyncio.to_thread(
            existing_queues,
            self._urls,
            queues,
            connection_name=f"broker-jobs worker {self._worker_id} (burst)",
        )
        probe = await connection.channel()
        loop = asyncio.get_running_loop()
        waiting_since = loop.time()
        quiet = 0
        while quiet < 2 or (
            not self._received_any() and loop.time() - waiting_since < BURST_FIRST_DELIVERY
        ):
            await asyncio.sleep(BURST_POLL)
            depth = 0
            for name in queues:
                if task_of.get(name) in paused():  # a paused task's jobs wait for its resume
                    continue
                declared = await probe.declare_queue(name, passive=True)
                depth += declared.declaration_result.message_count or 0
            quiet = quiet + 1 if depth == 0 and not self.busy else 0
        await probe.close()
        return Drained()

    async def _prune_forever(self, ledger: LedgerGate) -> None:
        """Keep the ledger bounded: finished records older than the retention go.
        The retention must cover redeliveries and beat's catch-up window. A failure
        during an outage the ``ledger`` gate says already is not said again."""
        while True:
            cutoff = utc_now() - self._settings.retention
            try:
                pruned = await asyncio.to_thread(self._store.prune, cutoff)
            except StoreError as error:  # one line: the store's error says what and why
                level = logging.DEBUG if ledger.in_outage else logging.WARNING
                log.log(
                    level,
                    "pruning the ledger failed (%s); trying again in %g s",
                    error,
                    PRUNE_RETRY,
                )
                await asyncio.sleep(PRUNE_RETRY)
                continue
            if pruned:
                log.info("pruned %d finished records older than %s", pruned, cutoff)
            await asyncio.sleep(PRUNE_EVERY)

    def _check_time_limits(self) -> None:
        """Refuse a time limit the broker's consumer_timeout would cut short; warn
        about tasks without one."""
        timeout = self._settings.consumer_timeout
        for task in self._tasks:
            spec = self._app.get(task)
            limit = spec.time_limit
            if limit is None:
                if spec.transactional:  # they may not have one: nothing to warn of
                    continue
                log.warning(
                    "task %s has no time limit: a run longer than the broker's"
                    " consumer_timeout (%g s) loses its channel and is redelivered",
                    task,
                    timeout,
                )
            elif limit + MAX_HOLD >= timeout:
                raise ConfigurationError(
                    f"task {task!r} may run {limit:g} s, but the broker's consumer_timeout"
                    f" is {timeout:g} s: RabbitMQ would close the channel mid-run and"
                    " redeliver the job. Lower the task's time_limit, or raise"
                    " consumer_timeout in rabbitmq.conf and tell the worker"
                    " (--consumer-timeout)"
                )


def runnable_tasks(app: App, tasks: tuple[str, ...] | None) -> tuple[str, ...]:
    """The tasks a worker of ``app`` runs: ``tasks`` (each with a handler), else every
    task with one; a :class:`ConfigurationError` saying what to fix otherwise."""
    if tasks is None:
        runnable = tuple(spec.name for spec in app if spec.handler is not None)
        if not runnable:
            raise ConfigurationError("this app declares no task with a handler")
        return runnable
    for task in tasks:
        if app.get(task).handler is None:
            raise ConfigurationError(
                f"task {task!r} has no handler in this app: declare it with @app.task"
            )
    return tasks


def check_transactions(app: App, tasks: tuple[str, ...], store: Store) -> None:
    """A :class:`ConfigurationError` when one of ``tasks`` is transactional and
    ``store`` has no transactions: its handler would get ``db=None`` and fail every
    attempt."""
    if store.has_transactions:
        return
    for task in tasks:
        if app.get(task).transactional:
            raise ConfigurationError(
                f"task {task!r} is transactional (its handler writes through the ledger's"
                f" connection), but the {type(store).__name__} has no transactions: use an"
                " SQLite or PostgreSQL ledger (--store sqlite:///ledger.db, or"
                " JobsKit(app, store=SQLiteStore(path)) in tests)"
            )


def task_queues(app: App, tasks: tuple[str, ...]) -> dict[str, str]:
    """The queues of ``tasks`` (every lane's: priority levels, shards) and the task of
    each."""
    return {queue: task for task in tasks for queue in app.queue_names(task)}


def priority_policy(app: App, tasks: tuple[str, ...]) -> PriorityPolicy | None:
    """The one priority policy of ``tasks`` (None if none has priorities; tasks
    without any run at normal). Tasks of different policies need workers of their
    own: one worker picks its next job by one rule."""
    policies = {task: app.get(task).queue.priorities for task in tasks}
    chosen = {policy for policy in policies.values() if policy is not None}
    if len(chosen) > 1:
        described = ", ".join(
            f"{task}: {policy.describe()}" for task, policy in policies.items() if policy
        )
        raise ConfigurationError(
            f"these tasks have different priority policies ({described}): run each in a"
            " worker of its own (--task), or give them the same policy"
        )
    return next(iter(chosen), None)
