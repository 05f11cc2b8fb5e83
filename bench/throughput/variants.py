"""The consumers ``bench.throughput`` measures: the worker (SQLite or memory store,
sync or async handler, with or without its metrics and log lines) and raw aio-pika."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import aio_pika.abc
from prometheus_client import CollectorRegistry

from bench.throughput.handlers import (
    RECORDER,
    TASK,
    TASK_ASYNC,
    Settled,
    Target,
    TimedMemoryStore,
    TimedSQLiteStore,
)
from bench.throughput.options import (
    RAW,
    WORKER_ASYNC,
    WORKER_LOGS,
    WORKER_MEMORY,
    WORKER_METRICS,
    WORKER_SQLITE,
    WORKER_SUMMARY,
    Options,
)
from bench.throughput.steady import SteadyProcess
from broker_jobs.observe.logs import configure_logging
from broker_jobs.observe.worker_metrics import WorkerMetrics
from broker_jobs.store import Store
from broker_jobs.worker import Worker, WorkerSettings

#: Seconds the steady phase waits for the last jobs after the publisher finished.
STEADY_TIMEOUT = 30.0
#: Seconds a drain may take before the round is failed.
DRAIN_TIMEOUT = 300.0


@dataclass
class Drain:
    rate: float
    outcomes: dict[str, int]


@dataclass
class Steady:
    latencies: list[float]  # seconds, one per published job
    missing: int


async def wait_for_consumer(url: str, queue: str) -> None:
    """Until ``queue`` has a consumer (the worker or raw consumer is up)."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        for _ in range(600):
            declared = await channel.declare_queue(queue, passive=True)
            if declared.declaration_result.consumer_count:
                return
            await asyncio.sleep(0.01)
        raise RuntimeError(f"no consumer on {queue} after 6 s")
    finally:
        await connection.close()


async def wait_until(done: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


class RawConsumer:
    """aio-pika, manual ack, the worker's prefetch; decodes nothing, records the
    arrival time by message id and acks."""

    def __init__(self, url: str, queue: str, prefetch: int) -> None:
        self._url, self._queue, self._prefetch = url, queue, prefetch
        self.arrivals: dict[str, float] = {}
        self.acked = 0
        self.last = math.nan

    async def __aenter__(self) -> RawConsumer:
        self._connection = await aio_pika.connect(
            self._url, client_properties={"connection_name": "bench raw consumer"}
        )
        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=self._prefetch)
        queue = await channel.get_queue(self._queue, ensure=False)
        arrivals = self.arrivals

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            arrivals[message.message_id or ""] = time.time()
            await message.ack()
            self.acked += 1
            self.last = time.perf_counter()

        await queue.consume(on_message)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._connection.close()


def latencies(sent: list[tuple[str, float]], started: Callable[[int, str], float]) -> Steady:
    found = [started(seq, job_id) - created for seq, (job_id, created) in enumerate(sent)]
    kept = [value for value in found if not math.isnan(value)]
    return Steady(kept, len(found) - len(kept))


