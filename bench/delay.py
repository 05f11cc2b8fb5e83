"""Lateness of delayed jobs: the delay ladder plus the consumer's hold.

For each job, lateness = (when the consumer starts running it) - (its ``due_at``).
Each round publishes jobs at a steady rate, in ticks of ``TICK`` seconds, with delays
drawn uniformly from [min, max] seconds (seeded), to one task of a fresh namespace;
jobs due in ``MAX_HOLD`` or more go through the delay ladder (25 quorum levels),
sooner ones straight to the task queue. The consumer runs in its own process, as a
worker would: aio-pika, manual ack, a prefetch above what the hold keeps in flight;
it decodes each message, holds it ``seconds_until_due`` with ``loop.call_later``,
then records the lateness and acks. Rounds run one after the other in fresh
namespaces; the report gives the median over rounds of each percentile.

    python -m bench.delay --url amqp://guest:guest@localhost:5672/
    python -m bench.delay --quick        # starts a throwaway RabbitMQ node

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import random
import secrets
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import aio_pika
import aio_pika.abc
from pydantic import BaseModel

from bench.publish import Admin, add_url_argument, broker, describe_broker, percentile
from broker_jobs import App, AsyncPublisher, JobRequest, PublishBatchError
from broker_jobs.due import seconds_until_due
from broker_jobs.envelope import Job, decode, utc_now
from broker_jobs.errors import DecodeError
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.worker.delivery import wire_message
from topology import Topology
from topology.delay import DELAY_LEVELS, DELAY_UNIT, EARLY_MARGIN, MAX_DELAY, MAX_HOLD

TASK = "bench.delayed"
PAYLOAD: dict[str, Any] = {"url": "https://example.com/images/123.png", "width": 128}

DEFAULT_SECONDS, DEFAULT_RATE, DEFAULT_MAX_DELAY, DEFAULT_ROUNDS = 20.0, 200.0, 30.0, 3
QUICK_SECONDS, QUICK_RATE, QUICK_MAX_DELAY, QUICK_ROUNDS = 5.0, 50.0, 5.0, 2
MIN_DELAY = 0.1
#: Seconds between publishing ticks: 200 jobs/s is 20 jobs every 100 ms.
TICK = 0.1
#: The consumer's prefetch: at 200 jobs/s about 240 jobs wait out their hold at once.
PREFETCH = 1000
#: After the last publish, every job must be consumed within the longest delay plus this.
DRAIN_MARGIN = 30.0
#: Once every job was consumed, the consumer stays this long to catch duplicates.
DUPLICATE_GRACE = 3.0
#: A hold above MAX_HOLD by more than this counts as an early arrival.
HOLD_TOLERANCE = 0.05
#: Seconds the consumer process has to connect and start consuming.
CONSUMER_START_TIMEOUT = 60.0
#: The warm-up's delayed job: long enough to take the ladder (declared on first use).
WARM_UP_DELAY = 1.5

AIM_P50_MS, AIM_P99_MS = 5.0, 20.0


class Delayed(BaseModel):
    """The benchmark task's payload model."""

    url: str
    width: int


