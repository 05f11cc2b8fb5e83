"""What ``bench.delay`` prints and returns: a line per round, the table of medians,
the aims, and the JSON of it all."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from bench.common import Admin, describe_broker
from bench.delay.consumer import PREFETCH
from bench.delay.lateness import HOLD_TOLERANCE, MUST_BE_ZERO, Figures
from bench.delay.options import MIN_DELAY, Options
from bench.delay.publishing import TICK
from broker_jobs.testing.rabbit_node import RabbitNode
from topology.delay import DELAY_LEVELS, EARLY_MARGIN, MAX_HOLD

AIM_P50_MS, AIM_P99_MS = 5.0, 20.0


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
