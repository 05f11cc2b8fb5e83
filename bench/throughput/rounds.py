"""One round of ``bench.throughput``: every variant's drain and steady phases, in a
fresh namespace, and Celery's drain of the same jobs."""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass, field

from bench.celery_baseline.app import PREFETCH_MULTIPLIER, CeleryMissingError
from bench.celery_baseline.drain import drain_rate
from bench.common import Admin
from bench.figures import percentile, round_order
from bench.throughput.handlers import Noop, Target
from bench.throughput.options import RAW, VARIANTS, Options
from bench.throughput.steady import SteadyProcess, tick_sizes
from bench.throughput.variants import Variant, make_variants
from broker_jobs import JobRequest, Publisher

CELERY = "celery solo (prefetch x100, acks late)"

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
    """One Celery drain (bench.celery_baseline: solo pool, acks_late, prefetch
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
