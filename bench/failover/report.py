"""What ``bench.failover`` computes and prints: each round's line, the figures of the
kill and pause rounds, the fire sequence, the aims, and the JSON of the events."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from bench.common import Admin, describe_broker
from bench.failover.beats import Emit
from bench.failover.options import Options
from bench.failover.rounds import Event, iso
from bench.figures import spread
from broker_jobs.testing.rabbit_node import RabbitNode

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Aim after a kill -9 (seconds).
AIM_KILL = 1.0
#: Aim after a pause: the heartbeat timeout plus this (seconds).
AIM_PAUSE_MARGIN = 1.0
#: Duplicates listed in full at most.
SHOW_DUPLICATES = 10


def ms(seconds: float | None) -> float | None:
    if seconds is None or math.isnan(seconds):
        return None
    return round(seconds * 1000, 1)


def stats(values: Sequence[float]) -> dict[str, float | int | None]:
    """Count, p50, p90, max and min, in milliseconds."""
    return spread(values, unit="_ms", scale=1000, digits=1, quantiles=(50, 90))


@dataclass(frozen=True)
class FireSequence:
    """The fires emitted over the run, on the schedule's grid."""

    emissions: int
    fires: int
    first: str | None
    last: str | None
    duplicates: list[str]
    gaps: list[str]


