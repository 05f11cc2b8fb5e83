"""What ``bench.throughput`` prints and returns: the table of medians, the aims, the
cost of observing, and the JSON of it all."""

from __future__ import annotations

import statistics
from typing import Any

from bench.celery_baseline.app import PREFETCH_MULTIPLIER
from bench.common import Admin, describe_broker
from bench.throughput.options import OBSERVED, RAW, WORKER_SQLITE, Options
from bench.throughput.rounds import CELERY, FIGURES, Results
from broker_jobs.testing.rabbit_node import RabbitNode

#: Issue figures, measured on 2 cores with RabbitMQ 3.10 (jobs/s): the aim's fallback
#: when celery is not installed here (Celery's rate scaled by raw aio-pika's).
CELERY_RATE = 3800.0
RAW_REFERENCE_RATE = 5500.0
#: Aim: the worker's p50 latency at most this many ms above the raw one.
P50_AIM_MS = 1.0


def describe_config(
    options: Options, url: str, node: RabbitNode | None, admin: Admin
) -> dict[str, Any]:
    return {
        **describe_broker(url, node, admin),
        "drain_jobs": options.jobs,
        "rounds": options.rounds,
        "steady": f"{options.rate:g} jobs/s for {options.seconds:g} s",
        "concurrency": options.concurrency,
        "prefetch": options.prefetch,
        "queue": "durable quorum, persistent messages, publisher confirms",
        "store": "SQLite (WAL, synchronous=FULL) in a temp dir; MemoryStore for comparison",
        "observe": (
            "SQLite worker also with metrics, and with metrics + INFO JSON lines to a file"
            if options.observe
            else "off (--observe)"
        ),
        "celery": (
            f"solo pool, task_acks_late=True, worker_prefetch_multiplier={PREFETCH_MULTIPLIER}"
            " (for throughput; Celery's default is 4), quorum queue (bench.celery_baseline)"
            if options.celery
            else "skipped (--no-celery)"
        ),
    }


def print_table(results: Results) -> None:
    print()
    print(
        f"{'variant':<22} {'jobs/s':>9} {'min':>8} {'max':>8}"
        f" {'p50 ms':>8} {'p99 ms':>8} {'vs raw':>7} {'p50 +ms':>8}"
    )
    for name in results.names:
        rates = results.figures[name]["jobs_per_s"]
        print(
            f"{name:<22} {results.median(name, 'jobs_per_s'):>9,.0f} {min(rates):>8,.0f}"
            f" {max(rates):>8,.0f} {results.median(name, 'p50_ms'):>8.2f}"
            f" {results.median(name, 'p99_ms'):>8.2f} {results.rate_ratio(name):>7.2f}"
            f" {results.p50_gap(name):>+8.2f}"
        )
    if results.celery_rates:
        rates = results.celery_rates
        ratio = statistics.median(rates) / results.median(RAW, "jobs_per_s")
        print(
            f"{CELERY:<22} {statistics.median(rates):>9,.0f} {min(rates):>8,.0f}"
            f" {max(rates):>8,.0f} {'-':>8} {'-':>8} {ratio:>7.2f} {'-':>8}"
        )


def celery_reference(results: Results) -> tuple[float, str]:
    """The rate the SQLite worker must reach: Celery's, measured in this run when
    celery is installed, else the issue's Celery figure scaled to this machine by
    raw aio-pika's rate."""
    if results.celery_rates:
        return statistics.median(results.celery_rates), "Celery measured in this run"
    scaled = CELERY_RATE / RAW_REFERENCE_RATE * results.median(RAW, "jobs_per_s")
    return scaled, (
        f"Celery {CELERY_RATE:,.0f} vs raw {RAW_REFERENCE_RATE:,.0f} in the issue, scaled by"
        " raw aio-pika here"
    )


def aims(results: Results) -> dict[str, bool]:
    """The issue's aims for the SQLite worker: at least Celery's rate on this machine,
    and p50 within 1 ms of raw."""
    reference, _ = celery_reference(results)
    return {
        "jobs/s >= celery": results.median(WORKER_SQLITE, "jobs_per_s") >= reference,
        "p50 within 1 ms of raw": results.p50_gap(WORKER_SQLITE) <= P50_AIM_MS,
    }