# -- options ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    url: str | None
    seconds: float
    rate: float
    max_delay: float
    rounds: int
    seed: int
    quick: bool

    @property
    def jobs(self) -> int:
        """Jobs published per round."""
        return max(1, round(self.rate * self.seconds))


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.delay", description=__doc__.split("\n\n", 1)[0]
    )
    add_url_argument(parser)
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"publishing time per round ({DEFAULT_SECONDS:g})",
    )
    parser.add_argument("--rate", type=float, default=None, help=f"jobs/s ({DEFAULT_RATE:g})")
    parser.add_argument(
        "--max-delay",
        type=float,
        default=None,
        help=f"delays are uniform in [{MIN_DELAY}, this] s ({DEFAULT_MAX_DELAY:g})",
    )
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds ({DEFAULT_ROUNDS})")
    parser.add_argument("--seed", type=int, default=None, help="RNG seed (default: random)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK_SECONDS:g} s at {QUICK_RATE:g} jobs/s, delays up to"
        f" {QUICK_MAX_DELAY:g} s, {QUICK_ROUNDS} rounds",
    )
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    options = Options(
        url=args.url or None,
        seconds=_pick(args.seconds, QUICK_SECONDS if quick else DEFAULT_SECONDS),
        rate=_pick(args.rate, QUICK_RATE if quick else DEFAULT_RATE),
        max_delay=_pick(args.max_delay, QUICK_MAX_DELAY if quick else DEFAULT_MAX_DELAY),
        rounds=int(_pick(args.rounds, QUICK_ROUNDS if quick else DEFAULT_ROUNDS)),
        seed=args.seed if args.seed is not None else secrets.randbits(32),
        quick=quick,
    )
    if options.seconds <= 0 or options.rate <= 0 or options.rounds < 1:
        parser.error("--seconds, --rate and --rounds must be positive")
    if not MIN_DELAY <= options.max_delay <= MAX_DELAY:
        parser.error(f"--max-delay must be between {MIN_DELAY} and {MAX_DELAY:.0f} s")
    return options


def _pick(given: float | None, default: float) -> float:
    return default if given is None else given


# -- the consumer (its own process) -------------------------------------------------------


class Record(NamedTuple):
    """What the consumer saw of one delivery; seconds throughout."""

    job_id: str
    lateness: float  # run start - due_at
    hold: float  # seconds_until_due on arrival
    timer_late: float  # run start - (arrival + hold): the event loop's own lateness
    hops: int  # sum of the x-death counts: ladder levels passed
    units: int  # whole units routed through the ladder (the routing key's digits)
    ladder_excess: float  # arrival - created_at - units: transit beyond the whole units
    redelivered: bool
    arrived: float  # epoch seconds


def ladder_hops(headers: dict[str, Any]) -> int:
    """Levels passed: the sum of ``count`` over the ``x-death`` entries."""
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return 0
    return sum(int(entry.get("count", 0)) for entry in deaths if isinstance(entry, dict))


def routed_units(routing_key: str | None) -> int:
    """The ladder units spelt by a delayed job's routing key (0 for a direct key)."""
    parts = (routing_key or "").split(".")
    digits = parts[:DELAY_LEVELS]
    if len(parts) <= DELAY_LEVELS or any(digit not in ("0", "1") for digit in digits):
        return 0
    return int("".join(digits), 2)


