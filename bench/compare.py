"""broker-jobs next to raw aio-pika/pika, Celery and Dramatiq, on the same broker and run.

Every peer at its documented settings for throughput (bench/peers/*: each says which),
on classic and on quorum queues, workload by workload:

- **publish**: N confirmed publishes one by one (no worker running), and batched where
  the peer has a batched confirm;
- **consume**: N jobs published first, then the worker process starts; jobs/s from the
  first job's start to the N-th's (every peer's no-op handler writes one record line);
- **latency**: the worker running, one confirmed publish every 1/rate s; publish call
  to the handler's start, p50/p99;
- **delay**: jobs published with a 2 s delay; the handler's start minus (publish + 2 s);
- **drain**: the worker running while the publisher publishes N jobs one by one:
  seconds from the first publish to the N-th job's start, and the publisher's rate
  (next to its rate without a worker: the publish workload);
- **rss**: the worker process tree's VmRSS after ``--rss-jobs`` jobs (once per peer,
  classic queues: the only kind every peer declares).

Rounds interleave the peers (each rotation forward, then backward in the next round: over
an even number of rounds two peers run in each order equally often); the report gives
medians over rounds of each figure and of its ratio to raw in the same round, writes
docs/benchmarks.md with a plot per figure, and prints one JSON object last.

    python -m bench.compare --quick                  # starts a throwaway RabbitMQ node
    python -m bench.compare --url amqp://guest:guest@localhost:5672/ --only consume,drain
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bench.common import REPO, Admin, bench_parser, broker, throwaway_postgres
from bench.comparison import (
    DEFAULT_JOBS,
    DEFAULT_ROUNDS,
    DEFAULT_RSS_JOBS,
    FIGURES,
    QUEUE_TYPES,
    RAW_PUBLISHER,
    WORKLOADS,
    Options,
    Peer,
    Results,
)
from bench.figures import percentile, round_order
from bench.peers import bj, celery_peer, raw
from bench.peers.common import (
    Lane,
    PublisherLike,
    RecordReader,
    Variant,
    WorkerProcess,
    running,
    wait_for_jobs,
)
from bench.workers import worker_has_option
from broker_jobs import mask_url
from broker_jobs.testing.postgres_node import PostgresNode

QUICK_JOBS, QUICK_ROUNDS, QUICK_RSS_JOBS = 400, 2, 2_000
DEFAULT_RATE, DEFAULT_SECONDS = 200.0, 5.0
DELAY_S, DELAY_RATE, DELAY_JOBS = 2.0, 50.0, 150
#: Seq numbers of each phase, so that one worker's record file tells them apart.
LATENCY_BASE, DELAY_BASE, DRAIN_BASE = 10_000_000, 20_000_000, 30_000_000
WARMUP_SEQ = -1
FILL_TIMEOUT, IDLE_TIMEOUT = 300.0, 60.0

# -- options ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("compare", __doc__)
    parser.add_argument("--jobs", type=int, help=f"jobs per workload ({DEFAULT_JOBS:,})")
    parser.add_argument("--rounds", type=int, help=f"rounds ({DEFAULT_ROUNDS})")
    parser.add_argument("--rss-jobs", type=int, help=f"jobs before RSS ({DEFAULT_RSS_JOBS:,})")
    parser.add_argument("--queue-type", choices=(*QUEUE_TYPES, "both"), default="both")
    parser.add_argument(
        "--only", default=",".join(WORKLOADS), help=f"workloads, comma-separated: {WORKLOADS}"
    )
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="latency jobs/s (200)")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="latency s (5)")
    parser.add_argument(
        "--output",
        type=Path,
        help="the page (default: docs/benchmarks.md for a full run at the defaults,"
        " bench/out/benchmarks.md for any other)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: small and 2 rounds")
    parser.add_argument(
        "--peers",
        default=",".join(PEER_NAMES),
        help=f"peers, comma-separated (raw is always run): {PEER_NAMES}",
    )
    args = parser.parse_args(argv)
    peers = tuple(p.strip() for p in args.peers.split(",") if p.strip())
    if set(peers) - set(PEER_NAMES):
        parser.error(f"--peers takes some of {', '.join(PEER_NAMES)}")
    only = tuple(w.strip() for w in args.only.split(",") if w.strip())
    if not only or set(only) - set(WORKLOADS):
        parser.error(f"--only takes some of {', '.join(WORKLOADS)}")
    jobs = args.jobs or (QUICK_JOBS if args.quick else DEFAULT_JOBS)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    rss_jobs = args.rss_jobs or (QUICK_RSS_JOBS if args.quick else DEFAULT_RSS_JOBS)
    seconds = min(args.seconds, 2.0) if args.quick else args.seconds
    if min(jobs, rounds, rss_jobs) < 2 or args.rate <= 0 or seconds <= 0:
        parser.error("--jobs, --rounds, --rss-jobs must be at least 2; --rate, --seconds > 0")
    shown = [a if "://" not in a else mask_url(a) for a in (argv or sys.argv[1:])]
    return Options(
        url=args.url or None,
        jobs=jobs,
        rounds=rounds,
        queue_types=QUEUE_TYPES if args.queue_type == "both" else (args.queue_type,),
        only=tuple(w for w in WORKLOADS if w in only),
        rss_jobs=rss_jobs,
        rate=args.rate,
        seconds=seconds,
        output=args.output or default_output(args, only, peers),
        quick=args.quick,
        command=" ".join(["python -m bench.compare", *shown]),
        peers=tuple(name for name in PEER_NAMES if name in {raw.NAME, *peers}),
    )


def default_output(args: argparse.Namespace, only: Sequence[str], peers: Sequence[str]) -> Path:
    """docs/benchmarks.md is the full run's page (issue 27 judges it): only a run of
    every workload, peer and queue type at the default size writes it by default. A
    partial or quick run (``--only latency``...) goes to bench/out/, which git
    ignores, so that it cannot replace the page by accident."""
    full = (
        set(only) == set(WORKLOADS)
        and set(peers) >= set(PEER_NAMES) - {raw.NAME}
        and args.queue_type == "both"
        and not args.quick
        and args.jobs in {None, DEFAULT_JOBS}
        and args.rounds in {None, DEFAULT_ROUNDS}
    )
    return REPO / ("docs" if full else "bench/out") / "benchmarks.md"


#: The peers' family names, in a round's order before its rotation.
PEER_NAMES = ("raw", "broker-jobs", "celery", "dramatiq")


# -- the peers ------------------------------------------------------------------------------


def make_peers(postgres_dsn: str | None) -> list[Peer]:
    """raw, broker-jobs, Celery, Dramatiq: the order of a round before its rotation."""
    from bench.peers import dramatiq_app  # noqa: PLC0415 - imports dramatiq: bench extra

    bj_variants = bj.variants()
    if postgres_dsn is None:
        bj_variants = tuple(v for v in bj_variants if v.store != "postgresql")
    return [
        Peer(raw.RawFamily(), raw.VARIANTS, RAW_PUBLISHER),
        Peer(bj.BjFamily(postgres_dsn), bj_variants, "broker-jobs"),
        Peer(celery_peer.CeleryFamily(), celery_peer.VARIANTS, "celery"),
        Peer(dramatiq_app.DramatiqFamily(), dramatiq_app.VARIANTS, "dramatiq"),
    ]


# -- results ---------------------------------------------------------------------------------


# -- measuring -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRun:
    """One running worker of one round: what its phases share."""

    peer: Peer
    variant: Variant
    lane: Lane
    worker: WorkerProcess
    reader: RecordReader
    queue_type: str
    index: int

    def wait(self, seqs: range, timeout: float, phase: str) -> list[float]:
        """Every job's start, in seq order, once all of ``seqs`` started."""
        if not wait_for_jobs(self.reader, seqs, self.worker, timeout):
            raise RuntimeError(
                f"{phase}: {self.reader.found} of {len(seqs)} jobs started after {timeout:g} s"
            )
        return self.reader.among(seqs)


