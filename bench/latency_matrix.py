"""``python -m bench.latency_matrix``: publish-to-start, each consumer fed by each publisher.

bench.compare's latency gap between broker-jobs and raw aio-pika, split by swapping
the parts instead of capturing packets (which would wake the machine at each one):
each row is a consumer and a publisher, measured as bench.compare measures its latency
row (the consumer started as bench.compare starts it, one confirmed publish every
1/``--rate`` s, the handler's start minus the publish call), in interleaved rounds.

Consumers: the raw aio-pika consumer on a queue of its own or on broker-jobs' queue
(broker-jobs' body is the payload, which it reads the same), and
``broker-jobs worker`` with the sync (1x8) and the async no-op handler. Publishers:

- **raw pika**: bench.compare's raw publisher (default exchange, a bare body);
- **prebuilt**: raw pika publishing broker-jobs' wire messages, each built before the
  clock starts (``JobFactory.build``): the wire format's part, with no client work;
- **Publisher**: ``Publisher.publish``, as bench.compare runs it.

So, medians of the rounds: *raw on bj, prebuilt* minus *raw* is the wire format's part
(topic exchange, headers), *raw on bj, Publisher* minus *raw on bj, prebuilt* the
publisher's, *bj worker, prebuilt* minus *raw on bj, prebuilt* the consumer's, and sync
minus async the hand-over to a handler thread. ``--pinned`` adds the consumers run
under ``taskset -c 0`` (every thread of the process on one CPU).

    python -m bench.latency_matrix --rounds 8
    python -m bench.latency_matrix --rounds 8 --pinned --queue-type quorum
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika

from bench.common import (
    Admin,
    add_number,
    bench_parser,
    describe_broker,
    from_args,
    print_config,
    run_bench,
)
from bench.compare import publish_paced
from bench.figures import round_order
from bench.peers.bj import TASK, BjLane, Seq
from bench.peers.common import (
    PublisherLike,
    Variant,
    WorkerProcess,
    running,
    wait_for_jobs,
)
from bench.peers.raw import RawLane, consumer_process
from broker_jobs.publish.pika_link import pika_properties
from broker_jobs.publish.prepare import JobFactory
from broker_jobs.testing.rabbit_node import RabbitNode

WARMUP_SEQ = 1_000_000
START_TIMEOUT = 60.0
RAW = Variant("raw aio-pika", "raw")
SYNC = Variant("broker-jobs 1x8", "broker-jobs")
ASYNC = Variant("broker-jobs async", "broker-jobs", pool="async")


@dataclass(frozen=True)
class Options:
    url: str | None
    rounds: int
    rate: float
    jobs: int
    queue_type: str
    pinned: bool


@dataclass(frozen=True)
class Row:
    consumer: str  # raw, raw on bj, bj sync, bj async
    publisher: str  # raw pika, prebuilt, Publisher
    pinned: bool = False

    @property
    def name(self) -> str:
        return f"{self.consumer}{' pinned' if self.pinned else ''} <- {self.publisher}"


ROWS = (
    Row("raw", "raw pika"),
    Row("raw on bj", "prebuilt"),
    Row("raw on bj", "Publisher"),
    Row("bj async", "prebuilt"),
    Row("bj async", "Publisher"),
    Row("bj sync", "prebuilt"),
    Row("bj sync", "Publisher"),
)
PINNED_ROWS = (
    Row("raw", "raw pika", pinned=True),
    Row("bj async", "Publisher", pinned=True),
    Row("bj sync", "Publisher", pinned=True),
)


class PrebuiltPublisher:
    """Raw pika (confirms, one publish at a time) sending broker-jobs' wire messages
    built by :meth:`prepare`, before the clock starts."""

    def __init__(self, url: str, lane: BjLane) -> None:
        self._factory = JobFactory(lane.app, None)
        self._connection = pika.BlockingConnection(pika.URLParameters(url))
        self._channel = self._connection.channel()
        self._channel.confirm_delivery()
        self._ready: dict[int, tuple[str, str, bytes, pika.BasicProperties]] = {}

    def prepare(self, seqs: range) -> None:
        for seq in seqs:
            prepared = self._factory.build(TASK, Seq(seq=seq))
            route, message = prepared.route, prepared.message
            properties = pika_properties(message)
            self._ready[seq] = (route.exchange, route.routing_key, message.body, properties)

    def publish(self, seq: int, delay: float | None = None) -> None:
        exchange, routing_key, body, properties = self._ready.pop(seq)
        self._channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)

    def publish_batch(self, seqs: range) -> None:
        raise NotImplementedError("the prebuilt publisher publishes one at a time")

    def close(self) -> None:
        self._connection.close()


@dataclass
class Lanes:
    raw: RawLane
    bj: BjLane
    workdir: Path

    def consumer(self, row: Row) -> WorkerProcess:
        if row.consumer == "raw":
            worker = self.raw.worker(RAW, self.workdir)
        elif row.consumer == "raw on bj":
            worker = consumer_process("raw on bj", self.bj.url, self.bj.queue, self.workdir)
        else:
            worker = self.bj.worker(SYNC if row.consumer == "bj sync" else ASYNC, self.workdir)
        if row.pinned:
            argv = ["taskset", "-c", "0", *worker.argv]
            worker = WorkerProcess(f"{worker.name} pinned", argv, self.workdir, worker.env)
        return worker

    def publisher(self, row: Row) -> PublisherLike:
        if row.publisher == "raw pika":
            return self.raw.publisher()
        if row.publisher == "Publisher":
            return self.bj.publisher()
        return PrebuiltPublisher(self.bj.url, self.bj)


def prepare(publisher: PublisherLike, seqs: range) -> None:
    """The messages of ``seqs`` built now, where the publisher sends prebuilt ones."""
    if isinstance(publisher, PrebuiltPublisher):
        publisher.prepare(seqs)


def one_run(lanes: Lanes, row: Row, seqs: range, rate: float) -> float:
    """The row's publish-to-start p50 (ms) over ``seqs``."""
    worker = lanes.consumer(row)
    publisher = lanes.publisher(row)
    try:
        with running(worker) as reader:
            warmup = range(WARMUP_SEQ + seqs.start, WARMUP_SEQ + seqs.start + 1)
            prepare(publisher, warmup)
            publisher.publish(warmup.start)  # connected, and the consumer consumes
            if not wait_for_jobs(reader, warmup, worker, START_TIMEOUT):
                raise SystemExit(f"{row.name}: the consumer took no job in {START_TIMEOUT:g} s")
            prepare(publisher, seqs)
            sent = publish_paced(publisher, seqs, rate, None)
            if not wait_for_jobs(reader, seqs, worker, START_TIMEOUT):
                raise SystemExit(f"{row.name}: {reader.found} of {len(seqs)} jobs started")
            return statistics.median((reader.starts[seq] - sent[seq]) * 1000 for seq in seqs)
    finally:
        publisher.close()


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    rows = [*ROWS, *(PINNED_ROWS if options.pinned else ())]
    with Admin(url) as admin:
        config = describe_broker(url, node, admin)
    config.update(
        rounds=options.rounds, jobs=options.jobs, rate=f"{options.rate:g} jobs/s",
        queue_type=options.queue_type, rows=", ".join(row.name for row in rows),
    )  # fmt: skip
    print_config("Publish-to-start p50, consumers x publishers", config, 12)
    found: dict[Row, list[float]] = {row: [] for row in rows}
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as workdir:
        lanes = Lanes(
            RawLane(url, options.queue_type), BjLane(url, options.queue_type), Path(workdir)
        )
        try:
            next_seq = 0
            for index in range(options.rounds):
                for row in round_order(rows, index):
                    seqs = range(next_seq, next_seq + options.jobs)
                    next_seq += options.jobs
                    found[row].append(one_run(lanes, row, seqs, options.rate))
                    print(f"round {index + 1} {row.name:<34} p50 {found[row][-1]:.3f} ms")
        finally:
            lanes.bj.cleanup()
            lanes.raw.cleanup()
    return {"config": config, **report(found)}