class HoldingConsumer:
    """The reference consumer: decode, hold until due without blocking, run, ack."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.records: list[Record] = []
        self.errors: list[str] = []
        self._acks: set[asyncio.Task[None]] = set()
        self._seen: set[str] = set()
        self._waiting_for: set[str] | None = None
        self.complete = asyncio.Event()

    async def on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        arrived, arrived_clock = utc_now(), self._loop.time()
        try:
            job = decode(wire_message(message))
        except DecodeError as error:
            self.errors.append(str(error))
            await message.reject(requeue=False)
            return
        hold = seconds_until_due(job, arrived)
        self._loop.call_later(hold, self._run, message, job, arrived, arrived_clock + hold)

    def _run(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        job: Job,
        arrived: datetime,
        planned_clock: float,
    ) -> None:
        ran, ran_clock = utc_now(), self._loop.time()
        due = job.due_at or job.created_at
        headers = dict(message.headers or {})
        units = routed_units(message.routing_key)
        self.records.append(
            Record(
                job_id=job.id,
                lateness=(ran - due).total_seconds(),
                hold=seconds_until_due(job, arrived),
                timer_late=ran_clock - planned_clock,
                hops=ladder_hops(headers),
                units=units,
                ladder_excess=(arrived - job.created_at).total_seconds() - units * DELAY_UNIT,
                redelivered=bool(message.redelivered),
                arrived=arrived.timestamp(),
            )
        )
        self._note(job.id)
        task = self._loop.create_task(message.ack())
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)

    def _note(self, job_id: str) -> None:
        self._seen.add(job_id)
        if self._waiting_for is not None:
            self._waiting_for.discard(job_id)
            if not self._waiting_for:
                self.complete.set()

    def expect(self, job_ids: Sequence[str]) -> None:
        """Set ``complete`` once every one of ``job_ids`` ran."""
        self._waiting_for = set(job_ids) - self._seen
        if not self._waiting_for:
            self.complete.set()

    def report(self) -> dict[str, Any]:
        """Plain data only: it crosses the process boundary as a pickle."""
        return {"records": [tuple(record) for record in self.records], "errors": self.errors}


def consumer_main(url: str, queue: str, pipe: Connection) -> None:
    """The consumer process: say "ready", receive the job ids and a deadline, consume
    until all ran (plus a grace for duplicates) or the deadline, send the records."""
    asyncio.run(_consume(url, queue, pipe))


async def _consume(url: str, queue: str, pipe: Connection) -> None:
    connection = await aio_pika.connect(
        url, client_properties={"connection_name": "bench delay consumer"}
    )
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        consumer = HoldingConsumer()
        source = await channel.get_queue(queue, ensure=False)
        await source.consume(consumer.on_message, no_ack=False)
        pipe.send("ready")
        job_ids, deadline = await asyncio.to_thread(pipe.recv)
        consumer.expect(job_ids)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(consumer.complete.wait(), max(0.0, deadline - time.time()))
        if consumer.complete.is_set():
            await asyncio.sleep(DUPLICATE_GRACE)
    finally:
        await connection.close()
    pipe.send(consumer.report())


class ConsumerProcess:
    """The consumer in a spawned process, so that publishing does not delay its timers."""

    def __init__(self, url: str, queue: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child_end = context.Pipe()
        self._process = context.Process(
            target=consumer_main, args=(url, queue, child_end), name="bench delay consumer"
        )
        self._process.start()
        child_end.close()

    def wait_ready(self) -> None:
        self._receive(CONSUMER_START_TIMEOUT, "did not start consuming")

    def results(self, job_ids: list[str], deadline: float) -> dict[str, Any]:
        """Hand over the jobs to wait for; the records once they all ran (or not)."""
        self._pipe.send((job_ids, deadline))
        timeout = max(0.0, deadline - time.time()) + DUPLICATE_GRACE + 30.0
        report: dict[str, Any] = self._receive(timeout, "sent no results")
        return report

    def _receive(self, timeout: float, failure: str) -> Any:
        try:
            if self._pipe.poll(timeout):
                return self._pipe.recv()
        except EOFError:
            pass
        code = self._process.exitcode
        raise RuntimeError(f"the consumer process {failure} (exit code {code}; see above)")

    def stop(self) -> None:
        self._process.join(10.0)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(5.0)
        self._pipe.close()


# -- publishing ---------------------------------------------------------------------------


@dataclass
class Published:
    job_ids: list[str] = field(default_factory=list)
    warm_up_ids: list[str] = field(default_factory=list)
    failed: int = 0
    confirm_latencies: list[float] = field(default_factory=list)
    tick_lags: list[float] = field(default_factory=list)
    elapsed: float = 0.0


def tick_sizes(total: int, rate: float) -> list[int]:
    """Jobs per tick for a steady ``rate``, ``total`` in all."""
    per_tick = rate * TICK
    ticks = math.ceil(total / per_tick)
    sizes = [round((i + 1) * per_tick) - round(i * per_tick) for i in range(ticks)]
    sizes[-1] -= sum(sizes) - total
    return [size for size in sizes if size > 0]


async def publish_round(url: str, app: App, delays: list[float], rate: float) -> Published:
    async with AsyncPublisher(url, app, connection_name="bench delay publisher") as publisher:
        published = Published()
        # Connect, declare, check the ladder: untimed, like the publish benchmark.
        for delay in (0.0, WARM_UP_DELAY):
            job = await publisher.publish(TASK, PAYLOAD, delay=delay)
            published.warm_up_ids.append(job.id)
        await publish_paced(publisher, delays, rate, published)
        return published


async def publish_paced(
    publisher: AsyncPublisher, delays: list[float], rate: float, published: Published
) -> None:
    """One ``publish_many`` per tick, each started on schedule without waiting for the
    previous tick's confirms."""
    loop = asyncio.get_running_loop()
    start, offset = loop.time(), 0
    ticks: list[asyncio.Task[None]] = []
    for index, size in enumerate(tick_sizes(len(delays), rate)):
        scheduled = start + index * TICK
        await asyncio.sleep(max(0.0, scheduled - loop.time()))
        published.tick_lags.append(loop.time() - scheduled)
        batch = [JobRequest(TASK, PAYLOAD, delay=delay) for delay in delays[offset : offset + size]]
        offset += size
        ticks.append(asyncio.create_task(publish_tick(publisher, batch, published)))
    published.elapsed = loop.time() - start + TICK
    await asyncio.gather(*ticks)


