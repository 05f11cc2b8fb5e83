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

import asyncio
import functools
import json
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import aio_pika
import aio_pika.abc
import pika
import pika.exceptions
from pydantic import BaseModel

from bench.common import (
    Admin,
    add_number,
    bench_parser,
    describe_broker,
    measure_on_broker,
    print_config,
)
from bench.figures import round_order
from broker_jobs import App, AsyncPublisher, JobRequest, Publisher
from broker_jobs.store import SQLiteStore, Store
from broker_jobs.testing.rabbit_node import RabbitNode
from topology import Topology
from topology import names as n

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


# -- options ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    url: str | None
    jobs: int
    rounds: int
    quick: bool


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("publish", __doc__)
    add_number(parser, "--jobs", int, DEFAULT_JOBS, "jobs per round", later=True)
    add_number(parser, "--rounds", int, DEFAULT_ROUNDS, "rounds", later=True)
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke run: {QUICK_JOBS} jobs, {QUICK_ROUNDS} rounds"
    )
    args = parser.parse_args(argv)
    jobs = args.jobs or (QUICK_JOBS if args.quick else DEFAULT_JOBS)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    if jobs < 1 or rounds < 1:
        parser.error("--jobs and --rounds must be positive")
    return Options(url=args.url or None, jobs=jobs, rounds=rounds, quick=args.quick)


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
        # A job without a key: its other headers are at their default, left out.
        "headers": {
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
        title = "Publish benchmark (broker_jobs)"
        print_config(title, {**config, "namespace": target.app.namespace}, 15)
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
    measure_on_broker(options.url, functools.partial(bench, options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
