"""The command line of ``python -m bench.recovery``: its options and their checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import bench.recovery
from bench.common import URL_ENV, add_number, bench_parser, from_args

DEFAULT_ROUNDS, DEFAULT_RATE, DEFAULT_STEADY = 5, 200.0, 5.0
DEFAULT_WORKERS, DEFAULT_CONCURRENCY = 2, 4


@dataclass(frozen=True)
class Options:
    rounds: int
    rate: float
    steady: float
    workers: int
    concurrency: int
    store: str | None  # a PostgreSQL DSN; None: an SQLite file in the run's temp dir


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser(
        "recovery",
        bench.recovery.__doc__,
        url=False,
        epilog=(
            "The broker is always a throwaway RabbitMQ node started from the local"
            " rabbitmq-server and removed at the end: kill -9 needs a node this bench"
            " owns. Unlike the other benches (bench.failover kills beats, not the broker,"
            f" so it can use a given one), --url is refused and ${URL_ENV} is ignored."
        ),
    )
    parser.add_argument(
        "--url",
        help="not supported: this bench kills the node, so it always starts its own",
    )
    add_number(parser, "--rounds", int, DEFAULT_ROUNDS, "kill -9 rounds")
    add_number(parser, "--rate", float, DEFAULT_RATE, "jobs published per second")
    add_number(parser, "--steady", float, DEFAULT_STEADY, "seconds of steady load before each kill")
    add_number(parser, "--workers", int, DEFAULT_WORKERS, "worker processes")
    add_number(parser, "--concurrency", int, DEFAULT_CONCURRENCY, "each worker's --concurrency")
    parser.add_argument(
        "--store",
        help="a PostgreSQL DSN (postgresql://...) for the workers' store and the effects"
        " (in a fresh schema, dropped at the end); default: an SQLite file in a temp dir",
    )
    args = parser.parse_args(argv)
    if args.url:
        parser.error(
            "--url is not supported: the bench kill -9s the broker, so it starts a"
            " throwaway node of its own (leave --url out)"
        )
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 1 <= args.rate <= 5000:
        parser.error("--rate must be between 1 and 5000 jobs/s")
    if args.steady < 0.5:
        parser.error("--steady must be at least 0.5 s")
    if args.workers < 1 or args.concurrency < 1:
        parser.error("--workers and --concurrency must be at least 1")
    if args.store and not args.store.startswith(("postgresql://", "postgres://")):
        parser.error("--store takes a PostgreSQL DSN (postgresql://...)")
    return from_args(Options, args)