async def publish_tick(
    publisher: AsyncPublisher, batch: list[JobRequest], published: Published
) -> None:
    """Publish one tick's jobs; note the confirmed ids, failures and confirm latencies."""

    def confirmed(job: Job) -> None:
        published.confirm_latencies.append(time.time() - job.created_at.timestamp())

    try:
        jobs = await publisher.publish_many(batch, on_confirmed=confirmed)
    except PublishBatchError as error:
        published.job_ids.extend(error.confirmed)
        published.failed += len(error.failed)
        return
    published.job_ids.extend(job.id for job in jobs)


# -- one round ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """Everything measured in one round."""

    namespace: str
    published: Published
    records: list[Record]
    errors: list[str]
    leftover: int


def fresh_app() -> App:
    app = App(namespace=f"bdelay{secrets.token_hex(4)}")
    app.declare(TASK, Delayed)
    return app


def run_round(options: Options, url: str, admin: Admin, index: int) -> Round:
    app = fresh_app()
    topology = app.topology()  # with the ladder: all of it, to delete afterwards
    delays = draw_delays(options, index)
    try:
        admin.declare(topology)
        consumer = ConsumerProcess(url, app.names.task_queue(TASK))
        try:
            consumer.wait_ready()
            published = asyncio.run(publish_round(url, app, delays, options.rate))
            deadline = time.time() + options.max_delay + DRAIN_MARGIN
            report = consumer.results(published.job_ids + published.warm_up_ids, deadline)
        finally:
            consumer.stop()
        leftover = queued(admin, topology)
    finally:
        admin.delete(topology)
    records = [Record(*values) for values in report["records"]]
    return Round(app.namespace, published, records, list(report["errors"]), leftover)


def draw_delays(options: Options, index: int) -> list[float]:
    """Uniform delays, reproducible from the seed and the round's index."""
    rng = random.Random(options.seed + index)
    return [rng.uniform(MIN_DELAY, options.max_delay) for _ in range(options.jobs)]


def queued(admin: Admin, topology: Topology) -> int:
    """Messages left in the round's queues (ladder, task and dead-letter queues)."""
    return sum(admin.depth(queue.name) for queue in topology.queues)


# -- figures ------------------------------------------------------------------------------


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


