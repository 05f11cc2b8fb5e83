"""Worker throughput and publish-to-start latency next to a raw aio-pika consumer.

Each variant consumes the same persistent jobs (published with ``Publisher``, confirmed)
from a durable quorum task queue of a fresh namespace, on the same broker, in the same
run. Two phases per variant and round:

- **drain**: N jobs are published first (untimed), then the consumer starts; jobs/s is
  N / (consumer start to the last job settled).
- **steady**: the consumer runs while another process publishes at a steady rate;
  latency is the handler's start (``time.time()``) minus the job's ``created_at``.

Rounds interleave the variants in a rotated order; the report gives medians over rounds
and the ratios worker / raw.

``--observe`` adds two variants of the SQLite worker, measured in the same rounds:
with its metrics (a :class:`WorkerMetrics` registry, as ``--metrics-port`` makes),
and with metrics and the outcome log lines at INFO, as JSON, to a file (one line per
success). Their cost is reported as ratios to the plain SQLite worker.

    python -m bench.throughput --url amqp://guest:guest@localhost:5672/
    python -m bench.throughput --quick        # starts a throwaway RabbitMQ node
    python -m bench.throughput --observe --no-celery --jobs 2000 --rounds 3

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import multiprocessing
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aio_pika
import aio_pika.abc
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from bench.celery_baseline import PREFETCH_MULTIPLIER, CeleryMissingError, drain_rate
from bench.publish import Admin, add_url_argument, broker, describe_broker, percentile
from broker_jobs import App, JobRequest, Publisher
from broker_jobs.observe.logs import configure_logging
from broker_jobs.observe.worker_metrics import WorkerMetrics
from broker_jobs.store import MemoryStore, SQLiteStore, Store
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.worker import Worker, WorkerSettings
from topology import Topology

TASK = "bench.noop"
TASK_ASYNC = "bench.noop_async"
DEFAULT_JOBS, DEFAULT_ROUNDS, DEFAULT_RATE, DEFAULT_SECONDS = 5000, 5, 500.0, 5.0
QUICK_JOBS, QUICK_ROUNDS, QUICK_RATE, QUICK_SECONDS = 500, 2, 250.0, 2.0
DEFAULT_CONCURRENCY = 8
#: Publishing ticks of the steady phase: rate / TICKS_PER_S jobs every tick.
TICKS_PER_S = 100
#: Seconds the steady phase waits for the last jobs after the publisher finished.
STEADY_TIMEOUT = 30.0
#: Seconds a drain may take before the round is failed.
DRAIN_TIMEOUT = 300.0

WORKER_SQLITE = "worker sync sqlite"
WORKER_ASYNC = "worker async sqlite"
WORKER_MEMORY = "worker sync memory"
WORKER_METRICS = "worker sqlite metrics"
WORKER_LOGS = "worker sqlite metrics+logs"
RAW = "raw aio-pika"
VARIANTS = (WORKER_SQLITE, WORKER_ASYNC, WORKER_MEMORY, RAW)
#: With --observe: the SQLite worker with its metrics, then with its INFO lines too.
OBSERVED = (WORKER_METRICS, WORKER_LOGS)

#: Issue figures, measured on 2 cores with RabbitMQ 3.10 (jobs/s): the aim's fallback
#: when celery is not installed here (Celery's rate scaled by raw aio-pika's).
CELERY_RATE = 3800.0
RAW_REFERENCE_RATE = 5500.0
CELERY = "celery solo (prefetch x100, acks late)"
#: Aim: the worker's p50 latency at most this many ms above the raw one.
P50_AIM_MS = 1.0


class Noop(BaseModel):
    """The benchmark tasks' payload: a slot number in the recorder."""

    seq: int


