"""``python -m bench.heartbeat_cost``: what a worker's heartbeat and its pause checks
cost per job.

Every worker writes a heartbeat to its ledger and reads the paused tasks and stop
requests from it every ``WorkerSettings.heartbeat_every`` seconds (5 s by default).
This drains ``--jobs`` no-op jobs with the worker of ``bench.throughput`` (in process,
burst mode, a sync handler) on an SQLite and a memory ledger, three ways side by side
in interleaved rounds: **shipped** (the default period: heartbeats and control reads
on), **off** (3600 s: the heartbeat and the control read every worker makes at its
start, the last heartbeat at its exit, none in between) and **short** (``--short``,
0.2 s: 25 times as many as shipped, to show that the cost follows time, not jobs).
Figures: jobs/s (the throughput bench's drain: worker start to the last success
recorded), the process's CPU per 1,000 jobs (``time.process_time`` around the drain:
the worker's loop, store thread and handler threads; nothing else runs in it
meanwhile), the heartbeats written and control reads made (counted by the store), and
each variant's ratio to **off** on the same ledger. Then, timed alone: what each job
does for them (three ``task in runner.paused`` checks, the running-jobs set's add and
discard) and one period's ledger work (a heartbeat and a control read).

The default 40,000 jobs make a drain last ~10 s at ~4,000 jobs/s, so that the shipped
period comes round during it (a 10,000-job drain ends before the first one).

    python -m bench.heartbeat_cost                     # 40,000 jobs, 5 rounds, ~7 min
    python -m bench.heartbeat_cost --jobs 1000 --rounds 1 --stores memory   # a smoke run

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.common import (
    Admin,
    add_number,
    bench_parser,
    describe_broker,
    measure_workers_on_broker,
    print_config,
)
from bench.figures import round_order, spread
from bench.throughput.handlers import (
    TASK,
    Settled,
    Target,
    TimedMemoryStore,
    TimedSQLiteStore,
)
from bench.throughput.options import Options as ThroughputOptions
from bench.throughput.rounds import prepublish
from bench.throughput.variants import WorkerVariant
from broker_jobs.observe.heartbeat import HEARTBEAT_EVERY, Heartbeat, Pulse, process_record
from broker_jobs.store import MemoryStore, SQLiteStore, Store
from broker_jobs.store.controls import TaskPause
from broker_jobs.store.processes import ProcessKind, ProcessRecord
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.worker import WorkerSettings

STORES = ("sqlite", "memory")
#: Seconds between heartbeats (and control reads) in the "off" variant: none during a drain.
OFF_EVERY = 3600.0
SHORT_EVERY = 0.2


class CountsControls(Store):
    """A store that counts the heartbeats written to it and the pause reads."""

    beats = 0
    reads = 0

    def record_process(self, record: ProcessRecord) -> None:
        self.beats += 1
        super().record_process(record)  # type: ignore[safe-super]  # a store's, by the MRO

    def pauses(self, namespace: str) -> dict[str, TaskPause]:
        self.reads += 1
        return super().pauses(namespace)  # type: ignore[safe-super]


class CountedSQLiteStore(CountsControls, TimedSQLiteStore):
    pass


class CountedMemoryStore(CountsControls, TimedMemoryStore):
    pass


class PacedWorker(WorkerVariant):
    """``bench.throughput``'s sync worker with ``heartbeat_every`` set to ``every``,
    on a store that counts its heartbeats and pause reads."""

    def __init__(self, name: str, memory: bool, every: float) -> None:
        super().__init__(name, TASK, memory)
        self.every = every
        self._counted: CountsControls = CountedMemoryStore(Settled())

    def _store(self, directory: str, settled: Settled) -> Store:
        store: CountsControls
        if self._memory:
            store = CountedMemoryStore(settled)
        else:
            store = CountedSQLiteStore(Path(directory) / "store.sqlite3", settled)
        self._counted = store
        return store

    def _settings(self, target: Target, burst: bool) -> WorkerSettings:
        return replace(super()._settings(target, burst), heartbeat_every=self.every)

    def counts(self) -> tuple[int, int]:
        """The last drain's heartbeats written and pause reads."""
        return self._counted.beats, self._counted.reads


@dataclass(frozen=True)
class Options:
    url: str | None
    jobs: int
    rounds: int
    concurrency: int
    stores: tuple[str, ...]
    short: float