@dataclass
class Bench:
    options: Options
    url: str
    workdir: Path
    results: Results = field(default_factory=Results)

    def wants(self, workload: str) -> bool:
        return workload in self.options.only

    # -- publish (no worker)

    def measure_publish(self, peer: Peer, queue_type: str, index: int) -> str:
        lane = peer.family.lane(self.url, queue_type)
        jobs, row = self.options.jobs, peer.publisher_row
        publisher = lane.publisher()
        try:
            publisher.publish(WARMUP_SEQ)  # connects and declares: not timed
            purge(self.url, lane.queue)
            single = timed_rate(jobs, lambda: publish_each(publisher, range(jobs)))
            self.results.add("publish single", queue_type, row, index, single)
            purge(self.url, lane.queue)
            line = f"{row} single {single:,.0f}/s"
            if peer.family.batch_na is None:
                batched = timed_rate(jobs, lambda: publisher.publish_batch(range(jobs)))
                self.results.add("publish batched", queue_type, row, index, batched)
                line += f", batched {batched:,.0f}/s"
            else:
                self.results.not_applicable(
                    "publish batched", queue_type, row, peer.family.batch_na
                )
        finally:
            publisher.close()
            lane.cleanup()
        return line

    # -- a worker: consume, then latency, delay and drain on the same running worker

    def measure_worker(self, peer: Peer, variant: Variant, queue_type: str, index: int) -> str:
        lane = peer.family.lane(self.url, queue_type)
        try:
            consume = self.wants("consume")
            if consume:
                fill(self.url, lane, range(self.options.jobs))
            elif variant.consume_only:
                return ""
            worker = lane.worker(variant, self.workdir)
            with running(worker) as reader:
                run = WorkerRun(peer, variant, lane, worker, reader, queue_type, index)
                parts = [variant.name]
                if consume:
                    parts.append(self.consume(run))
                if not variant.consume_only:
                    parts += self.live_phases(run)
                if reader.duplicates:
                    self.results.warnings.append(
                        f"round {index + 1} {queue_type} {variant.name}:"
                        f" {reader.duplicates} jobs started twice"
                    )
        finally:
            lane.cleanup()
        return " ".join(parts)

    def add(self, run: WorkerRun, figure: str, value: float) -> None:
        self.results.add(figure, run.queue_type, run.variant.name, run.index, value)

    def consume(self, run: WorkerRun) -> str:
        seqs = range(self.options.jobs)
        starts = run.wait(seqs, drain_timeout(len(seqs)), "consume")
        rate = (len(starts) - 1) / (max(starts) - min(starts))
        self.add(run, "consume", rate)
        return f"consume {rate:,.0f}/s"

    def live_phases(self, run: WorkerRun) -> list[str]:
        """With the worker running: latency, delay, drain with a live publisher."""
        parts: list[str] = []
        publisher = run.lane.publisher()
        try:
            publisher.publish(WARMUP_SEQ)  # connected, and the worker is ready
            run.wait(range(WARMUP_SEQ, WARMUP_SEQ + 1), IDLE_TIMEOUT, "warm-up")
            if self.wants("latency"):
                parts.append(self.latency(run, publisher))
            if self.wants("delay"):
                parts.append(self.delay(run, publisher))
            if self.wants("drain"):
                parts.append(self.drain(run, publisher))
        finally:
            publisher.close()
        return parts

    def latency(self, run: WorkerRun, publisher: PublisherLike) -> str:
        count = max(2, round(self.options.rate * self.options.seconds))
        seqs = range(LATENCY_BASE, LATENCY_BASE + count)
        sent = publish_paced(publisher, seqs, self.options.rate, None)
        starts = run.wait(seqs, IDLE_TIMEOUT, "latency")
        found = [(start - sent[seq]) * 1000 for seq, start in zip(seqs, starts, strict=True)]
        p50, p99 = percentile(found, 50), percentile(found, 99)
        self.add(run, "latency p50", p50)
        self.add(run, "latency p99", p99)
        return f"latency p50 {p50:.2f} p99 {p99:.2f} ms"

    def delay(self, run: WorkerRun, publisher: PublisherLike) -> str:
        if (why := run.peer.family.delay_na) is not None:
            for figure in ("delay lateness p50", "delay lateness p99"):
                self.results.not_applicable(figure, run.queue_type, run.variant.name, why)
            return "delay n/a"
        seqs = range(DELAY_BASE, DELAY_BASE + DELAY_JOBS)
        sent = publish_paced(publisher, seqs, DELAY_RATE, DELAY_S)
        starts = run.wait(seqs, IDLE_TIMEOUT + DELAY_S, "delay")
        late = [
            (start - sent[seq] - DELAY_S) * 1000 for seq, start in zip(seqs, starts, strict=True)
        ]
        p50, p99 = percentile(late, 50), percentile(late, 99)
        self.add(run, "delay lateness p50", p50)
        self.add(run, "delay lateness p99", p99)
        return f"delay late p50 {p50:.1f} p99 {p99:.1f} ms"

    def drain(self, run: WorkerRun, publisher: PublisherLike) -> str:
        seqs = range(DRAIN_BASE, DRAIN_BASE + self.options.jobs)
        began_wall, began = time.time(), time.perf_counter()
        publish_each(publisher, seqs)
        rate = len(seqs) / (time.perf_counter() - began)
        total = max(run.wait(seqs, drain_timeout(len(seqs)), "drain")) - began_wall
        self.add(run, "drain total", total)
        self.add(run, "drain: publisher with worker", rate)
        return f"drain {total:.2f} s (publisher {rate:,.0f}/s)"

    # -- memory after many jobs

    def measure_rss(self, peer: Peer, variant: Variant, queue_type: str) -> str:
        lane = peer.family.lane(self.url, queue_type)
        try:
            seqs = range(self.options.rss_jobs)
            fill(self.url, lane, seqs)
            worker = lane.worker(variant, self.workdir)
            with running(worker) as reader:
                if not wait_for_jobs(reader, seqs, worker, drain_timeout(len(seqs))):
                    raise RuntimeError(f"rss: {reader.found} of {len(seqs)} jobs started")
                time.sleep(0.5)  # the last acks and outcomes: what they hold counts too
                megabytes = worker.rss_bytes() / 2**20
        finally:
            lane.cleanup()
        self.results.add("rss", queue_type, variant.name, 0, megabytes)
        return f"{variant.name} {megabytes:.1f} MB"


