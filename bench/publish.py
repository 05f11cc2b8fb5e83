"""Publish throughput of the broker_jobs publishers next to raw pika and aio-pika.

Every variant publishes the same persistent, confirmed, mandatory job to the same
durable quorum queue of a fresh namespace, on the same broker, in the same run.
Rounds interleave the variants (in a rotated order) because a shared machine is
noisy; the report gives the median jobs/s per variant and ratios of medians.

    python -m bench.publish --url amqp://guest:guest@localhost:5672/
    python -m bench.publish --quick        # starts a throwaway RabbitMQ node

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol

import aio_pika
import aio_pika.abc
import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pydantic import BaseModel

from broker_jobs import App, AsyncPublisher, JobRequest, Publisher, mask_url
from broker_jobs.store import SQLiteStore, Store
from broker_jobs.testing.postgres_node import PostgresNode
from broker_jobs.testing.rabbit_node import RabbitNode
from topology import Topology, declare
from topology import names as n

URL_ENV = "BROKER_JOBS_BENCH_URL"
TASK = "bench.noop"
PAYLOAD: dict[str, Any] = {"url": "https://example.com/images/123.png", "width": 128}
BODY = json.dumps(PAYLOAD, separators=(",", ":")).encode()
DEFAULT_JOBS, DEFAULT_ROUNDS = 5000, 5
QUICK_JOBS, QUICK_ROUNDS = 300, 2

SYNC_SINGLE = "sync single"
SYNC_BATCH = "sync batch"
ASYNC_PIPELINED = "async pipelined"
RAW_AIO_PIKA = "raw aio-pika pipelined"
RAW_PIKA_SINGLE = "raw pika single"
SYNC_SINGLE_LEDGER = "sync single + ledger"
SYNC_BATCH_LEDGER = "sync batch + ledger"
VARIANTS = (
    SYNC_SINGLE,
    SYNC_BATCH,
    ASYNC_PIPELINED,
    RAW_AIO_PIKA,
    RAW_PIKA_SINGLE,
    SYNC_SINGLE_LEDGER,
    SYNC_BATCH_LEDGER,
)


@dataclass(frozen=True)
class Aim:
    """``numerator / denominator`` (ratio of medians) should reach ``target``."""

    numerator: str
    denominator: str
    target: float

    @property
    def label(self) -> str:
        return f"{self.numerator} / {self.denominator}"


AIMS = (
    Aim(ASYNC_PIPELINED, RAW_AIO_PIKA, 0.8),
    Aim(SYNC_BATCH, RAW_AIO_PIKA, 0.5),
    Aim(SYNC_SINGLE, RAW_PIKA_SINGLE, 0.9),
)
#: What recording each confirmed job in an SQLite ledger (``ledger=``) costs: the
#: rate with it over the rate without (no aim: reported for docs/store.md).
LEDGER_COSTS = (
    Aim(SYNC_SINGLE_LEDGER, SYNC_SINGLE, 0.0),
    Aim(SYNC_BATCH_LEDGER, SYNC_BATCH, 0.0),
)


class Noop(BaseModel):
    """The benchmark task's payload model."""

    url: str
    width: int


# -- options and broker ---------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    url: str | None
    jobs: int
    rounds: int
    quick: bool


def add_url_argument(parser: argparse.ArgumentParser) -> None:
    """``--url``, shared by every benchmark: the broker to measure."""
    parser.add_argument(
        "--url",
        default=os.environ.get(URL_ENV),
        help=f"AMQP URL (default: ${URL_ENV}; neither: start a throwaway RabbitMQ node)",
    )


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.publish", description=__doc__.split("\n\n", 1)[0]
    )
    add_url_argument(parser)
    parser.add_argument("--jobs", type=int, default=None, help=f"jobs per round ({DEFAULT_JOBS})")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds ({DEFAULT_ROUNDS})")
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke run: {QUICK_JOBS} jobs, {QUICK_ROUNDS} rounds"
    )
    args = parser.parse_args(argv)
    jobs = args.jobs or (QUICK_JOBS if args.quick else DEFAULT_JOBS)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    if jobs < 1 or rounds < 1:
        parser.error("--jobs and --rounds must be positive")
    return Options(url=args.url or None, jobs=jobs, rounds=rounds, quick=args.quick)


