"""The figures of one ``bench.delay`` round: lateness, by route and in all, what the
ladder adds, the consumer's holds, and the counts that must be 0."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from bench.delay.consumer import Record
from bench.delay.rounds import Round
from bench.figures import percentile
from topology.delay import MAX_HOLD

#: A hold above MAX_HOLD by more than this counts as an early arrival.
HOLD_TOLERANCE = 0.05


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