@dataclass(frozen=True)
class Figures:
    """One round's figures: milliseconds unless named otherwise."""

    jobs: int
    publish_failed: int
    publish_rate: float
    max_tick_lag_ms: float
    confirm_p50_ms: float
    confirm_p99_ms: float
    consumed: int
    duplicates: int
    missing: int
    unexpected: int
    redelivered: int
    undecodable: int
    leftover: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    min_ms: float
    direct_jobs: int
    direct_p50_ms: float
    direct_p99_ms: float
    direct_transit_p50_ms: float
    direct_transit_p99_ms: float
    ladder_jobs: int
    ladder_p50_ms: float
    ladder_p99_ms: float
    hops_mean: float
    hops_max: int
    hops_unexpected: int
    overshoot_p50_ms: float
    overshoot_max_ms: float
    overshoot_per_hop_ms: float
    overshoot_fixed_ms: float
    ladder_min_hold_ms: float
    arrived_after_due: int
    max_hold_s: float
    holds_over_max: int
    timer_late_p50_ms: float
    timer_late_p99_ms: float


def figures(result: Round) -> Figures:
    published, warm_up = result.published, set(result.published.warm_up_ids)
    expected = set(published.job_ids)
    records = [record for record in result.records if record.job_id not in warm_up]
    counts = Counter(record.job_id for record in records)
    firsts = _first_runs(records)
    lateness = [record.lateness for record in firsts]
    direct_records = [record for record in firsts if record.units == 0]
    direct = [record.lateness for record in direct_records]
    transit = [record.ladder_excess for record in direct_records]
    ladder = [record for record in firsts if record.units > 0]
    overshoot = [record.ladder_excess for record in ladder]
    per_hop, fixed = overshoot_fit(ladder)
    return Figures(
        jobs=len(published.job_ids),
        publish_failed=published.failed,
        publish_rate=round(len(published.job_ids) / published.elapsed, 1),
        max_tick_lag_ms=ms(max(published.tick_lags, default=0.0)),
        confirm_p50_ms=ms(percentile(published.confirm_latencies, 50)),
        confirm_p99_ms=ms(percentile(published.confirm_latencies, 99)),
        consumed=len(counts),
        duplicates=sum(count - 1 for count in counts.values()),
        missing=len(expected - set(counts)),
        unexpected=len(set(counts) - expected),
        redelivered=sum(record.redelivered for record in records),
        undecodable=len(result.errors),
        leftover=result.leftover,
        p50_ms=ms(percentile(lateness, 50)),
        p90_ms=ms(percentile(lateness, 90)),
        p99_ms=ms(percentile(lateness, 99)),
        max_ms=ms(max(lateness, default=math.nan)),
        min_ms=ms(min(lateness, default=math.nan)),
        direct_jobs=len(direct),
        direct_p50_ms=ms(percentile(direct, 50)),
        direct_p99_ms=ms(percentile(direct, 99)),
        direct_transit_p50_ms=ms(percentile(transit, 50)),
        direct_transit_p99_ms=ms(percentile(transit, 99)),
        ladder_jobs=len(ladder),
        ladder_p50_ms=ms(percentile([record.lateness for record in ladder], 50)),
        ladder_p99_ms=ms(percentile([record.lateness for record in ladder], 99)),
        hops_mean=round(statistics.fmean([r.hops for r in firsts]) if firsts else math.nan, 3),
        hops_max=max((record.hops for record in firsts), default=0),
        hops_unexpected=sum(record.hops != record.units.bit_count() for record in firsts),
        overshoot_p50_ms=ms(percentile(overshoot, 50)),
        overshoot_max_ms=ms(max(overshoot, default=math.nan)),
        overshoot_per_hop_ms=ms(per_hop),
        overshoot_fixed_ms=ms(fixed),
        ladder_min_hold_ms=ms(min((record.hold for record in ladder), default=math.nan)),
        arrived_after_due=sum(record.hold <= 0 for record in firsts),
        max_hold_s=round(max((record.hold for record in firsts), default=math.nan), 4),
        holds_over_max=sum(record.hold > MAX_HOLD + HOLD_TOLERANCE for record in firsts),
        timer_late_p50_ms=ms(percentile([record.timer_late for record in firsts], 50)),
        timer_late_p99_ms=ms(percentile([record.timer_late for record in firsts], 99)),
    )