def make_variants(options: Options) -> list[PacedWorker]:
    periods = (
        ("shipped", HEARTBEAT_EVERY),
        ("off", OFF_EVERY),
        ("short", options.short),
    )
    return [
        PacedWorker(f"{store} {label} ({every:g} s)", store == "memory", every)
        for store in options.stores
        for label, every in periods
    ]


@dataclass
class Figures:
    rates: list[float]
    cpu_per_1000: list[float]  # CPU seconds of the process per 1,000 jobs
    beats: list[int]
    reads: list[int]


def drain(
    variant: PacedWorker, target: Target, admin: Admin, runner: asyncio.Runner
) -> tuple[float, float, int, int, str | None]:
    """One drain of ``jobs`` pre-published jobs: jobs/s, CPU s per 1,000 jobs, the
    heartbeats and control reads, and what went wrong (None: nothing)."""
    jobs = target.options.jobs
    queue = target.queue(variant.task)
    admin.purge(queue)
    prepublish(target, variant.task)
    cpu = time.process_time()
    drained = runner.run(variant.drain(target))
    cpu = time.process_time() - cpu
    left = admin.depth(queue)
    beats, reads = variant.counts()
    wrong = None
    if drained.outcomes != {"succeeded": jobs} or left:
        wrong = f"{variant.name}: outcomes {drained.outcomes}, {left} left in the queue"
    return drained.rate, cpu * 1000 / jobs, beats, reads, wrong


def per_job_checks_ns() -> float:
    """Nanoseconds of what a fast-path job does for pauses and heartbeats: ``task in
    runner.paused`` three times (delivery, claim, handler thread) and the observer's
    running set's add and discard (read by the heartbeat), timed alone."""
    names = {"task": TASK, "paused": frozenset[str](), "running": set[object](), "run": object()}
    statement = (
        "task in paused; task in paused; task in paused; running.add(run); running.discard(run)"
    )
    number = 1_000_000
    best = min(timeit.repeat(statement, globals=names, number=number, repeat=5))
    empty = min(timeit.repeat("pass", number=number, repeat=5))
    return (best - empty) / number * 1e9


def period_cost_us(kind: str, calls: int = 300) -> float:
    """Microseconds of CPU of one heartbeat period's ledger work, timed alone on a
    fresh ``kind`` ledger: the heartbeat's write (:meth:`Heartbeat.write`) and the
    control watch's reads (paused tasks, stop requests)."""
    with tempfile.TemporaryDirectory(prefix="bhb") as directory:
        store: Store = (
            MemoryStore() if kind == "memory" else SQLiteStore(Path(directory) / "ledger.db")
        )
        namespace = "bhb"
        heartbeat = Heartbeat(
            store, process_record(ProcessKind.WORKER, "bench", namespace, tasks=(TASK,))
        )
        pulse = Pulse(in_flight=8)
        try:
            heartbeat.write(pulse)  # the first write creates the row
            cpu = time.process_time()
            for _ in range(calls):
                heartbeat.write(pulse)
                store.pauses(namespace)
                store.stop_requests(namespace)
            return (time.process_time() - cpu) / calls * 1e6
        finally:
            store.close()


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    admin = Admin(url)
    variants = make_variants(options)
    throughput = ThroughputOptions(
        url=url, jobs=options.jobs, rounds=options.rounds, rate=1.0, seconds=1.0,
        concurrency=options.concurrency, quick=False, celery=False,
    )  # fmt: skip
    config = {
        **describe_broker(url, node, admin),
        "jobs": options.jobs,
        "rounds": f"{options.rounds} (variants interleaved, each rotation forward then backward)",
        "worker": f"bench.throughput's, in process, burst, sync no-op, concurrency"
        f" {options.concurrency}, prefetch {throughput.prefetch}",
        "stores": ", ".join(options.stores) + " (a fresh one per drain)",
        "heartbeat_every": f"shipped {HEARTBEAT_EVERY:g} s, off {OFF_EVERY:g} s,"
        f" short {options.short:g} s (control reads: the same period)",
        "cpu": "time.process_time() of this process around each drain",
    }
    print_config("What heartbeats and pause checks cost (bench.heartbeat_cost)", config, 16)
    found = {v.name: Figures([], [], [], []) for v in variants}
    warnings: list[str] = []
    try:
        with asyncio.Runner() as runner:
            for index in range(options.rounds):
                target = Target.fresh(url, throughput)
                admin.declare(target.topology)
                try:
                    print(f"  round {index + 1}/{options.rounds} ({target.app.namespace}):")
                    for variant in round_order(variants, index):
                        rate, cpu, beats, reads, wrong = drain(variant, target, admin, runner)
                        row = found[variant.name]
                        row.rates.append(rate)
                        row.cpu_per_1000.append(cpu)
                        row.beats.append(beats)
                        row.reads.append(reads)
                        if wrong:
                            warnings.append(wrong)
                        print(
                            f"    {variant.name:<24} {rate:7,.0f} jobs/s  CPU {cpu:.3f} s"
                            f" per 1,000 jobs  heartbeats {beats}, control reads {reads}",
                            flush=True,
                        )
                finally:
                    admin.delete(target.topology)
    finally:
        admin.close()
    checks = per_job_checks_ns()
    periods = {store: period_cost_us(store) for store in options.stores}
    figures = report(options, found)
    print(f"\nPer job, timed alone: pause checks and running-set add/discard {checks:.0f} ns")
    for store, cost in periods.items():
        print(
            f"Per heartbeat period, timed alone ({store}): one heartbeat and one control read"
            f" {cost:.0f} µs of CPU ({cost / HEARTBEAT_EVERY:.0f} µs/s shipped,"
            f" {cost / options.short:.0f} µs/s at {options.short:g} s)"
        )
    for warning in warnings:
        print(f"WARNING {warning}")
    return {
        "bench": "heartbeat_cost",
        "config": config,
        "variants": figures,
        "per_job_checks_ns": round(checks, 1),
        "per_period_cpu_us": {store: round(cost, 1) for store, cost in periods.items()},
        "warnings": warnings,
    }