@contextlib.contextmanager
def broker(url: str | None) -> Iterator[tuple[str, RabbitNode | None]]:
    """The given broker, or a throwaway node started for this run and removed after."""
    if url:
        yield url, None
        return
    if not RabbitNode.available():
        raise SystemExit(f"no --url, no ${URL_ENV} and no local rabbitmq-server to start")
    node = RabbitNode.create()
    print(f"No --url and no ${URL_ENV}: starting a throwaway RabbitMQ node ({node.nodename})")
    try:
        node.start()
        print(f"Throwaway node up at {mask_url(node.url)}; it is removed at the end")
        yield node.url, node
    finally:
        node.cleanup()


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[PostgresNode]:
    """A PostgreSQL cluster started for this run from the installed server, removed
    after (also when its start fails half-way)."""
    node = PostgresNode.create()
    try:
        node.start()
        print(f"Throwaway PostgreSQL on port {node.port}; it is removed at the end")
        yield node
    finally:
        node.cleanup()


@dataclass(frozen=True)
class Target:
    """Where every variant publishes: one task of a fresh namespace."""

    url: str
    app: App

    @classmethod
    def fresh(cls, url: str) -> Target:
        app = App(namespace=f"bench{secrets.token_hex(4)}")
        app.declare(TASK, Noop)
        return cls(url, app)

    @property
    def exchange(self) -> str:
        return self.app.names.work_exchange

    @property
    def queue(self) -> str:
        return self.app.names.task_queue(TASK)

    @property
    def topology(self) -> Topology:
        return self.app.topology()


class Admin:
    """A plain pika connection to purge, count and finally delete the benchmark's objects."""

    def __init__(self, url: str) -> None:
        parameters = pika.URLParameters(url)
        parameters.heartbeat = 0  # idle while the variants run; must not be dropped
        parameters.client_properties = {"connection_name": "bench admin"}
        self._connection = pika.BlockingConnection(parameters)
        self._channel = self._connection.channel()

    def server_version(self) -> str | None:
        impl = getattr(self._connection, "_impl", None)
        properties = getattr(impl, "server_properties", None) or {}
        found = properties.get("version")
        return found.decode() if isinstance(found, bytes) else found

    def declare(self, topology: Topology) -> None:
        """Declare up front, so the raw variants never depend on running after ours."""
        declare(self._connection, topology)

    def purge(self, queue: str) -> None:
        self._channel.queue_purge(queue)

    def depth(self, queue: str) -> int:
        return self._channel.queue_declare(queue, passive=True).method.message_count or 0

    def delete(self, topology: Topology) -> None:
        for queue in topology.queues:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self._fresh_channel().queue_delete(queue.name)
        for exchange in topology.exchanges:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self._fresh_channel().exchange_delete(exchange.name)

    def close(self) -> None:
        with contextlib.suppress(pika.exceptions.AMQPError):
            self._connection.close()

    def _fresh_channel(self) -> BlockingChannel:
        if not self._channel.is_open:
            self._channel = self._connection.channel()
        return self._channel


# -- the variants -----------------------------------------------------------------------


class Variant(Protocol):
    name: str

    def open(self, count: int) -> None:
        """Connect, declare, publish one job to warm up, and prepare ``count`` jobs."""

    def publish(self, count: int) -> None:
        """Publish ``count`` confirmed jobs: the timed part."""

    def close(self) -> None: ...