@contextlib.contextmanager
def outcome_lines(directory: str) -> Iterator[None]:
    """The daemons' logging (configure_logging: INFO, JSON, password masking) into a
    file of ``directory``, as a worker run with --log-format json writes to a shipper;
    the bench's own logging is put back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with open(Path(directory) / "worker.log", "w") as log_file:
        stderr, sys.stderr = sys.stderr, log_file
        try:
            configure_logging("info", "json")
        finally:
            sys.stderr = stderr
        try:
            yield
        finally:
            for handler in list(root.handlers):
                root.removeHandler(handler)
            for handler in handlers:
                root.addHandler(handler)
            root.setLevel(level)


class WorkerVariant:
    def __init__(
        self, name: str, task: str, memory: bool, *, metrics: bool = False, logs: str = ""
    ) -> None:
        """``logs``: "" (none written), or the worker's ``success_lines`` with its INFO
        lines written as JSON to a file."""
        self.name, self.task, self._memory = name, task, memory
        self._metrics, self._logs = metrics, logs

    def _store(self, directory: str, settled: Settled) -> Store:
        if self._memory:
            return TimedMemoryStore(settled)
        return TimedSQLiteStore(Path(directory) / "store.sqlite3", settled)

    def _settings(self, target: Target, burst: bool) -> WorkerSettings:
        return WorkerSettings(
            tasks=(self.task,),
            concurrency=target.options.concurrency,
            burst=burst,
            declare=False,
            success_lines=self._logs or "summary",
        )

    def _worker(self, target: Target, store: Store, burst: bool) -> Worker:
        metrics = WorkerMetrics(CollectorRegistry()) if self._metrics else None
        return Worker(target.url, target.app, store, self._settings(target, burst), metrics=metrics)

    def _logging(self, directory: str) -> contextlib.AbstractContextManager[None]:
        return outcome_lines(directory) if self._logs else contextlib.nullcontext()

    async def drain(self, target: Target) -> Drain:
        jobs = target.options.jobs
        RECORDER.reset(jobs)
        settled = Settled()
        with tempfile.TemporaryDirectory(prefix="bthr") as directory, self._logging(directory):
            store = self._store(directory, settled)
            try:
                start = time.perf_counter()
                outcomes = await asyncio.wait_for(
                    self._worker(target, store, burst=True).run(), DRAIN_TIMEOUT
                )
            finally:
                store.close()
        elapsed = settled.last - start
        return Drain(jobs / elapsed if settled.count else 0.0, dict(outcomes))

    async def steady(self, target: Target, publisher: SteadyProcess, slots: int) -> Steady:
        RECORDER.reset(slots + 1)
        settled = Settled()
        with tempfile.TemporaryDirectory(prefix="bthr") as directory, self._logging(directory):
            store = self._store(directory, settled)
            worker = self._worker(target, store, burst=False)
            running = asyncio.create_task(worker.run())
            try:
                await wait_for_consumer(target.url, target.queue(self.task))
                sent = await publisher.run()
                await wait_until(lambda: RECORDER.seen() >= slots + 1, STEADY_TIMEOUT)
            finally:
                worker.stop()
                await running
                store.close()
        starts = RECORDER.starts
        return latencies(sent, lambda seq, _: starts[seq])


class RawVariant:
    name = RAW
    task = TASK

    async def drain(self, target: Target) -> Drain:
        jobs = target.options.jobs
        start = time.perf_counter()
        consumer = RawConsumer(target.url, target.queue(self.task), target.options.prefetch)
        async with consumer:
            await wait_until(lambda: consumer.acked >= jobs, DRAIN_TIMEOUT)
        return Drain(jobs / (consumer.last - start), {"acked": consumer.acked})

    async def steady(self, target: Target, publisher: SteadyProcess, slots: int) -> Steady:
        consumer = RawConsumer(target.url, target.queue(self.task), target.options.prefetch)
        async with consumer:
            await wait_for_consumer(target.url, target.queue(self.task))
            sent = await publisher.run()
            await wait_until(lambda: consumer.acked >= slots + 1, STEADY_TIMEOUT)
        arrivals = consumer.arrivals
        return latencies(sent, lambda _, job_id: arrivals.get(job_id, math.nan))


Variant = WorkerVariant | RawVariant


def make_variants(options: Options) -> list[Variant]:
    variants: list[Variant] = [
        WorkerVariant(WORKER_SQLITE, TASK, memory=False),
        WorkerVariant(WORKER_ASYNC, TASK_ASYNC, memory=False),
        WorkerVariant(WORKER_MEMORY, TASK, memory=True),
        RawVariant(),
    ]
    if options.observe:
        variants += [
            WorkerVariant(WORKER_METRICS, TASK, memory=False, metrics=True),
            WorkerVariant(WORKER_LOGS, TASK, memory=False, metrics=True, logs="each"),
            WorkerVariant(WORKER_SUMMARY, TASK, memory=False, metrics=True, logs="summary"),
        ]
    return variants