def report(options: Options, found: dict[str, Figures]) -> dict[str, Any]:
    print(
        f"\n{'variant':<24} {'jobs/s':>7} {'min-max':>13} {'ratio':>6}"
        f"  {'its rounds':<20} {'CPU s/1k':>8} {'vs off':>7} {'beats':>5} {'reads':>5}"
    )
    figures: dict[str, Any] = {}
    for store in options.stores:
        names = [name for name in found if name.startswith(f"{store} ")]
        off = found[next(name for name in names if " off " in name)]
        base_rate, base_cpu = statistics.median(off.rates), statistics.median(off.cpu_per_1000)
        for name in names:
            row = found[name]
            rate, cpu = statistics.median(row.rates), statistics.median(row.cpu_per_1000)
            rounds = [a / b for a, b in zip(row.rates, off.rates, strict=True)]
            print(
                f"{name:<24} {rate:7,.0f} {min(row.rates):6,.0f}-{max(row.rates):<6,.0f}"
                f" {rate / base_rate:6.3f}  {', '.join(f'{r:.3f}' for r in rounds):<20}"
                f" {cpu:8.3f} {cpu - base_cpu:+7.3f} {statistics.median(row.beats):5g}"
                f" {statistics.median(row.reads):5g}"
            )
            figures[name] = {
                "jobs_per_s": spread(row.rates, digits=0),
                "rounds_jobs_per_s": [round(r) for r in row.rates],
                "ratio_to_off": round(rate / base_rate, 4),
                "round_ratios_to_off": [round(r, 4) for r in rounds],
                "cpu_s_per_1000_jobs": spread(row.cpu_per_1000, digits=4),
                "cpu_s_per_1000_vs_off": round(cpu - base_cpu, 4),
                "heartbeats": row.beats,
                "control_reads": row.reads,
            }
    return figures


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("heartbeat_cost", __doc__)
    add_number(parser, "--jobs", int, 40_000, "jobs per drain")
    add_number(parser, "--rounds", int, 5, "rounds")
    add_number(parser, "--concurrency", int, 8, "handler threads")
    add_number(parser, "--short", float, SHORT_EVERY, "the short heartbeat period (s)")
    parser.add_argument(
        "--stores", default=",".join(STORES), help=f"comma-separated ({','.join(STORES)})"
    )
    args = parser.parse_args(argv)
    stores = tuple(store for store in args.stores.split(",") if store)
    if not stores or set(stores) - set(STORES):
        parser.error(f"--stores: one or more of {', '.join(STORES)}")
    if min(args.jobs, args.rounds, args.concurrency) < 1 or args.short <= 0:
        parser.error("--jobs, --rounds, --concurrency and --short must be positive")
    return Options(args.url, args.jobs, args.rounds, args.concurrency, stores, args.short)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    return measure_workers_on_broker(options.url, lambda url, node: bench(options, url, node))


if __name__ == "__main__":
    sys.exit(main())