def raw_properties() -> dict[str, Any]:
    """AMQP properties like those of a broker_jobs job (same headers and sizes)."""
    job_id = str(uuid.uuid4())
    now = datetime.now(UTC)
    return {
        "content_type": n.CONTENT_TYPE,
        "content_encoding": n.CONTENT_ENCODING,
        "message_id": job_id,
        "type": TASK,
        "timestamp": int(now.timestamp()),
        "headers": {
            n.HEADER_WIRE_VERSION: n.WIRE_VERSION,
            n.HEADER_IDEMPOTENCY_KEY: job_id,
            n.HEADER_ATTEMPT: 1,
            n.HEADER_CREATED_AT: now.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        },
    }


def requests(count: int) -> list[JobRequest]:
    return [JobRequest(TASK, PAYLOAD) for _ in range(count)]


class SyncSingle:
    name = SYNC_SINGLE

    def __init__(self, target: Target, ledger_dir: Path | None = None) -> None:
        """``ledger_dir``: give the publisher a fresh SQLite ledger there per round
        (the embedded default: one FULL-synchronous transaction per publish call)."""
        self._target = target
        self._ledger_dir = ledger_dir
        self._publisher: Publisher | None = None
        self._ledger: Store | None = None

    def open(self, count: int) -> None:
        if self._ledger_dir is not None:
            self._ledger = SQLiteStore(self._ledger_dir / f"ledger-{uuid.uuid4().hex}.db")
        self._publisher = Publisher(
            self._target.url, self._target.app, connection_name="bench", ledger=self._ledger
        )
        self._publisher.publish(TASK, PAYLOAD)

    def publish(self, count: int) -> None:
        assert self._publisher is not None
        publish = self._publisher.publish
        for _ in range(count):
            publish(TASK, PAYLOAD)

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
        if self._ledger is not None:
            self._ledger.close()


class SyncBatch(SyncSingle):
    name = SYNC_BATCH

    def open(self, count: int) -> None:
        super().open(count)
        self._requests = requests(count)

    def publish(self, count: int) -> None:
        assert self._publisher is not None
        self._publisher.publish_many(self._requests)


class SyncSingleLedger(SyncSingle):
    name = SYNC_SINGLE_LEDGER


class SyncBatchLedger(SyncBatch):
    name = SYNC_BATCH_LEDGER


class AsyncPipelined:
    name = ASYNC_PIPELINED

    def __init__(self, target: Target, runner: asyncio.Runner) -> None:
        self._target = target
        self._runner = runner
        self._publisher: AsyncPublisher | None = None

    def open(self, count: int) -> None:
        self._publisher = AsyncPublisher(
            self._target.url, self._target.app, connection_name="bench"
        )
        self._runner.run(self._publisher.publish(TASK, PAYLOAD))
        self._requests = requests(count)

    def publish(self, count: int) -> None:
        assert self._publisher is not None
        self._runner.run(self._publisher.publish_many(self._requests))

    def close(self) -> None:
        if self._publisher is not None:
            self._runner.run(self._publisher.close())


class RawAioPika:
    name = RAW_AIO_PIKA

    def __init__(self, target: Target, runner: asyncio.Runner) -> None:
        self._target = target
        self._runner = runner
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._exchange: aio_pika.abc.AbstractExchange | None = None

    def open(self, count: int) -> None:
        self._runner.run(self._open())

    async def _open(self) -> None:
        self._connection = await aio_pika.connect(self._target.url)
        channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
        self._exchange = await channel.get_exchange(self._target.exchange, ensure=False)
        await self._publish(1)

    def publish(self, count: int) -> None:
        self._runner.run(self._publish(count))

    async def _publish(self, count: int) -> None:
        exchange = self._exchange
        assert exchange is not None
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(
                        BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, **raw_properties()
                    ),
                    TASK,
                    mandatory=True,
                )
                for _ in range(count)
            )
        )

    def close(self) -> None:
        if self._connection is not None:
            self._runner.run(self._connection.close())


