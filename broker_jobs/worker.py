"""The worker daemon: consumes task queues and runs each delivery through the
execution protocol (:mod:`broker_jobs.runner`).

Shutdown order matters: first the consumers are cancelled (no new deliveries),
then running jobs get ``grace`` seconds to finish and settle, then the channel
closes, which returns whatever was delivered but not started to the queue.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import uuid
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
from aiormq.abc import DeliveredMessage

from broker_jobs.app import App
from broker_jobs.async_publisher import AsyncPublisher
from broker_jobs.declaring import declare_at_start, existing_queues
from broker_jobs.envelope import utc_now
from broker_jobs.errors import BrokerConnectionError, ConfigurationError, TopologyMissingError
from broker_jobs.execution import Executor
from broker_jobs.runner import Runner, RunnerSettings
from broker_jobs.store.base import DEFAULT_RETENTION, Store, StoreError
from broker_jobs.urls import BrokerURL, mask_text
from topology.delay import MAX_HOLD

log = logging.getLogger(__name__)

#: Seconds between checks of the queues' depth in burst mode.
BURST_POLL = 0.1
#: Seconds between prunings of the ledger.
PRUNE_EVERY = 3600.0


@dataclass(frozen=True)
class WorkerSettings:
    """``tasks``: the task types to run (None: every task of the app with a handler).
    ``prefetch`` defaults to twice the concurrency plus room for delayed jobs held
    until due (up to 1.2 s each)."""

    tasks: tuple[str, ...] | None = None
    concurrency: int = 4
    prefetch: int | None = None
    burst: bool = False
    grace: float = 30.0
    lease: float = 60.0
    declare: bool = True
    worker_id: str | None = None
    #: The broker's consumer_timeout in seconds (RabbitMQ's default: 30 min). A
    #: delivery unacked for longer gets its channel closed and is redelivered.
    consumer_timeout: float = 1800.0
    #: Finished records older than this are pruned (hourly) from the ledger.
    retention: timedelta = DEFAULT_RETENTION

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        if self.prefetch is not None and self.prefetch < self.concurrency:
            raise ConfigurationError("prefetch must be at least the concurrency")

    @property
    def prefetch_count(self) -> int:
        return self.prefetch or self.concurrency * 2 + 64


class Worker:
    """Runs the handlers of some of an app's tasks until stopped (or drained, in
    burst mode). ``await worker.run()`` returns the outcome counts."""

    def __init__(self, url: str, app: App, store: Store, settings: WorkerSettings) -> None:
        self._url = BrokerURL(url)
        self._app = app
        self._store = store
        self._settings = settings
        self._tasks = self._select_tasks()
        self._check_time_limits()
        self._worker_id = settings.worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )
        self._stopping = asyncio.Event()
        self._runner: Runner | None = None

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
        """SIGTERM/SIGINT stop gracefully; a second one exits at once (the broker
        redelivers whatever was unacked, so nothing is lost either way)."""
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if self._stopping.is_set():
                log.warning("second signal: exiting now; unacked jobs will be redelivered")
                os._exit(1)
            log.info("stopping: finishing running jobs (up to %g s)", self._settings.grace)
            self.stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal)

    async def run(self) -> Counter[str]:
        settings = self._settings
        if settings.declare:
            await declare_at_start(
                self._url, self._app.topology(), f"broker-jobs worker {self._worker_id}"
            )
        connection = await self._connect()
        publisher = AsyncPublisher(
            self._url.url, self._app, declare=False, connection_name="broker-jobs worker retries"
        )
        executor = Executor(settings.concurrency)
        try:
            # Returned dead letters raise (no dead-letter queue): never ack what was dropped.
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await channel.set_qos(prefetch_count=settings.prefetch_count)
            runner = Runner(
                self._app,
                self._store,
                executor=executor,
                publisher=publisher,
                channel=channel,
                settings=RunnerSettings(self._worker_id, lease=settings.lease),
            )
            self._runner = runner
            runner.start()
            pruner = asyncio.create_task(self._prune_forever())
            consumers = await self._consume(channel, runner)
            log.info("worker %s consuming %s", self._worker_id, ", ".join(self._tasks))
            await (self._until_drained(connection) if settings.burst else self._stopping.wait())
            for queue, tag in consumers:
                await queue.cancel(tag)
            runner.stopping = True
            pruner.cancel()
            await runner.finish(settings.grace)
            runner.close()
            return runner.outcomes.counts
        finally:
            executor.shutdown()
            await publisher.close()
            await connection.close()

    async def _connect(self) -> aio_pika.abc.AbstractConnection:
        try:
            return await aio_pika.connect(
                self._url.url,
                client_properties={"connection_name": f"broker-jobs worker {self._worker_id}"},
            )
        except aio_pika.exceptions.CONNECTION_EXCEPTIONS as error:
            raise BrokerConnectionError(
                f"cannot connect to the broker at {self._url.host}:{self._url.port}"
                f" ({self._url.masked}): {type(error).__name__}: {mask_text(str(error))}"
            ) from None

    async def _consume(
        self, channel: aio_pika.abc.AbstractChannel, runner: Runner
    ) -> list[tuple[aio_pika.abc.AbstractQueue, str]]:
        """Consume each task queue on the channel's aiormq channel directly: aio-pika's
        ``Queue.consume`` runs each delivery's callback in a task of its own, one loop
        iteration after the delivery's own task (measured: part of the latency gap
        to a raw consumer). The connection is not a robust one, so nothing would
        re-consume after a reconnect either way.

        aiormq calls the callback as it reads the delivery and runs what it returns
        in a task: the callback takes the delivery at once (one loop iteration, and
        one GIL hand-back at the select between them, sooner) and returns a coroutine
        that does nothing."""
        underlay = await channel.get_underlay_channel()
        consumers = []
        for task in self._tasks:
            name = self._app.names.task_queue(task)
            queue = await channel.get_queue(name, ensure=False)

            def on_delivery(
                delivered: DeliveredMessage, task: str = task
            ) -> Coroutine[Any, Any, None]:
                try:
                    runner.deliver(delivered, task)
                except Exception:  # not into aiormq's reader: that would close the channel
                    log.exception("taking a delivery from %s failed", task)
                return _taken()

            try:
                ok = await underlay.basic_consume(name, on_delivery)
            except aio_pika.exceptions.ChannelNotFoundEntity as error:
                raise TopologyMissingError(mask_text(str(error.args[-1]))) from None
            assert ok.consumer_tag is not None  # the broker always names the consumer
            consumers.append((queue, ok.consumer_tag))
        return consumers

    async def _until_drained(self, connection: aio_pika.abc.AbstractConnection) -> None:
        """Burst mode: return once nothing runs and the task queues and the delay
        ladder (where retries wait) are empty, twice in a row.

        Which queues exist is found once, on a blocking connection of its own (a
        passive declare of a missing queue, say a ladder never declared, closes its
        channel: reopening aio-pika channels at that pace made the broker see one
        opened twice); depths are then read on one channel."""
        names = self._app.names
        queues = [names.task_queue(task) for task in self._tasks]
        queues += [queue.name for queue in self._app.topology().queues if ".delay." in queue.name]
        queues = await asyncio.to_thread(
            existing_queues,
            self._url,
            queues,
            connection_name=f"broker-jobs worker {self._worker_id} (burst)",
        )
        probe = await connection.channel()
        quiet = 0
        while quiet < 2 and not self._stopping.is_set():
            await asyncio.sleep(BURST_POLL)
            depth = 0
            for name in queues:
                declared = await probe.declare_queue(name, passive=True)
                depth += declared.declaration_result.message_count or 0
            busy = self._runner is not None and self._runner.busy
            quiet = quiet + 1 if depth == 0 and not busy else 0
        await probe.close()

    async def _prune_forever(self) -> None:
        """Keep the ledger bounded: finished records older than the retention go.
        The retention must cover redeliveries and beat's catch-up window."""
        while True:
            cutoff = utc_now() - self._settings.retention
            try:
                pruned = await asyncio.to_thread(self._store.prune, cutoff)
            except StoreError:
                log.warning("pruning the ledger failed; trying again in an hour", exc_info=True)
            else:
                if pruned:
                    log.info("pruned %d finished records older than %s", pruned, cutoff)
            await asyncio.sleep(PRUNE_EVERY)

    def _check_time_limits(self) -> None:
        """Refuse a time limit the broker's consumer_timeout would cut short; warn
        about tasks without one."""
        timeout = self._settings.consumer_timeout
        for task in self._tasks:
            limit = self._app.get(task).time_limit
            if limit is None:
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

    def _select_tasks(self) -> tuple[str, ...]:
        runnable = [spec.name for spec in self._app if spec.handler is not None]
        if self._settings.tasks is None:
            if not runnable:
                raise ConfigurationError("this app declares no task with a handler")
            return tuple(runnable)
        for task in self._settings.tasks:
            if self._app.get(task).handler is None:
                raise ConfigurationError(
                    f"task {task!r} has no handler in this app: declare it with @app.task"
                )
        return self._settings.tasks


async def _taken() -> None:
    """What a consumer callback hands aiormq to run: the delivery is taken already."""