def print_aims(results: Results) -> None:
    reference, source = celery_reference(results)
    met = aims(results)
    rate = results.median(WORKER_SQLITE, "jobs_per_s")
    print()
    print(
        f"Aim ({WORKER_SQLITE}): jobs/s >= {reference:,.0f} ({source});"
        f" p50 <= raw p50 + {P50_AIM_MS:g} ms"
    )
    gap = results.p50_gap(WORKER_SQLITE)
    ratios = ", ".join(f"{r:.2f}" for r in results.round_rate_ratios(WORKER_SQLITE))
    gaps = ", ".join(f"{g:+.2f}" for g in results.round_p50_gaps(WORKER_SQLITE))
    verdict = "met" if met["jobs/s >= celery"] else "NOT met"
    print(
        f"  jobs/s worker         {rate:,.0f} = {rate / reference:.2f} x Celery"
        f"  (aim >= 1.00)  {verdict}"
    )
    print(f"  worker / raw per round: {ratios}")
    verdict = "met" if met["p50 within 1 ms of raw"] else "NOT met"
    print(f"  p50 worker - raw      {gap:+5.2f} ms  (aim <= {P50_AIM_MS:g})  {verdict}")
    print(f"                        per round: {gaps}")
    for warning in results.warnings:
        print(f"WARNING: {warning}")


def observe_cost(results: Results) -> dict[str, dict[str, Any]]:
    """The --observe variants next to the plain SQLite worker of the same rounds."""
    base = WORKER_SQLITE
    return {
        name: {
            "jobs_per_s_ratio": round(results.rate_ratio(name, base), 3),
            "round_jobs_per_s_ratios": [round(x, 3) for x in results.round_rate_ratios(name, base)],
            "p50_ms_diff": round(results.p50_gap(name, base), 3),
            "round_p50_ms_diffs": [round(x, 3) for x in results.round_p50_gaps(name, base)],
            "p99_ms_diff": round(
                results.median(name, "p99_ms") - results.median(base, "p99_ms"), 3
            ),
        }
        for name in OBSERVED
        if name in results.names
    }


def print_observe_cost(results: Results) -> None:
    for name, cost in observe_cost(results).items():
        ratios = ", ".join(f"{r:.2f}" for r in cost["round_jobs_per_s_ratios"])
        gaps = ", ".join(f"{g:+.2f}" for g in cost["round_p50_ms_diffs"])
        print(
            f"Cost ({name} / {WORKER_SQLITE}): jobs/s x{cost['jobs_per_s_ratio']:.3f}"
            f" (per round {ratios}); p50 {cost['p50_ms_diff']:+.2f} ms (per round {gaps});"
            f" p99 {cost['p99_ms_diff']:+.2f} ms"
        )


def summary(config: dict[str, Any], results: Results) -> dict[str, Any]:
    def r(value: float) -> float:
        return round(value, 2)

    names = results.names
    return {
        "config": config,
        "median": {v: {f: r(results.median(v, f)) for f in FIGURES} for v in names},
        "rounds": {v: {f: [r(x) for x in results.figures[v][f]] for f in FIGURES} for v in names},
        "jobs_per_s_ratio_vs_raw": {v: round(results.rate_ratio(v), 3) for v in names},
        "p50_ms_minus_raw": {v: r(results.p50_gap(v)) for v in names},
        "round_jobs_per_s_ratios": {
            v: [round(x, 3) for x in results.round_rate_ratios(v)] for v in names
        },
        "observe_cost_vs_plain_sqlite_worker": observe_cost(results),
        "celery_jobs_per_s": {
            "median": r(statistics.median(results.celery_rates)) if results.celery_rates else None,
            "rounds": [r(x) for x in results.celery_rates],
        },
        "aims_met": aims(results),
        "warnings": results.warnings,
    }
