"""The command line of ``python -m bench.throughput`` and the names of its variants."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import bench.throughput
from bench.common import add_number, bench_parser
from broker_jobs.worker import WorkerSettings

DEFAULT_JOBS, DEFAULT_ROUNDS, DEFAULT_RATE, DEFAULT_SECONDS = 5000, 5, 500.0, 5.0
QUICK_JOBS, QUICK_ROUNDS, QUICK_RATE, QUICK_SECONDS = 500, 2, 250.0, 2.0
DEFAULT_CONCURRENCY = 8

WORKER_SQLITE = "worker sync sqlite"
WORKER_ASYNC = "worker async sqlite"
WORKER_MEMORY = "worker sync memory"
WORKER_METRICS = "worker sqlite metrics"
WORKER_LOGS = "worker sqlite metrics+logs"
WORKER_SUMMARY = "worker sqlite metrics+summary"
RAW = "raw aio-pika"
VARIANTS = (WORKER_SQLITE, WORKER_ASYNC, WORKER_MEMORY, RAW)
#: With --observe: the SQLite worker with its metrics, then with its INFO lines too:
#: a line per success (--log-successes each), or the default summary line a second.
OBSERVED = (WORKER_METRICS, WORKER_LOGS, WORKER_SUMMARY)


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
    parser = bench_parser("throughput", bench.throughput.__doc__)
    add_number(parser, "--jobs", int, DEFAULT_JOBS, "drained jobs", later=True)
    add_number(parser, "--rounds", int, DEFAULT_ROUNDS, "rounds", later=True)
    add_number(parser, "--rate", float, DEFAULT_RATE, "steady jobs/s", later=True)
    add_number(parser, "--seconds", float, DEFAULT_SECONDS, "steady phase length", later=True)
    add_number(parser, "--concurrency", int, DEFAULT_CONCURRENCY, "worker concurrency")
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
        help="also the SQLite worker with metrics, and with metrics and INFO JSON log lines"
        " (a line per success, and the default summary line a second)",
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
