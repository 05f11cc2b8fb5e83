"""What ``bench.recovery`` prints and returns: a line per round, the counts, the
summary against the aims, and the JSON of it all."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench.common import Admin, describe_broker
from bench.effects import Effects
from bench.figures import spread
from bench.recovery.options import Options
from bench.recovery.rounds import Round
from bench.recovery.tally import Tally
from bench.workers import Record
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.urls import mask_url

#: Aims (issue 12) for broker up -> first job run, in seconds.
AIM_P50, AIM_MAX = 1.0, 3.0
#: Stray worker log records shown in full at most.
SHOW_STRAY = 8


def seconds(value: float | None, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def print_header(names: Sequence[str]) -> None:
    consuming = "/".join(names)
    print("Rounds (seconds after broker up, the AMQP port accepting again, unless said):")
    print("  downtime   kill -9 -> broker up")
    print("  start()    RabbitNode.start() returned (await_startup, then its port check)")
    print("  first run  the first job run after broker up (the handler's time.time())")
    print(f"  consuming  each worker's 'consuming' log line after its reconnect ({consuming})")
    print("  publish    the publisher's first confirm after broker up")
    print(f"  noticed    seconds from the kill to each worker's 'lost the broker' ({consuming})")
    print()
    print(
        f"{'round':>7} {'downtime':>8} {'start()':>7} {'first run':>9}"
        f" {'consuming':>13} {'publish':>7} {'noticed':>11}"
    )


def print_round(record: Round, total: int) -> None:
    label = f"{record.number}/{total}"
    consuming = "/".join(seconds(record.after_up(at), True) for at in record.consuming_at.values())
    noticed = "/".join(
        seconds(None if at is None else at - record.killed_at)
        for at in record.loss_noticed_at.values()
    )
    line = (
        f"{label:>7} {seconds(record.downtime):>8}"
        f" {seconds(record.after_up(record.start_returned_at), True):>7}"
        f" {seconds(record.first_run, True):>9} {consuming:>13}"
        f" {seconds(record.after_up(record.published_again_at), True):>7} {noticed:>11}"
    )
    if record.error:
        line += f"  FAILED: {record.error}"
    print(line, flush=True)


def print_round_counts(rounds: Sequence[Round], total: int) -> None:
    print("Jobs around each kill (counted at the end):")
    for record in rounds:
        outage = ", ".join(
            f"{name} {'-' if value is None else f'{value:g} s'}"
            for name, value in record.outage_logged.items()
        )
        print(
            f"  round {record.number}/{total}: not published {record.not_published},"
            f" carried over {record.carried_over}; outage the workers logged: {outage}"
        )


def summary(rounds: Sequence[Round], counts: Tally) -> dict[str, Any]:
    def seconds_of(values: Sequence[float | None]) -> dict[str, float | int | None]:
        return spread([value for value in values if value is not None], unit="_s")

    return {
        "first_run": seconds_of([r.first_run for r in rounds]),
        "all_consuming": seconds_of([r.all_consuming for r in rounds]),
        "downtime": seconds_of([r.downtime for r in rounds]),
        "published_again": seconds_of([r.after_up(r.published_again_at) for r in rounds]),
        "rounds": len(rounds),
        "failed_rounds": sum(r.error is not None for r in rounds),
        "lost": len(counts.lost),
        "twice": len(counts.twice),
    }


def aims(figures: dict[str, Any], counts: Tally, rounds_wanted: int) -> dict[str, bool]:
    first = figures["first_run"]
    complete = figures["rounds"] == rounds_wanted and not figures["failed_rounds"]
    p50, worst = first["p50_s"], first["max_s"]
    return {
        f"broker up -> first job run p50 <= {AIM_P50:g} s": complete
        and p50 is not None
        and p50 <= AIM_P50,
        f"broker up -> first job run max <= {AIM_MAX:g} s": complete
        and worst is not None
        and worst <= AIM_MAX,
        "lost = 0": not counts.lost,
        "run twice = 0": not counts.twice,
    }


def print_summary(
    figures: dict[str, Any],
    counts: Tally,
    *,
    met: dict[str, bool],
    codes: dict[str, int | None],
    exited_early: Sequence[str],
    stray: Sequence[tuple[str, Record]],
    outcomes: dict[str, str],
    levels: dict[str, dict[str, int]],
) -> None:
    def line(label: str, group: dict[str, Any]) -> None:
        print(
            f"  {label:<40} p50 {seconds(group['p50_s']):>6} s  max {seconds(group['max_s']):>6}"
            f" s  min {seconds(group['min_s']):>6} s  ({group['count']} rounds)"
        )

    print()
    print("Summary:")
    line("broker up -> first job run", figures["first_run"])
    line("broker up -> every worker consuming", figures["all_consuming"])
    line("broker up -> first publish confirmed", figures["published_again"])
    line("downtime (kill -9 -> broker up)", figures["downtime"])
    print(
        f"  jobs: {counts.attempted} attempted, {counts.published} published (confirmed),"
        f" {counts.not_published} not published ({counts.ran_not_published} of them ran"
        f" anyway: the kill came between send and confirm); {counts.ran} ran"
        f" ({counts.runs} runs), all of them {counts.drain_s:.1f} s after the publisher stopped"
    )
    print(f"  lost (published, never ran): {len(counts.lost)}  (must be 0)")
    print(f"  run twice: {len(counts.twice)}  (must be 0)")
    if counts.unknown:
        print(f"  runs of keys never published: {len(counts.unknown)}  (must be 0)")
    print(
        f"  left in the task queue: {_maybe(counts.queue_left)},"
        f" dead letters: {_maybe(counts.dead_letters)}"
    )
    for label, keys in (("LOST", counts.lost), ("TWICE", counts.twice)):
        if keys:
            print(f"  {label}: {', '.join(keys[:10])}{' ...' if len(keys) > 10 else ''}")
    exits = ", ".join(f"{name} {_maybe(code)}" for name, code in codes.items())
    print(f"  workers exited during the run: {', '.join(exited_early) or 'none'}")
    print(f"  workers' exit codes on SIGTERM: {exits}  (must be 0)")
    for name, text in outcomes.items():
        print(f"  {name} reported: {text or '-'}")
    print("    (duplicate: a redelivery the store found done already, acked without a run)")
    for name, counted in levels.items():
        by_level = ", ".join(f"{count} {level}" for level, count in sorted(counted.items()))
        print(f"  {name} log records: {by_level or 'none'}")
    print(f"  stray worker log records (not INFO, not an expected WARNING): {len(stray)}")
    for name, record in stray[:SHOW_STRAY]:
        text = "\n      ".join([record.message, *record.more[-6:]])
        print(f"    {name} {record.level}: {text}")
    print()
    print("Aims:")
    for label, ok in met.items():
        print(f"  {label:<44} {'met' if ok else 'NOT met'}")


def _maybe(value: object) -> str:
    return "-" if value is None else str(value)


def problems(
    rounds: Sequence[Round],
    counts: Tally,
    codes: dict[str, int | None],
    exited_early: Sequence[str],
    wanted: int,
) -> list[str]:
    found = [f"round {r.number}: {r.error}" for r in rounds if r.error]
    if len(rounds) < wanted:
        found.append(f"only {len(rounds)} of {wanted} rounds ran")
    if counts.lost:
        found.append(f"{len(counts.lost)} published jobs never ran")
    if counts.twice:
        found.append(f"{len(counts.twice)} jobs ran twice")
    if counts.unknown:
        found.append(f"{len(counts.unknown)} runs of keys never published")
    found += [f"{name} exited during the run" for name in exited_early]
    found += [f"{name} exit code {code} on SIGTERM" for name, code in codes.items() if code != 0]
    return found


def describe_config(
    options: Options, node: RabbitNode, admin: Admin, namespace: str, effects: Effects
) -> dict[str, Any]:
    return {
        **describe_broker(node.url, node, admin),
        "broker_origin": "throwaway node (kill -9 and restarted by the bench)",
        "namespace": namespace,
        "rounds": options.rounds,
        "rate": options.rate,
        "steady_s": options.steady,
        "workers": f"{options.workers} x broker-jobs worker --concurrency {options.concurrency}",
        "store": (
            "sqlite (a file in the run's temp dir)"
            if effects.dsn is None
            else f"{mask_url(effects.dsn)} (schema {effects.schema})"
        ),
        "handler": "transactional: INSERT key, time.time(), pid INTO effects (store's connection)",
        "measure": "AMQP port accepting again -> first job run (effects.ran_at)",
    }


def round_json(record: Round) -> dict[str, Any]:
    def rel(moment: float | None) -> float | None:
        value = record.after_up(moment)
        return None if value is None else round(value, 3)

    return {
        "round": record.number,
        "downtime_s": None if record.downtime is None else round(record.downtime, 3),
        "kill_s": round(record.dead_at - record.killed_at, 3),
        "start_returned_s": rel(record.start_returned_at),
        "first_run_s": rel(record.first_run_at),
        "consuming_s": {name: rel(at) for name, at in record.consuming_at.items()},
        "all_consuming_s": None if record.all_consuming is None else round(record.all_consuming, 3),
        "published_again_s": rel(record.published_again_at),
        "loss_noticed_s": {
            name: None if at is None else round(at - record.killed_at, 3)
            for name, at in record.loss_noticed_at.items()
        },
        "outage_logged_s": record.outage_logged,
        "not_published": record.not_published,
        "carried_over": record.carried_over,
        "error": record.error,
    }