def drain_timeout(jobs: int) -> float:
    return max(IDLE_TIMEOUT, jobs / 50)


def timed_rate(jobs: int, work: Any) -> float:
    began = time.perf_counter()
    work()
    return jobs / (time.perf_counter() - began)


def publish_each(publisher: PublisherLike, seqs: range) -> None:
    publish = publisher.publish
    for seq in seqs:
        publish(seq)


def publish_paced(
    publisher: PublisherLike, seqs: range, rate: float, delay: float | None
) -> dict[int, float]:
    """One publish every 1/rate s on schedule; each job's wall time just before its call."""
    sent: dict[int, float] = {}
    began = time.perf_counter()
    for offset, seq in enumerate(seqs):
        wait = began + offset / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        sent[seq] = time.time()
        publisher.publish(seq, delay)
    return sent


def purge(url: str, queue: str) -> None:
    admin = Admin(url)
    try:
        admin.purge(queue)
    finally:
        admin.close()


def fill(url: str, lane: Lane, seqs: range) -> None:
    """The peer's fast way to put these jobs in its queue; until the queue holds them."""
    lane.fill(seqs)
    admin = Admin(url)
    try:
        deadline = time.monotonic() + FILL_TIMEOUT
        while (depth := admin.depth(lane.queue)) < len(seqs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{lane.queue} holds {depth} of {len(seqs)} jobs")
            time.sleep(0.02)
    finally:
        admin.close()


# -- the run ---------------------------------------------------------------------------------


def run_rounds(bench: Bench, peers: Sequence[Peer]) -> None:
    options = bench.options
    for index in range(options.rounds):
        for queue_type in options.queue_types:
            print(f"  round {index + 1}/{options.rounds}, {queue_type}:", flush=True)
            for peer in round_order(peers, index):
                for line in run_peer(bench, peer, queue_type, index):
                    print(f"    {line}", flush=True)
    if bench.wants("rss"):
        run_rss(bench, peers)


def run_rss(bench: Bench, peers: Sequence[Peer]) -> None:
    """Once per worker row, on classic queues when measured (every peer has them)."""
    options = bench.options
    queue_type = "classic" if "classic" in options.queue_types else options.queue_types[0]
    print(f"  rss after {options.rss_jobs:,} jobs, {queue_type}:", flush=True)
    for peer in peers:
        if why := peer.family.queue_type_na(queue_type):
            for variant in peer.variants:
                bench.results.not_applicable("rss", queue_type, variant.name, why)
            continue
        for variant in peer.variants:
            if variant.consume_only:
                continue
            line = guarded(
                bench,
                "rss",
                variant.name,
                queue_type,
                0,
                work=lambda p=peer, v=variant: bench.measure_rss(p, v, queue_type),
            )
            print(f"    {line}", flush=True)


def run_peer(bench: Bench, peer: Peer, queue_type: str, index: int) -> Iterator[str]:
    if why := peer.family.queue_type_na(queue_type):
        mark_not_applicable(bench, peer, queue_type, why)
        yield f"{peer.family.name}: {why}"
        return
    if bench.wants("publish"):
        yield guarded(
            bench,
            "publish",
            peer.publisher_row,
            queue_type,
            index,
            work=lambda: bench.measure_publish(peer, queue_type, index),
        )
    if not set(bench.options.only) - {"publish", "rss"}:
        return
    for variant in peer.variants:
        yield guarded(
            bench,
            "worker",
            variant.name,
            queue_type,
            index,
            work=lambda v=variant: bench.measure_worker(peer, v, queue_type, index),
        )


def guarded(bench: Bench, what: str, row: str, queue_type: str, index: int, *, work: Any) -> str:
    """A failed measurement is a WARNING and an empty cell, not the end of the run."""
    try:
        return str(work())
    except Exception as exc:  # reported: the other peers go on
        message = f"round {index + 1} {queue_type} {row} {what}: {type(exc).__name__}: {exc}"
        bench.results.warnings.append(message.splitlines()[0])
        return f"FAILED {message}"


def mark_not_applicable(bench: Bench, peer: Peer, queue_type: str, why: str) -> None:
    for figure, (_unit, _more, kind) in FIGURES.items():
        if figure == "rss":  # measured once, on classic queues: run_rss says n/a itself
            continue
        if kind == "publisher":
            bench.results.not_applicable(figure, queue_type, peer.publisher_row, why)
        else:
            for variant in peer.variants:
                if figure == "consume" or not variant.consume_only:
                    bench.results.not_applicable(figure, queue_type, variant.name, why)


@contextlib.contextmanager
def postgres(needed: bool) -> Iterator[str | None]:
    """A throwaway PostgreSQL for the ledger row, if one can be started."""
    if not needed or not PostgresNode.available():
        yield None
        return
    with throwaway_postgres() as node:
        yield node.dsn


# -- describing the run --------------------------------------------------------------------


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    with contextlib.suppress(OSError, IndexError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    return {"cpus": os.cpu_count(), "cpu_model": model, "ram": memory, "load_avg": load()}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def versions(rabbitmq: str) -> dict[str, str]:
    return {
        "rabbitmq": rabbitmq,
        "python": platform.python_version(),
        **{
            name: package_version(name)
            for name in ("pika", "aio-pika", "celery", "kombu", "dramatiq", "broker-jobs")
        },
    }


def describe(options: Options, url: str, node: Any, postgres_dsn: str | None) -> dict[str, Any]:
    admin = Admin(url)
    try:
        rabbitmq = admin.server_version() or (node.server_version() if node else "unknown")
    finally:
        admin.close()
    return {
        "command": options.command,
        "broker": mask_url(url),
        "broker_origin": "throwaway node" if node is not None else "given",
        "machine": machine(),
        "versions": versions(str(rabbitmq)),
        "jobs": options.jobs,
        "rounds": options.rounds,
        "rss_jobs": options.rss_jobs,
        "queue_types": list(options.queue_types),
        "workloads": list(options.only),
        "latency": f"{options.rate:g} jobs/s for {options.seconds:g} s, one confirmed publish each",
        "delay": f"{DELAY_JOBS} jobs at {DELAY_RATE:g}/s, each delayed {DELAY_S:g} s",
        "postgresql": "throwaway cluster (fsync off)" if postgres_dsn else "not available",
        "processes_option": worker_has_option("--processes"),
    }


def print_config(config: dict[str, Any], peers: Sequence[Peer]) -> None:
    print("Comparison: raw, broker-jobs, Celery, Dramatiq (bench.compare)")
    for key, value in config.items():
        print(f"  {key:<16} {value}")
    for peer in peers:
        for workload, setting in peer.family.settings().items():
            print(f"  {peer.family.name:<12} {workload:<8} {setting}")
    print(f"  rows           {', '.join(v.name for p in peers for v in p.variants)}")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    began = time.monotonic()
    from bench.peers.report import report  # noqa: PLC0415 - matplotlib: bench extra

    needs_postgres = "consume" in options.only
    with (
        broker(options.url) as (url, node),
        postgres(needs_postgres) as postgres_dsn,
        tempfile.TemporaryDirectory(prefix="bcmp") as directory,
    ):
        peers = [p for p in make_peers(postgres_dsn) if p.family.name in options.peers]
        config = describe(options, url, node, postgres_dsn)
        print_config(config, peers)
        bench = Bench(options, url, Path(directory))
        delayed_existed = celery_peer.delayed_delivery_existed(url)
        try:
            run_rounds(bench, peers)
        finally:
            if not delayed_existed:  # Celery declared them for this run's quorum queues
                celery_peer.delete_delayed_delivery(url)
    config["machine"]["load_avg_end"] = load()
    config["elapsed_min"] = round((time.monotonic() - began) / 60, 1)
    summary = report(options, config, peers, bench.results)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