class RawPikaSingle:
    name = RAW_PIKA_SINGLE

    def __init__(self, target: Target) -> None:
        self._target = target
        self._connection: pika.BlockingConnection | None = None

    def open(self, count: int) -> None:
        self._connection = pika.BlockingConnection(pika.URLParameters(self._target.url))
        self._channel = self._connection.channel()
        self._channel.confirm_delivery()
        self.publish(1)

    def publish(self, count: int) -> None:
        channel, exchange = self._channel, self._target.exchange
        for _ in range(count):
            properties = pika.BasicProperties(delivery_mode=2, **raw_properties())
            channel.basic_publish(exchange, TASK, BODY, properties, mandatory=True)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


def make_variants(target: Target, runner: asyncio.Runner, directory: Path) -> list[Variant]:
    return [
        SyncSingle(target),
        SyncBatch(target),
        AsyncPipelined(target, runner),
        RawAioPika(target, runner),
        RawPikaSingle(target),
        SyncSingleLedger(target, ledger_dir=directory),
        SyncBatchLedger(target, ledger_dir=directory),
    ]


# -- running ----------------------------------------------------------------------------


@dataclass
class Results:
    rates: dict[str, list[float]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    warnings: list[str] = field(default_factory=list)

    def median(self, variant: str) -> float:
        return statistics.median(self.rates[variant])

    def ratio(self, aim: Aim) -> float:
        """The ratio of medians: the figure the aims are judged on."""
        return self.median(aim.numerator) / self.median(aim.denominator)

    def round_ratios(self, aim: Aim) -> list[float]:
        """The ratio within each round (both variants ran back to back): shows the noise."""
        pairs = zip(self.rates[aim.numerator], self.rates[aim.denominator], strict=True)
        return [numerator / denominator for numerator, denominator in pairs]


def measure(variant: Variant, admin: Admin, target: Target, count: int) -> tuple[float, int]:
    """Jobs/s of one timed publish of ``count`` jobs (open, warm-up and purge untimed),
    and how many jobs the queue held after it."""
    try:
        variant.open(count)
        admin.purge(target.queue)
        start = time.perf_counter()
        variant.publish(count)
        elapsed = time.perf_counter() - start
    finally:
        variant.close()
    depth = admin.depth(target.queue)
    admin.purge(target.queue)
    return count / elapsed, depth


def round_order(variants: Sequence[Variant], round_index: int) -> list[Variant]:
    """Rotate the order each round, and reverse it every other round: rotation alone
    keeps every variant behind the same neighbour, whose backlog the broker may still
    be writing."""
    shift = round_index % len(variants)
    order = [*variants[shift:], *variants[:shift]]
    return order[::-1] if round_index % 2 else order


def run_rounds(options: Options, target: Target, admin: Admin) -> Results:
    results = Results()
    with asyncio.Runner() as runner, tempfile.TemporaryDirectory() as directory:
        variants = make_variants(target, runner, Path(directory))
        for index in range(options.rounds):
            figures = []
            for variant in round_order(variants, index):
                rate, depth = measure(variant, admin, target, options.jobs)
                results.rates[variant.name].append(rate)
                if depth != options.jobs:
                    results.warnings.append(
                        f"round {index + 1}, {variant.name}: the queue held {depth} jobs"
                        f" after {options.jobs} confirmed publishes"
                    )
                figures.append(f"{variant.name} {rate:,.0f}")
            print(f"  round {index + 1}/{options.rounds}: " + ", ".join(figures), flush=True)
    return results


# -- reporting --------------------------------------------------------------------------


def describe_broker(url: str, node: RabbitNode | None, admin: Admin) -> dict[str, Any]:
    """What every benchmark prints about the broker, the client and the machine."""
    server = admin.server_version()
    if server is None and node is not None:
        server = node.server_version()
    return {
        "broker": mask_url(url),
        "broker_origin": "throwaway node" if node is not None else "given",
        "rabbitmq": server or "unknown",
        "python": platform.python_version(),
        "pika": version("pika"),
        "aio_pika": version("aio-pika"),
        "cpus": os.cpu_count(),
    }


def describe_config(
    options: Options, url: str, node: RabbitNode | None, admin: Admin
) -> dict[str, Any]:
    return {
        **describe_broker(url, node, admin),
        "jobs_per_round": options.jobs,
        "rounds": options.rounds,
        "queue": "durable quorum, persistent messages, publisher confirms, mandatory",
        "body_bytes": len(BODY),
    }


def print_config(config: dict[str, Any]) -> None:
    print("Publish benchmark (broker_jobs)")
    for key, value in config.items():
        print(f"  {key:<15} {value}")


def print_table(results: Results) -> None:
    print()
    print(f"{'variant':<24} {'median jobs/s':>14} {'min':>10} {'max':>10}")
    for name in VARIANTS:
        rates = results.rates[name]
        low, high = min(rates), max(rates)
        print(f"{name:<24} {results.median(name):>14,.0f} {low:>10,.0f} {high:>10,.0f}")


def print_warnings(results: Results) -> None:
    for warning in results.warnings:
        print(f"WARNING: {warning}")


def print_aims(results: Results) -> None:
    print()
    print(
        "Aim: async pipelined >= 0.8 of raw ceiling; sync batch >= 0.5 of it;"
        " sync single >= 0.9 of raw pika"
    )
    for aim in AIMS:
        ratio = results.ratio(aim)
        verdict = "met" if ratio >= aim.target else "NOT met"
        spread = ", ".join(f"{r:.2f}" for r in results.round_ratios(aim))
        print(f"  {aim.label:<42} {ratio:5.2f}  (aim >= {aim.target})  {verdict}")
        print(f"  {'':<42} per round: {spread}")
    print("Cost of the ledger (ledger=, SQLite): rate with it / rate without")
    for cost in LEDGER_COSTS:
        spread = ", ".join(f"{r:.2f}" for r in results.round_ratios(cost))
        print(f"  {cost.label:<42} {results.ratio(cost):5.2f}  per round: {spread}")


def summary(config: dict[str, Any], results: Results) -> dict[str, Any]:
    return {
        "config": config,
        "median_jobs_per_s": {v: round(results.median(v), 1) for v in VARIANTS},
        "min_jobs_per_s": {v: round(min(results.rates[v]), 1) for v in VARIANTS},
        "max_jobs_per_s": {v: round(max(results.rates[v]), 1) for v in VARIANTS},
        "rounds_jobs_per_s": {v: [round(r, 1) for r in results.rates[v]] for v in VARIANTS},
        "ratios": {aim.label: round(results.ratio(aim), 3) for aim in AIMS},
        "round_ratios": {
            aim.label: [round(r, 3) for r in results.round_ratios(aim)] for aim in AIMS
        },
        "aims_met": {aim.label: results.ratio(aim) >= aim.target for aim in AIMS},
        "ledger_costs": {cost.label: round(results.ratio(cost), 3) for cost in LEDGER_COSTS},
        "warnings": results.warnings,
    }


# -- main -------------------------------------------------------------------------------


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    target = Target.fresh(url)
    admin = Admin(url)
    try:
        config = describe_config(options, url, node, admin)
        print_config(config)
        print(f"  {'namespace':<15} {target.app.namespace}")
        print()
        admin.declare(target.topology)
        results = run_rounds(options, target, admin)
    finally:
        admin.delete(target.topology)
        admin.close()
    print_table(results)
    print_warnings(results)
    print_aims(results)
    return summary(config, results)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    with broker(options.url) as (url, node):
        figures = bench(options, url, node)
    print(json.dumps(figures, sort_keys=False))
    return 0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolated between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


if __name__ == "__main__":
    sys.exit(main())