# -- options ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    url: str | None
    jobs: int
    rounds: int
    rate: float
    seconds: float
    concurrency: int
    quick: bool
    celery: bool = True
    observe: bool = False

    @property
    def variants(self) -> tuple[str, ...]:
        return (*VARIANTS, *OBSERVED) if self.observe else VARIANTS

    @property
    def prefetch(self) -> int:
        return WorkerSettings(concurrency=self.concurrency).prefetch_count


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.throughput", description=__doc__.split("\n\n", 1)[0]
    )
    add_url_argument(parser)
    parser.add_argument("--jobs", type=int, default=None, help=f"drained jobs ({DEFAULT_JOBS})")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds ({DEFAULT_ROUNDS})")
    parser.add_argument(
        "--rate", type=float, default=None, help=f"steady jobs/s ({DEFAULT_RATE:g})"
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help=f"steady phase length ({DEFAULT_SECONDS:g})"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"worker concurrency ({DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK_JOBS} jobs, {QUICK_ROUNDS} rounds,"
        f" {QUICK_SECONDS:g} s at {QUICK_RATE:g}/s",
    )
    parser.add_argument(
        "--no-celery",
        action="store_true",
        help="skip the Celery drain of each round (run when celery is installed)",
    )
    parser.add_argument(
        "--observe",
        action="store_true",
        help="also the SQLite worker with metrics, and with metrics and INFO JSON log lines",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    options = Options(
        url=args.url or None,
        jobs=args.jobs or (QUICK_JOBS if quick else DEFAULT_JOBS),
        rounds=args.rounds or (QUICK_ROUNDS if quick else DEFAULT_ROUNDS),
        rate=args.rate or (QUICK_RATE if quick else DEFAULT_RATE),
        seconds=args.seconds or (QUICK_SECONDS if quick else DEFAULT_SECONDS),
        concurrency=args.concurrency,
        quick=quick,
        celery=not args.no_celery,
        observe=args.observe,
    )
    if min(options.jobs, options.rounds, options.concurrency) < 1:
        parser.error("--jobs, --rounds and --concurrency must be positive")
    if options.rate <= 0 or options.seconds <= 0:
        parser.error("--rate and --seconds must be positive")
    return options


def tick_sizes(rate: float, seconds: float) -> list[int]:
    """Jobs per tick so that tick k ends with round(rate * k / TICKS_PER_S) jobs sent."""
    ticks = max(1, round(seconds * TICKS_PER_S))
    sent = [round(rate * (k + 1) / TICKS_PER_S) for k in range(ticks)]
    return [b - a for a, b in zip([0, *sent[:-1]], sent, strict=True)]


# -- what the handlers record -------------------------------------------------------------


class Recorder:
    """Handler start times (``time.time()``) by slot; preallocated per phase."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def reset(self, slots: int) -> None:
        self.starts = [math.nan] * slots

    def seen(self) -> int:
        return sum(1 for moment in self.starts if not math.isnan(moment))


RECORDER = Recorder()


def make_app(namespace: str) -> App:
    app = App(namespace=namespace)

    @app.task(TASK)
    def noop(payload: Noop) -> None:
        starts = RECORDER.starts
        if payload.seq < len(starts):
            starts[payload.seq] = time.time()

    @app.task(TASK_ASYNC)
    async def noop_async(payload: Noop) -> None:
        starts = RECORDER.starts
        if payload.seq < len(starts):
            starts[payload.seq] = time.time()

    return app


class Settled:
    """Counts recorded successes (the worker's last step before the ack)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.last = math.nan  # time.perf_counter() of the latest

    def add(self, count: int = 1) -> None:
        with self.lock:
            self.count += count
            self.last = time.perf_counter()


class TimedSQLiteStore(SQLiteStore):
    def __init__(self, path: Path, settled: Settled) -> None:
        super().__init__(path)
        self.settled = settled

    def succeed(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        super().succeed(key, worker, now=now)
        self.settled.add()

    def succeed_many(self, finished: Sequence[tuple[str, str]]) -> list[str]:
        lost = super().succeed_many(finished)
        self.settled.add(len(finished) - len(lost))
        return lost


class TimedMemoryStore(MemoryStore):
    def __init__(self, settled: Settled) -> None:
        super().__init__()
        self.settled = settled

    def succeed(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        super().succeed(key, worker, now=now)
        self.settled.add()


# -- the steady publisher (its own process) ------------------------------------------------


@dataclass(frozen=True)
class SteadySpec:
    url: str
    namespace: str
    task: str
    rate: float
    seconds: float


def steady_publisher(spec: SteadySpec, pipe: Connection) -> None:
    """Warm up (one job in the spare slot), say ready, wait for go, publish every tick
    on schedule, and send back ``(job_id, created_at)`` by slot."""
    url, namespace, task = spec.url, spec.namespace, spec.task
    rate, seconds = spec.rate, spec.seconds
    app = App(namespace=namespace)
    app.declare(task, Noop)
    sizes = tick_sizes(rate, seconds)
    total = sum(sizes)
    sent: list[tuple[str, float]] = []
    with Publisher(url, app, connection_name="bench steady") as publisher:
        publisher.publish(task, Noop(seq=total))
        pipe.send("ready")
        pipe.recv()
        start, seq = time.perf_counter(), 0
        for index, size in enumerate(sizes):
            delay = start + index / TICKS_PER_S - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            batch = [JobRequest(task, Noop(seq=seq + i)) for i in range(size)]
            seq += size
            for job in publisher.publish_many(batch):
                sent.append((job.id, job.created_at.timestamp()))
    pipe.send(sent)


class SteadyProcess:
    """The steady publisher, started (and warmed up) before the consumer."""

    def __init__(self, url: str, namespace: str, task: str, rate: float, seconds: float):
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=steady_publisher,
            args=(SteadySpec(url, namespace, task, rate, seconds), child),
            name="bench steady publisher",
            daemon=True,
        )
        self._process.start()
        child.close()

    def wait_ready(self) -> None:
        if not self._pipe.poll(60) or self._pipe.recv() != "ready":
            raise RuntimeError("the steady publisher did not start")

    async def run(self) -> list[tuple[str, float]]:
        self._pipe.send("go")
        sent: list[tuple[str, float]] = await asyncio.to_thread(self._pipe.recv)
        return sent

    def close(self) -> None:
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


# -- consumers -------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Target:
    url: str
    app: App
    options: Options

    @classmethod
    def fresh(cls, url: str, options: Options) -> Target:
        return cls(url, make_app(f"bthr{secrets.token_hex(4)}"), options)

    def queue(self, task: str) -> str:
        return self.app.names.task_queue(task)

    @property
    def topology(self) -> Topology:
        return self.app.topology()


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
        self, name: str, task: str, memory: bool, *, metrics: bool = False, logs: bool = False
    ) -> None:
        self.name, self.task, self._memory = name, task, memory
        self._metrics, self._logs = metrics, logs

    def _store(self, directory: str, settled: Settled) -> Store:
        if self._memory:
            return TimedMemoryStore(settled)
        return TimedSQLiteStore(Path(directory) / "store.sqlite3", settled)

    def _worker(self, target: Target, store: Store, burst: bool) -> Worker:
        settings = WorkerSettings(
            tasks=(self.task,),
            concurrency=target.options.concurrency,
            burst=burst,
            declare=False,
        )
        metrics = WorkerMetrics(CollectorRegistry()) if self._metrics else None
        return Worker(target.url, target.app, store, settings, metrics=metrics)

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
            WorkerVariant(WORKER_LOGS, TASK, memory=False, metrics=True, logs=True),
        ]
    return variants


# -- running --------------------------------------------------------------------------------


FIGURES = ("jobs_per_s", "p50_ms", "p99_ms")


@dataclass
class Results:
    names: tuple[str, ...] = VARIANTS
    figures: dict[str, dict[str, list[float]]] = field(init=False)
    warnings: list[str] = field(default_factory=list)
    #: Celery's drain rate per round, measured in the same run (empty without celery).
    celery_rates: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.figures = {v: {f: [] for f in FIGURES} for v in self.names}

    def median(self, variant: str, figure: str) -> float:
        return statistics.median(self.figures[variant][figure])

    def rate_ratio(self, variant: str, base: str = RAW) -> float:
        return self.median(variant, "jobs_per_s") / self.median(base, "jobs_per_s")

    def p50_gap(self, variant: str, base: str = RAW) -> float:
        return self.median(variant, "p50_ms") - self.median(base, "p50_ms")

    def round_rate_ratios(self, variant: str, base: str = RAW) -> list[float]:
        pairs = zip(
            self.figures[variant]["jobs_per_s"], self.figures[base]["jobs_per_s"], strict=True
        )
        return [a / b for a, b in pairs]

    def round_p50_gaps(self, variant: str, base: str = RAW) -> list[float]:
        pairs = zip(self.figures[variant]["p50_ms"], self.figures[base]["p50_ms"], strict=True)
        return [a - b for a, b in pairs]


def round_order(variants: Sequence[Variant], round_index: int) -> list[Variant]:
    """Rotated each round and reversed every other round, as in bench.publish."""
    shift = round_index % len(variants)
    order = [*variants[shift:], *variants[:shift]]
    return order[::-1] if round_index % 2 else order


def prepublish(target: Target, task: str) -> None:
    """The drain phase's N jobs, published and confirmed before the consumer starts."""
    jobs = target.options.jobs
    with Publisher(target.url, target.app, connection_name="bench prepublish") as publisher:
        publisher.publish_many([JobRequest(task, Noop(seq=seq)) for seq in range(jobs)])


def measure(
    variant: Variant, target: Target, admin: Admin, runner: asyncio.Runner, results: Results
) -> str:
    options, queue = target.options, target.queue(variant.task)
    admin.purge(queue)
    prepublish(target, variant.task)
    drained = runner.run(variant.drain(target))
    left = admin.depth(queue)
    slots = sum(tick_sizes(options.rate, options.seconds))
    publisher = SteadyProcess(
        target.url, target.app.namespace, variant.task, options.rate, options.seconds
    )
    try:
        publisher.wait_ready()
        steady = runner.run(variant.steady(target, publisher, slots))
    finally:
        publisher.close()
    admin.purge(queue)
    p50 = percentile(steady.latencies, 50) * 1000
    p99 = percentile(steady.latencies, 99) * 1000
    row = results.figures[variant.name]
    row["jobs_per_s"].append(drained.rate)
    row["p50_ms"].append(p50)
    row["p99_ms"].append(p99)
    expected = {"acked": options.jobs} if variant.name == RAW else {"succeeded": options.jobs}
    if drained.outcomes != expected or left:
        results.warnings.append(
            f"{variant.name}: drain outcomes {drained.outcomes}, {left} left in the queue"
        )
    if steady.missing:
        results.warnings.append(f"{variant.name}: {steady.missing} steady jobs never started")
    return f"{variant.name} {drained.rate:,.0f}/s p50 {p50:.2f} p99 {p99:.2f} ms"


def measure_celery(url: str, options: Options, results: Results) -> str:
    """One Celery drain (bench/celery_baseline.py: solo pool, acks_late, prefetch
    multiplier set for throughput), the reference of the rate aim, in the same round."""
    try:
        rate = drain_rate(url, options.jobs, prefetch_multiplier=PREFETCH_MULTIPLIER)
    except CeleryMissingError:
        results.warnings.append(
            "celery is not installed: the rate aim uses the issue's figures"
            " (pip install celery to measure it here)"
        )
        return f"{CELERY} skipped"
    results.celery_rates.append(rate)
    return f"{CELERY} {rate:,.0f}/s"


def run_rounds(options: Options, url: str, admin: Admin) -> Results:
    results = Results(options.variants)
    variants = make_variants(options)
    with asyncio.Runner() as runner:
        for index in range(options.rounds):
            target = Target.fresh(url, options)
            admin.declare(target.topology)
            try:
                lines = [
                    measure(variant, target, admin, runner, results)
                    for variant in round_order(variants, index)
                ]
                if options.celery:
                    lines.append(measure_celery(url, options, results))
            finally:
                admin.delete(target.topology)
            print(f"  round {index + 1}/{options.rounds} ({target.app.namespace}):", flush=True)
            for line in lines:
                print(f"    {line}", flush=True)
    return results


# -- reporting ----------------------------------------------------------------------------------


def describe_config(
    options: Options, url: str, node: RabbitNode | None, admin: Admin
) -> dict[str, Any]:
    return {
        **describe_broker(url, node, admin),
        "drain_jobs": options.jobs,
        "rounds": options.rounds,
        "steady": f"{options.rate:g} jobs/s for {options.seconds:g} s",
        "concurrency": options.concurrency,
        "prefetch": options.prefetch,
        "queue": "durable quorum, persistent messages, publisher confirms",
        "store": "SQLite (WAL, synchronous=FULL) in a temp dir; MemoryStore for comparison",
        "observe": (
            "SQLite worker also with metrics, and with metrics + INFO JSON lines to a file"
            if options.observe
            else "off (--observe)"
        ),
        "celery": (
            f"solo pool, task_acks_late=True, worker_prefetch_multiplier={PREFETCH_MULTIPLIER}"
            " (for throughput; Celery's default is 4), quorum queue (bench/celery_baseline.py)"
            if options.celery
            else "skipped (--no-celery)"
        ),
    }


def print_config(config: dict[str, Any]) -> None:
    print("Worker throughput benchmark (broker_jobs)")
    for key, value in config.items():
        print(f"  {key:<14} {value}")
    print()


def print_table(results: Results) -> None:
    print()
    print(
        f"{'variant':<22} {'jobs/s':>9} {'min':>8} {'max':>8}"
        f" {'p50 ms':>8} {'p99 ms':>8} {'vs raw':>7} {'p50 +ms':>8}"
    )
    for name in results.names:
        rates = results.figures[name]["jobs_per_s"]
        print(
            f"{name:<22} {results.median(name, 'jobs_per_s'):>9,.0f} {min(rates):>8,.0f}"
            f" {max(rates):>8,.0f} {results.median(name, 'p50_ms'):>8.2f}"
            f" {results.median(name, 'p99_ms'):>8.2f} {results.rate_ratio(name):>7.2f}"
            f" {results.p50_gap(name):>+8.2f}"
        )
    if results.celery_rates:
        rates = results.celery_rates
        ratio = statistics.median(rates) / results.median(RAW, "jobs_per_s")
        print(
            f"{CELERY:<22} {statistics.median(rates):>9,.0f} {min(rates):>8,.0f}"
            f" {max(rates):>8,.0f} {'-':>8} {'-':>8} {ratio:>7.2f} {'-':>8}"
        )


def celery_reference(results: Results) -> tuple[float, str]:
    """The rate the SQLite worker must reach: Celery's, measured in this run when
    celery is installed, else the issue's Celery figure scaled to this machine by
    raw aio-pika's rate."""
    if results.celery_rates:
        return statistics.median(results.celery_rates), "Celery measured in this run"
    scaled = CELERY_RATE / RAW_REFERENCE_RATE * results.median(RAW, "jobs_per_s")
    return scaled, (
        f"Celery {CELERY_RATE:,.0f} vs raw {RAW_REFERENCE_RATE:,.0f} in the issue, scaled by"
        " raw aio-pika here"
    )


def aims(results: Results) -> dict[str, bool]:
    """The issue's aims for the SQLite worker: at least Celery's rate on this machine,
    and p50 within 1 ms of raw."""
    reference, _ = celery_reference(results)
    return {
        "jobs/s >= celery": results.median(WORKER_SQLITE, "jobs_per_s") >= reference,
        "p50 within 1 ms of raw": results.p50_gap(WORKER_SQLITE) <= P50_AIM_MS,
    }


def print_aims(results: Results) -> None:
    reference, source = celery_reference(results)
    met = aims(results)
    rate = results.median(WORKER_SQLITE, "jobs_per_s")
    print()
    print(
        f"Aim ({WORKER_SQLITE}): jobs/s >= {reference:,.0f} ({source});"
        f" p50 <= raw p50 + {P50_AIM_MS:g} ms"
    )
    gap = results.p50_gap(WORKER_SQLITE)
    ratios = ", ".join(f"{r:.2f}" for r in results.round_rate_ratios(WORKER_SQLITE))
    gaps = ", ".join(f"{g:+.2f}" for g in results.round_p50_gaps(WORKER_SQLITE))
    verdict = "met" if met["jobs/s >= celery"] else "NOT met"
    print(
        f"  jobs/s worker         {rate:,.0f} = {rate / reference:.2f} x Celery"
        f"  (aim >= 1.00)  {verdict}"
    )
    print(f"  worker / raw per round: {ratios}")
    verdict = "met" if met["p50 within 1 ms of raw"] else "NOT met"
    print(f"  p50 worker - raw      {gap:+5.2f} ms  (aim <= {P50_AIM_MS:g})  {verdict}")
    print(f"                        per round: {gaps}")
    for warning in results.warnings:
        print(f"WARNING: {warning}")


def observe_cost(results: Results) -> dict[str, dict[str, Any]]:
    """The --observe variants next to the plain SQLite worker of the same rounds."""
    base = WORKER_SQLITE
    return {
        name: {
            "jobs_per_s_ratio": round(results.rate_ratio(name, base), 3),
            "round_jobs_per_s_ratios": [round(x, 3) for x in results.round_rate_ratios(name, base)],
            "p50_ms_diff": round(results.p50_gap(name, base), 3),
            "round_p50_ms_diffs": [round(x, 3) for x in results.round_p50_gaps(name, base)],
            "p99_ms_diff": round(
                results.median(name, "p99_ms") - results.median(base, "p99_ms"), 3
            ),
        }
        for name in OBSERVED
        if name in results.names
    }


def print_observe_cost(results: Results) -> None:
    for name, cost in observe_cost(results).items():
        ratios = ", ".join(f"{r:.2f}" for r in cost["round_jobs_per_s_ratios"])
        gaps = ", ".join(f"{g:+.2f}" for g in cost["round_p50_ms_diffs"])
        print(
            f"Cost ({name} / {WORKER_SQLITE}): jobs/s x{cost['jobs_per_s_ratio']:.3f}"
            f" (per round {ratios}); p50 {cost['p50_ms_diff']:+.2f} ms (per round {gaps});"
            f" p99 {cost['p99_ms_diff']:+.2f} ms"
        )


def summary(config: dict[str, Any], results: Results) -> dict[str, Any]:
    def r(value: float) -> float:
        return round(value, 2)

    names = results.names
    return {
        "config": config,
        "median": {v: {f: r(results.median(v, f)) for f in FIGURES} for v in names},
        "rounds": {v: {f: [r(x) for x in results.figures[v][f]] for f in FIGURES} for v in names},
        "jobs_per_s_ratio_vs_raw": {v: round(results.rate_ratio(v), 3) for v in names},
        "p50_ms_minus_raw": {v: r(results.p50_gap(v)) for v in names},
        "round_jobs_per_s_ratios": {
            v: [round(x, 3) for x in results.round_rate_ratios(v)] for v in names
        },
        "observe_cost_vs_plain_sqlite_worker": observe_cost(results),
        "celery_jobs_per_s": {
            "median": r(statistics.median(results.celery_rates)) if results.celery_rates else None,
            "rounds": [r(x) for x in results.celery_rates],
        },
        "aims_met": aims(results),
        "warnings": results.warnings,
    }


# -- main -----------------------------------------------------------------------------------------


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    admin = Admin(url)
    try:
        config = describe_config(options, url, node, admin)
        print_config(config)
        results = run_rounds(options, url, admin)
    finally:
        admin.close()
    print_table(results)
    print_aims(results)
    print_observe_cost(results)
    return summary(config, results)


class QuietNoTimeLimit(logging.Filter):
    """The no-op tasks have no time limit on purpose: drop the worker's warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "has no time limit" not in str(record.msg)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    # On the logger that logs it: a logger's filters skip records its children pass up.
    logging.getLogger("broker_jobs.worker.daemon").addFilter(QuietNoTimeLimit())
    with broker(options.url) as (url, node):
        figures = bench(options, url, node)
    print(json.dumps(figures, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
