"""``python -m bench.celery_baseline``: the command (see :mod:`bench.celery_baseline`);
with ``_worker SPEC``, the worker subprocess of one drain."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import bench.celery_baseline
from bench.celery_baseline.app import (
    BROKER_POOL_LIMIT,
    CELERY_DEFAULT_PREFETCH_MULTIPLIER,
    PREFETCH_MULTIPLIER,
    CeleryMissingError,
    celery_versions,
)
from bench.celery_baseline.drain import (
    POOLS,
    QUEUE_TYPES,
    WORKER_CHILD,
    CeleryDrain,
    WorkerSpec,
    drain,
    run_worker,
)
from bench.common import Admin, add_number, bench_parser, broker, from_args, print_config
from broker_jobs import mask_url

DEFAULT_JOBS, DEFAULT_ROUNDS = 5000, 3
DEFAULT_VARIANTS = ("solo:1", "prefork:2")
EXIT_NO_CELERY = 2
#: A gap between two consecutive completions longer than this is reported as a stall.
STALL_S = 1.0


@dataclass(frozen=True)
class Variant:
    pool: str
    concurrency: int

    @property
    def name(self) -> str:
        return f"{self.pool} c={self.concurrency}"

    @classmethod
    def parse(cls, text: str) -> Variant:
        pool, _, concurrency = text.partition(":")
        if pool not in POOLS or not concurrency.isdigit() or int(concurrency) < 1:
            raise argparse.ArgumentTypeError(f"expected POOL:CONCURRENCY, POOL in {POOLS}")
        return cls(pool, int(concurrency))


@dataclass(frozen=True)
class Options:
    url: str | None
    jobs: int
    rounds: int
    variants: tuple[Variant, ...]
    queue_type: str
    prefetch_multiplier: int


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("celery_baseline", bench.celery_baseline.__doc__)
    add_number(parser, "--jobs", int, DEFAULT_JOBS, "tasks per drain")
    add_number(parser, "--rounds", int, DEFAULT_ROUNDS, "rounds")
    parser.add_argument(
        "--variant",
        type=Variant.parse,
        action="append",
        metavar="POOL:CONCURRENCY",
        help=f"repeatable (default: {' '.join(DEFAULT_VARIANTS)})",
    )
    parser.add_argument(
        "--queue-type",
        choices=QUEUE_TYPES,
        default="quorum",
        help="quorum (default: the comparison); classic for diagnosis only",
    )
    parser.add_argument(
        "--prefetch-multiplier",
        type=int,
        default=PREFETCH_MULTIPLIER,
        help=f"worker_prefetch_multiplier ({PREFETCH_MULTIPLIER}, set for throughput;"
        f" Celery's default is {CELERY_DEFAULT_PREFETCH_MULTIPLIER})",
    )
    args = parser.parse_args(argv)
    if min(args.jobs, args.rounds, args.prefetch_multiplier) < 1:
        parser.error("--jobs, --rounds and --prefetch-multiplier must be positive")
    variants = args.variant or [Variant.parse(text) for text in DEFAULT_VARIANTS]
    variants = tuple(dict.fromkeys(variants))
    return from_args(Options, args, url=args.url or None, variants=variants)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def describe_config(options: Options, url: str, rabbitmq: str) -> dict[str, Any]:
    return {
        "broker": mask_url(url),
        "rabbitmq": rabbitmq,
        **celery_versions(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_start": load(),
        "jobs_per_round": options.jobs,
        "rounds": options.rounds,
        "variants": ", ".join(
            f"{v.name} (prefetch {options.prefetch_multiplier * v.concurrency})"
            for v in options.variants
        ),
        "prefetch_multiplier": f"{options.prefetch_multiplier} (worker_prefetch_multiplier;"
        f" Celery's default: {CELERY_DEFAULT_PREFETCH_MULTIPLIER})",
        "acks": "task_acks_late=True: each task acked after it ran, like the others",
        "qos": "per-consumer (worker_detect_quorum_queues: no global QoS on quorum queues)"
        if options.queue_type == "quorum"
        else "global (Celery's choice on RabbitMQ >= 3.3 without quorum queues)",
        "queue": f"durable {options.queue_type}, own direct exchange, persistent messages,"
        " published without confirms",
        "task": "no-op, acks_late=True, ignore_result=True, no result backend",
        "broker_pool_limit": BROKER_POOL_LIMIT,
        "worker": "--without-gossip --without-mingle --without-heartbeat, no remote control",
        "timed": "worker_ready (after basic.consume) to the N-th task done",
    }


@dataclass
class Results:
    drains: dict[str, list[CeleryDrain]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def median(self, variant: str, figure: str) -> float:
        return float(statistics.median(getattr(d, figure) for d in self.drains[variant]))


def run_rounds(options: Options, url: str) -> Results:
    results = Results({v.name: [] for v in options.variants})
    for index in range(options.rounds):
        order = list(options.variants)
        figures = []
        for variant in order[::-1] if index % 2 else order:
            drained = drain(
                url,
                options.jobs,
                concurrency=variant.concurrency,
                pool=variant.pool,
                queue_type=options.queue_type,
                prefetch_multiplier=options.prefetch_multiplier,
            )
            results.drains[variant.name].append(drained)
            if drained.left:
                results.warnings.append(
                    f"round {index + 1}, {variant.name}: {drained.left} tasks left in the queue"
                )
            if drained.longest_gap_s > STALL_S:
                results.warnings.append(
                    f"round {index + 1}, {variant.name}: a {drained.longest_gap_s:.2f} s stall"
                    " between two task completions"
                )
            figures.append(
                f"{variant.name} {drained.rate:,.0f}/s"
                f" (from spawn {drained.rate_from_spawn:,.0f}/s, startup {drained.startup_s:.2f} s,"
                f" longest gap {drained.longest_gap_s * 1000:.0f} ms)"
            )
        print(f"  round {index + 1}/{options.rounds}: " + "; ".join(figures), flush=True)
    return results


#: The figures of a drain in the JSON line, with their decimals.
FIGURES = {"rate": 1, "rate_from_spawn": 1, "startup_s": 3, "longest_gap_s": 4}


def print_table(results: Results) -> None:
    print()
    print(
        f"{'variant':<14} {'jobs/s':>9} {'min':>8} {'max':>8} {'from spawn':>11}"
        f" {'startup s':>10} {'gap ms':>7}"
    )
    for name, drains in results.drains.items():
        rates = [d.rate for d in drains]
        print(
            f"{name:<14} {results.median(name, 'rate'):>9,.0f} {min(rates):>8,.0f}"
            f" {max(rates):>8,.0f} {results.median(name, 'rate_from_spawn'):>11,.0f}"
            f" {results.median(name, 'startup_s'):>10.2f}"
            f" {results.median(name, 'longest_gap_s') * 1000:>7.0f}"
        )
    for warning in results.warnings:
        print(f"WARNING: {warning}")


def summary(config: dict[str, Any], results: Results) -> dict[str, Any]:
    return {
        "config": {**config, "load_avg_end": load()},
        "median": {
            name: {f: round(results.median(name, f), digits) for f, digits in FIGURES.items()}
            for name in results.drains
        },
        "rounds": {
            name: {f: [round(getattr(d, f), n) for d in drains] for f, n in FIGURES.items()}
            for name, drains in results.drains.items()
        },
        "warnings": results.warnings,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [WORKER_CHILD]:
        run_worker(WorkerSpec(**json.loads(argv[1])))
        return 0
    options = parse_args(argv)
    try:
        celery_versions()
    except CeleryMissingError as exc:
        print(exc, file=sys.stderr)
        return EXIT_NO_CELERY
    with broker(options.url) as (url, _node):
        with Admin(url, "bench celery admin") as admin:
            rabbitmq = admin.server_version() or "unknown"
        config = describe_config(options, url, rabbitmq)
        title = "Celery drain baseline (what bench.throughput's drain phase is compared to)"
        print_config(title, config, 20)
        results = run_rounds(options, url)
    print_table(results)
    print(json.dumps(summary(config, results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