def overshoot_fit(ladder: Sequence[Record]) -> tuple[float, float]:
    """Least squares of the ladder's overshoot on the hops: (seconds per hop, seconds
    of fixed cost: publishing and the last delivery). NaN without two hop counts."""
    hops = [float(record.hops) for record in ladder]
    if len(set(hops)) < 2:
        return math.nan, math.nan
    fit = statistics.linear_regression(hops, [record.ladder_excess for record in ladder])
    return fit.slope, fit.intercept


def _first_runs(records: Sequence[Record]) -> list[Record]:
    """The first run of each job: a duplicate's lateness is not the job's."""
    seen: set[str] = set()
    firsts = []
    for record in records:
        if record.job_id not in seen:
            seen.add(record.job_id)
            firsts.append(record)
    return firsts


def medians(rounds: Sequence[Figures]) -> dict[str, float]:
    table = [asdict(figure) for figure in rounds]
    return {key: round(statistics.median(row[key] for row in table), 3) for key in table[0]}


#: Figures that must be 0 in every round.
MUST_BE_ZERO = (
    "publish_failed",
    "duplicates",
    "missing",
    "unexpected",
    "undecodable",
    "leftover",
    "holds_over_max",
    "hops_unexpected",
)


def problems(rounds: Sequence[Figures]) -> list[str]:
    found = []
    for index, figure in enumerate(rounds, 1):
        for name in MUST_BE_ZERO:
            if value := getattr(figure, name):
                found.append(f"round {index}: {name} = {value}")
    return found


# -- reporting ----------------------------------------------------------------------------


def describe_config(
    options: Options, url: str, node: RabbitNode | None, admin: Admin
) -> dict[str, Any]:
    return {
        **describe_broker(url, node, admin),
        "rate_jobs_per_s": options.rate,
        "seconds": options.seconds,
        "jobs_per_round": options.jobs,
        "delays_s": [MIN_DELAY, options.max_delay],
        "rounds": options.rounds,
        "seed": options.seed,
        "tick_s": TICK,
        "ladder": f"{DELAY_LEVELS} quorum levels, early margin {EARLY_MARGIN} s,"
        f" max hold {MAX_HOLD} s",
        "consumer": f"own process, aio-pika, manual ack, prefetch {PREFETCH}, call_later hold",
        "publisher": "AsyncPublisher.publish_many per tick, ticks overlap",
    }


def print_config(config: dict[str, Any]) -> None:
    print("Delayed delivery benchmark (broker_jobs)")
    for key, value in config.items():
        print(f"  {key:<16} {value}")
    print()


def print_round(index: int, total: int, namespace: str, figure: Figures) -> None:
    print(
        f"  round {index}/{total} ({namespace}): {figure.jobs} jobs at {figure.publish_rate:g}/s;"
        f" lateness p50 {figure.p50_ms:.2f} ms, p90 {figure.p90_ms:.2f}, p99"
        f" {figure.p99_ms:.2f}, max {figure.max_ms:.2f}; hops mean {figure.hops_mean:.2f}"
        f" max {figure.hops_max}; max hold {figure.max_hold_s:.3f} s; duplicates"
        f" {figure.duplicates}, missing {figure.missing}",
        flush=True,
    )