def report(found: dict[Row, list[float]]) -> dict[str, Any]:
    medians = {row: statistics.median(values) for row, values in found.items()}
    base = medians[ROWS[0]]
    print(f"\nmedians of the rounds (ms), and their difference to {ROWS[0].name}:")
    for row, values in found.items():
        rounds = ", ".join(f"{value:.2f}" for value in values)
        print(f"  {row.name:<34} {medians[row]:.3f}  {medians[row] - base:+.3f}  ({rounds})")
    return {
        "median_ms": {row.name: round(value, 4) for row, value in medians.items()},
        "rounds_ms": {
            row.name: [round(value, 4) for value in values] for row, values in found.items()
        },
    }


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("latency_matrix", __doc__)
    add_number(parser, "--rounds", int, 6, "rounds (each row once per round)")
    add_number(parser, "--rate", float, 200, "jobs/s")
    add_number(parser, "--jobs", int, 1000, "jobs per row and round")
    parser.add_argument("--queue-type", default="classic", choices=("classic", "quorum"))
    parser.add_argument(
        "--pinned", action="store_true", help="add the consumers pinned to CPU 0 (taskset)"
    )
    options = from_args(Options, parser.parse_args(argv))
    if options.rounds < 1 or options.jobs < 1 or options.rate <= 0:
        parser.error("--rounds and --jobs must be at least 1, --rate positive")
    if options.pinned and shutil.which("taskset") is None:
        parser.error("--pinned needs taskset (Debian's util-linux)")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    return run_bench(parse_args(argv), bench)


if __name__ == "__main__":
    sys.exit(main())