def check_sequence(emits: Sequence[Emit], interval: float) -> FireSequence:
    step = timedelta(seconds=interval)
    counts = Counter((emit.fire - EPOCH) // step for emit in emits)
    if not counts:
        return FireSequence(0, 0, None, None, [], [])
    first, last = min(counts), max(counts)

    def instant(index: int) -> str:
        return iso(EPOCH + index * step)

    return FireSequence(
        emissions=len(emits),
        fires=len(counts),
        first=instant(first),
        last=instant(last),
        duplicates=[instant(index) for index in sorted(counts) if counts[index] > 1],
        gaps=[instant(index) for index in range(first, last + 1) if index not in counts],
    )


def figures(events: Sequence[Event]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for kind in ("kill", "pause"):
        done = [event for event in events if event.kind == kind and event.failover is not None]
        elected = [event.elected for event in done if event.elected is not None]
        after_election = [
            event.failover - event.elected
            for event in done
            if event.failover is not None and event.elected is not None
        ]
        result[kind] = {
            "failover": stats([event.failover for event in done if event.failover is not None]),
            "elected": stats(elected),
            "election_to_emission": stats(after_election),
            "fire_wait": stats([event.fire_wait for event in done if event.fire_wait is not None]),
            "catch_up_first": sum(bool(event.catch_up_first) for event in done),
            "rounds": sum(event.kind == kind for event in events),
            "failed": sum(event.kind == kind and event.failover is None for event in events),
        }
    return result


class Aim(NamedTuple):
    label: str
    figure: str  # what is compared, for the report
    met: bool | None  # None: no round of that kind


def aims(options: Options, table: dict[str, dict[str, Any]], events: Sequence[Event]) -> list[Aim]:
    """The issue's aims. A pause is judged against 3 heartbeats + 1 s: RabbitMQ drops
    a silent connection 2 to 3 heartbeats after its last byte (its check runs once a
    heartbeat and gives up after two checks without data), so 3 heartbeats is the
    heartbeat timeout's worst case; 2 heartbeats + 1 s is shown too, informational."""
    h = options.heartbeat
    pauses = [event for event in events if event.kind == "pause"]

    def under(kind: str, limit_s: float) -> Aim:
        group = table[kind]
        worst = group["failover"]["max_ms"]
        label = f"{'kill -9' if kind == 'kill' else 'pause'}: max < {limit_s:g} s"
        figure = f"max {'-' if worst is None else f'{worst:g}'} ms"
        if group["failed"]:
            return Aim(label, f"{figure}, {group['failed']} without a new leader", met=False)
        if not group["rounds"]:
            return Aim(label, figure, met=None)
        return Aim(label, figure, met=worst is not None and worst < limit_s * 1000)

    kill = under("kill", AIM_KILL)
    worst_case = under("pause", 3 * h + AIM_PAUSE_MARGIN)
    best_case = under("pause", 2 * h + AIM_PAUSE_MARGIN)
    stood = sum(bool(event.stood_down) for event in pauses)
    return [
        kill,
        worst_case._replace(label=worst_case.label + f" (3 x {h} s heartbeat + 1 s: the aim)"),
        best_case._replace(label=best_case.label + f" (2 x {h} s + 1 s: informational)"),
        Aim(
            "pause: every resumed leader stood down",
            f"{stood}/{len(pauses)}",
            met=stood == len(pauses) if pauses else None,
        ),
    ]


def describe_config(
    options: Options, url: str, node: RabbitNode | None, admin: Admin, namespace: str
) -> dict[str, Any]:
    return {
        **describe_broker(url, node, admin),
        "namespace": namespace,
        "beats": options.beats,
        "heartbeat_s": options.heartbeat,
        "interval_s": options.interval,
        "kills": options.kills,
        "pauses": options.pauses,
        "beat": "own processes: scheduler.Beat as broker-jobs beat runs it, SQLite store",
        "measure": "kill/stop at t0 -> first fire emitted (confirmed, recorded) by another beat",
    }


def print_event(event: Event, total: int) -> None:
    label = f"{event.kind:<5} {event.number:>2}/{total}"
    if event.failover is None:
        print(f"  {label} {event.victim}: FAILED: {event.error}", flush=True)
        return
    if event.catch_up_first is None:
        wait = "election not logged"
    elif event.catch_up_first:
        wait = "a catch-up"
    else:
        wait = f"waited {_ms(event.fire_wait)} for it"
    line = (
        f"  {label} {event.victim} -> {event.successor}: failover {_ms(event.failover)}"
        f" (elected {_ms(event.elected)}; first fire {event.first_fire}: {wait};"
        f" {event.caught_up} due at election)"
    )
    if event.kind == "pause":
        stood = "yes" if event.stood_down else "NO"
        down = _ms(event.stood_down_after) if event.stood_down_after is not None else "not logged"
        line += (
            f"; resumed after {_ms(event.paused_for)}, stood down after {down},"
            f" late fires {len(event.late_fires)}: stood down: {stood}"
        )
        if event.error:
            line += f"; {event.error}"
    print(line, flush=True)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


ROWS = (
    ("failover p50 (ms)", "failover", "p50_ms"),
    ("failover p90 (ms)", "failover", "p90_ms"),
    ("failover max (ms)", "failover", "max_ms"),
    ("failover min (ms)", "failover", "min_ms"),
    ("  elected (its 'leads' log) p50 (ms)", "elected", "p50_ms"),
    ("  elected (its 'leads' log) max (ms)", "elected", "max_ms"),
    ("  election to emission p50 (ms)", "election_to_emission", "p50_ms"),
    ("  election to emission max (ms)", "election_to_emission", "max_ms"),
    ("    of which waiting for a fire p50 (ms)", "fire_wait", "p50_ms"),
    ("    of which waiting for a fire max (ms)", "fire_wait", "max_ms"),
)


def print_table(table: dict[str, dict[str, Any]], sequence: FireSequence) -> None:
    kill, pause = table["kill"], table["pause"]
    print()
    print(f"{'figure':<40} {'kill -9':>10} {'pause':>10}")
    for label, group, key in ROWS:
        print(f"{label:<40} {_cell(kill[group][key])} {_cell(pause[group][key])}")
    catch_ups = f"{kill['catch_up_first']:>10} {pause['catch_up_first']:>10}"
    print(f"{'first emission was a catch-up':<40} {catch_ups}")
    print(f"{'rounds (failed)':<40} {_count(kill):>10} {_count(pause):>10}")
    print()
    print(
        f"Fires: {sequence.fires} distinct fires in {sequence.emissions} emissions,"
        f" {sequence.first} to {sequence.last}; duplicates {len(sequence.duplicates)}"
        f" (harmless: same fence key), gaps {len(sequence.gaps)} (must be 0)"
    )
    if sequence.duplicates:
        shown = ", ".join(sequence.duplicates[:SHOW_DUPLICATES])
        more = len(sequence.duplicates) - SHOW_DUPLICATES
        print(f"  duplicates: {shown}{f' and {more} more' if more > 0 else ''}")
    if sequence.gaps:
        print(f"  GAPS: {', '.join(sequence.gaps[:SHOW_DUPLICATES])}")


def _cell(value: float | None) -> str:
    return f"{'-' if value is None else f'{value:g}':>10}"


def _count(group: dict[str, Any]) -> str:
    return f"{group['rounds']} ({group['failed']})"


def print_aims(options: Options, met: Sequence[Aim], found: Sequence[str]) -> None:
    h = options.heartbeat
    print()
    print(
        f"Aims (a kill -9 closes the leader's socket at once; a paused leader's connection"
        f" is dropped by the broker 2 to 3 heartbeats, {2 * h}-{3 * h} s, after its last byte):"
    )
    for aim in met:
        verdict = "n/a" if aim.met is None else "met" if aim.met else "NOT met"
        print(f"  {aim.label:<58} {aim.figure:>16}  {verdict}")
    for problem in found:
        print(f"FAILED: {problem}")


def problems(events: Sequence[Event], sequence: FireSequence, unparsed: Sequence[str]) -> list[str]:
    found = [f"{e.kind} {e.number}: {e.error}" for e in events if e.error]
    found += [
        f"pause {e.number}: {e.victim} emitted {len(e.late_fires)} fires after t0 once resumed"
        for e in events
        if e.late_fires
    ]
    if sequence.gaps:
        found.append(f"{len(sequence.gaps)} fires never emitted (first {sequence.gaps[0]})")
    found += [f"unexpected child output: {line}" for line in unparsed[:5]]
    return found


def event_json(event: Event) -> dict[str, Any]:
    row = asdict(event)
    for key in ("failover", "elected", "fire_wait", "paused_for", "stood_down_after"):
        row[f"{key}_ms"] = ms(row.pop(key))
    row["stood_down"] = event.stood_down
    return row