ROWS = (
    ("lateness p50 (ms)", "p50_ms"),
    ("lateness p90 (ms)", "p90_ms"),
    ("lateness p99 (ms)", "p99_ms"),
    ("lateness max (ms)", "max_ms"),
    ("lateness min (ms)", "min_ms"),
    ("direct route p50 (ms)", "direct_p50_ms"),
    ("direct route p99 (ms)", "direct_p99_ms"),
    ("direct: publish to arrival p50 (ms)", "direct_transit_p50_ms"),
    ("direct: publish to arrival p99 (ms)", "direct_transit_p99_ms"),
    ("ladder route p50 (ms)", "ladder_p50_ms"),
    ("ladder route p99 (ms)", "ladder_p99_ms"),
    ("ladder overshoot p50 (ms)", "overshoot_p50_ms"),
    ("ladder overshoot max (ms)", "overshoot_max_ms"),
    ("  fit: per hop (ms)", "overshoot_per_hop_ms"),
    ("  fit: fixed (ms)", "overshoot_fixed_ms"),
    ("ladder jobs' least hold (ms)", "ladder_min_hold_ms"),
    ("consumer timer late p50 (ms)", "timer_late_p50_ms"),
    ("consumer timer late p99 (ms)", "timer_late_p99_ms"),
    ("hops mean", "hops_mean"),
    ("hops max", "hops_max"),
    ("max hold (s)", "max_hold_s"),
    ("arrived after due", "arrived_after_due"),
    ("publish rate (jobs/s)", "publish_rate"),
    ("max publish tick lag (ms)", "max_tick_lag_ms"),
    ("publish confirm p50 (ms)", "confirm_p50_ms"),
    ("publish confirm p99 (ms)", "confirm_p99_ms"),
    ("jobs published", "jobs"),
    ("jobs via ladder", "ladder_jobs"),
    ("jobs direct", "direct_jobs"),
    ("redelivered", "redelivered"),
    *((f"{name} (must be 0)", name) for name in MUST_BE_ZERO),
)


def print_table(rounds: Sequence[Figures], middle: dict[str, float]) -> None:
    print()
    print(f"{'figure':<34} {'median':>10}   per round")
    for label, key in ROWS:
        per_round = ", ".join(f"{getattr(figure, key):g}" for figure in rounds)
        print(f"{label:<34} {middle[key]:>10g}   {per_round}")


def aims(middle: dict[str, float]) -> dict[str, bool]:
    return {
        f"p50 <= {AIM_P50_MS:g} ms": middle["p50_ms"] <= AIM_P50_MS,
        f"p99 <= {AIM_P99_MS:g} ms": middle["p99_ms"] <= AIM_P99_MS,
    }


def print_aims(options: Options, middle: dict[str, float], found: list[str]) -> None:
    print()
    print(
        f"Aim at {options.rate:g} delayed jobs/s, delays {MIN_DELAY}-{options.max_delay:g} s"
        f" (medians over {options.rounds} rounds):"
    )
    values = (middle["p50_ms"], middle["p99_ms"])
    for (label, met), value in zip(aims(middle).items(), values, strict=True):
        print(f"  lateness {label:<14} {value:8.2f} ms  {'met' if met else 'NOT met'}")
    print(f"  max hold <= {MAX_HOLD} s (+{HOLD_TOLERANCE})   {middle['max_hold_s']:8.3f} s")
    for problem in found:
        print(f"FAILED: {problem}")
    if not found:
        print("  every job ran once: no duplicates, none missing, none early beyond the hold")


def summary(
    config: dict[str, Any], rounds: Sequence[Figures], middle: dict[str, float], found: list[str]
) -> dict[str, Any]:
    return {
        "config": config,
        "medians": _json_safe(middle),
        "rounds": [_json_safe(asdict(figure)) for figure in rounds],
        "aims_met": aims(middle),
        "problems": found,
    }


def _json_safe(row: dict[str, Any]) -> dict[str, Any]:
    """NaN (a figure of no jobs) as null: JSON has no NaN."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


# -- main ---------------------------------------------------------------------------------


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    admin = Admin(url)
    try:
        config = describe_config(options, url, node, admin)
        print_config(config)
        rounds = []
        for index in range(options.rounds):
            result = run_round(options, url, admin, index)
            figure = figures(result)
            print_round(index + 1, options.rounds, result.namespace, figure)
            rounds.append(figure)
    finally:
        admin.close()
    middle = medians(rounds)
    found = problems(rounds)
    print_table(rounds, middle)
    print_aims(options, middle, found)
    return summary(config, rounds, middle, found)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    with broker(options.url) as (url, node):
        result = bench(options, url, node)
    print(json.dumps(result, sort_keys=False))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
