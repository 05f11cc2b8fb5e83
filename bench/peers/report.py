"""The report of ``bench.compare``: tables of medians and ratios, the aims of issue 27,
docs/benchmarks.md and a plot per figure (matplotlib, Agg)."""

from __future__ import annotations

import functools
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.comparison import (
    DEFAULT_JOBS,
    DEFAULT_ROUNDS,
    DEFAULT_RSS_JOBS,
    FIGURES,
    RAW_PUBLISHER,
    RAW_WORKER,
    Options,
    Peer,
    Results,
    reference_row,
)

BJ_ONE, BJ_TWO, BJ_SQLITE = "broker-jobs 1x8", "broker-jobs 2x8", "broker-jobs sqlite"
#: Issue 27: publish-to-start p50 at most this many ms over raw aio-pika's.
LATENCY_GAP = 0.15
#: The same worker with an ``async def`` handler: shown beside the aims, not judged.
BJ_ASYNC = "broker-jobs async"
CELERY_SOLO, DRAMATIQ_ONE, DRAMATIQ_TWO = "celery solo", "dramatiq 1x8", "dramatiq 2x8"
IMAGE_PREFIX = "benchmarks-"


# -- aims ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    aim: str
    queue_type: str
    met: bool | None  # None: not measured in this run
    figures: str


def fmt(value: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


def ratio_aim(
    results: Results, figure: str, queue_type: str, row: str, other: str, *, target: float
) -> tuple[bool | None, str]:
    """Met when the median of the per-round ratios ``row / other`` reaches ``target``."""
    value = results.ratio(figure, queue_type, row, other)
    if math.isnan(value):
        return None, f"{row} / {other}: not measured"
    return value >= target, f"{row} / {other} = {value:.2f} (>= {target:g})"


def unjudged(part: tuple[bool | None, str]) -> tuple[bool | None, str]:
    """A figure shown beside an aim but not judged (the async handler's row)."""
    return None, f"{part[1]}, not judged"


def combine(parts: Sequence[tuple[bool | None, str]]) -> tuple[bool | None, str]:
    measured = [met for met, _ in parts if met is not None]
    met = all(measured) if measured else None
    return met, "; ".join(text for _, text in parts)


def aims(results: Results, queue_types: Sequence[str]) -> list[Verdict]:
    """Issue 27's aims, and issue 18's that broker-jobs met (it must keep leading)."""
    verdicts = []
    for queue_type in queue_types:
        consume = functools.partial(consume_aim, results, queue_type)
        verdicts += [
            Verdict(
                "one broker-jobs process (memory store) consumes >= 1.1 x Celery solo and"
                " Dramatiq 1x8",
                queue_type,
                *consume(BJ_ONE, 1.1),
            ),
            Verdict(
                "one broker-jobs process with the SQLite ledger consumes >= 1.0 x Celery solo"
                " and Dramatiq 1x8",
                queue_type,
                *consume(BJ_SQLITE, 1.0),
            ),
            Verdict(
                "broker-jobs --processes 2 consumes ahead of Dramatiq 2x8 (still leads)",
                queue_type,
                *ratio_aim(results, "consume", queue_type, BJ_TWO, DRAMATIQ_TWO, target=1.0),
            ),
            Verdict(
                "drain with a live publisher: broker-jobs fastest of all (still leads)",
                queue_type,
                *drain_aim(results, queue_type),
            ),
            Verdict(
                "single confirmed publish: ratio to raw pika >= Dramatiq's",
                queue_type,
                *publish_aim(results, queue_type),
            ),
            Verdict(
                f"publish-to-start p50 within {LATENCY_GAP} ms of raw",
                queue_type,
                *latency_aim(results, queue_type, RAW_WORKER),
            ),
        ]
    return verdicts


def consume_aim(
    results: Results, queue_type: str, row: str, target: float
) -> tuple[bool | None, str]:
    """``row`` consumes at ``target`` x Celery solo and Dramatiq 1x8 or more (its ratio
    to raw aio-pika shown beside, not judged)."""
    return combine(
        [
            ratio_aim(results, "consume", queue_type, row, CELERY_SOLO, target=target),
            ratio_aim(results, "consume", queue_type, row, DRAMATIQ_ONE, target=target),
            unjudged(ratio_aim(results, "consume", queue_type, row, RAW_WORKER, target=0.9)),
        ]
    )


def publish_aim(results: Results, queue_type: str) -> tuple[bool | None, str]:
    """broker-jobs' single publish, as a ratio to raw pika, reaches Dramatiq's."""
    figure = "publish single"
    ours = results.ratio(figure, queue_type, "broker-jobs", RAW_PUBLISHER)
    theirs = results.ratio(figure, queue_type, "dramatiq", RAW_PUBLISHER)
    if math.isnan(ours) or math.isnan(theirs):
        return None, f"broker-jobs {fmt(ours)}, dramatiq {fmt(theirs)} of raw: not measured"
    return ours >= theirs, f"broker-jobs / raw pika = {ours:.2f} (>= dramatiq's {theirs:.2f})"


def drain_aim(results: Results, queue_type: str) -> tuple[bool | None, str]:
    """broker-jobs (its faster row) takes less time than every Celery and Dramatiq row:
    per row, the median of the per-round ratios of seconds is below 1."""

    rows = [r for r in results.values.get("drain total", {}).get(queue_type, {})]
    ours = [r for r in rows if r.startswith("broker-jobs")]
    if not ours:
        return None, "broker-jobs not measured"
    best = min(ours, key=lambda r: results.median("drain total", queue_type, r))
    parts: list[tuple[bool | None, str]] = []
    for other in (r for r in rows if not r.startswith("broker-jobs")):
        value = results.ratio("drain total", queue_type, best, other)
        text = f"{best} / {other} = {fmt(value)}"
        if other == RAW_WORKER:  # the reference, with raw pika publishing: not a peer
            parts.append((None, f"{text} (reference, not judged)"))
        else:
            parts.append((None if math.isnan(value) else value < 1.0, text))
    return combine([*parts, (None, "(seconds: < 1 is faster)")])


def latency_aim(results: Results, queue_type: str, raw_row: str) -> tuple[bool | None, str]:
    gaps = results.round_differences("latency p50", queue_type, BJ_ONE, raw_row)
    if not gaps:
        return None, "not measured"
    gap = statistics.median(gaps)
    rounds = ", ".join(f"{g:+.2f}" for g in gaps)
    text = f"{BJ_ONE} - raw p50 = {gap:+.2f} ms (<= {LATENCY_GAP}; rounds {rounds})"
    if on_loop := results.round_differences("latency p50", queue_type, BJ_ASYNC, raw_row):
        text += f"; {BJ_ASYNC} - raw = {statistics.median(on_loop):+.2f} ms, not judged"
    return gap <= LATENCY_GAP, text


# -- tables ------------------------------------------------------------------------------------


def table_rows(results: Results, figure: str, queue_type: str) -> list[list[str]]:

    unit, _more, _kind = FIGURES[figure]
    reference = reference_row(figure)
    digits = 0 if unit in ("jobs/s",) else 2
    rows = []
    for row in results.rows(figure, queue_type):
        why = results.na.get(figure, {}).get(queue_type, {}).get(row)
        if why is not None:
            rows.append([row, why, "", "", ""])
            continue
        found = list(results.rounds(figure, queue_type, row).values())
        ratio = results.ratio(figure, queue_type, row, reference)
        rows.append(
            [
                row,
                fmt(results.median(figure, queue_type, row), digits),
                f"{fmt(min(found), digits)} - {fmt(max(found), digits)}",
                "" if row == reference else fmt(ratio),
                ", ".join(fmt(v, digits) for v in found),
            ]
        )
    return rows


HEADER = ["row", "median", "min - max", "ratio to raw (median of rounds)", "rounds"]


def print_tables(results: Results, queue_types: Sequence[str]) -> None:

    for figure, (unit, _more, _kind) in FIGURES.items():
        for queue_type in queue_types:
            rows = table_rows(results, figure, queue_type)
            if not rows:
                continue
            print(f"\n{figure} ({unit}), {queue_type}")
            for cells in rows:
                print(f"  {cells[0]:<24} {cells[1]:>12} {cells[2]:>22} {cells[3]:>6}  {cells[4]}")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


# -- plots --------------------------------------------------------------------------------------


def slug(figure: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in figure.lower()).strip("-").replace("--", "-")


def plot(results: Results, figure: str, queue_types: Sequence[str], path: Path) -> bool:
    """Grouped bars: one group per row, one bar per queue type (its median)."""
    import matplotlib  # noqa: PLC0415 - bench extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after the backend


    rows = list(
        dict.fromkeys(r for q in queue_types for r in results.values.get(figure, {}).get(q, {}))
    )
    if not rows:
        return False
    width = 0.8 / len(queue_types)
    fig, axes = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4))
    for offset, queue_type in enumerate(queue_types):
        medians = [results.median(figure, queue_type, r) for r in rows]
        positions = [i + (offset - (len(queue_types) - 1) / 2) * width for i in range(len(rows))]
        axes.bar(positions, [0 if math.isnan(m) else m for m in medians], width, label=queue_type)
    axes.set_xticks(range(len(rows)), rows, rotation=25, ha="right", fontsize=8)
    unit, more, _kind = FIGURES[figure]
    axes.set_ylabel(f"{unit} ({'higher' if more else 'lower'} is better)")
    axes.set_title(f"{figure}: median over rounds")
    axes.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


# -- the page ------------------------------------------------------------------------------------


def page(
    *,
    options: Options,
    config: dict[str, Any],
    peers: Sequence[Peer],
    results: Results,
    verdicts: Sequence[Verdict],
    images: dict[str, str],
) -> str:

    out = [
        "# Benchmarks: broker-jobs, Celery, Dramatiq and raw AMQP",
        "",
        "<!-- Generated by bench/compare.py: do not edit by hand; rerun it. -->",
        "Generated by `bench/compare.py` (do not edit by hand). Command:",
        "",
        f"    {config['command']}",
        "",
        "Every figure is the **median over rounds**; ratios are the median of each round's"
        " ratio to raw in the same round (rounds interleave the peers, each rotation forward"
        " and then backward, so that over an even number of rounds two peers run in each"
        " order equally often, on one broker). The machine is shared and small: compare"
        " ratios, not absolute figures, and look at the rounds' spread.",
        "",
        "## Machine and versions",
        "",
    ]
    machine = config["machine"]
    out += [
        f"- CPUs: {machine['cpus']} x {machine['cpu_model']}; RAM {machine['ram']};"
        f" load average at start {machine['load_avg']}, at end {machine.get('load_avg_end', '?')}",
        "- " + ", ".join(f"{k} {v}" for k, v in config["versions"].items()),
        f"- Broker: {config['broker_origin']} ({config['broker']}); PostgreSQL:"
        f" {config['postgresql']}",
        f"- Jobs per workload: {config['jobs']:,}; rounds: {config['rounds']}; RSS after"
        f" {config['rss_jobs']:,} jobs; latency: {config['latency']}; delay: {config['delay']}",
        f"- Workloads: {', '.join(config['workloads'])}; queue types:"
        f" {', '.join(config['queue_types'])}; the run took {config.get('elapsed_min', '?')} min",
        f"- {scale_note(config)}",
        "",
        "## What each workload measures",
        "",
        "- **publish single**: N confirmed, persistent publishes one by one, no worker"
        " running (the publisher's rate *without* a worker). **publish batched**: N jobs"
        " in one batch whose confirms are awaited together, where the peer has one.",
        "- **consume**: N jobs published first; the worker process starts; jobs/s from the"
        " first job's start to the N-th's (every handler writes one record line, the same"
        " cost for every peer; startup is not counted).",
        "- **latency p50/p99**: the worker running, one confirmed publish every 1/rate s;"
        " the time from the publish call to the handler's start.",
        "- **delay lateness p50/p99**: jobs published with a 2 s delay (broker-jobs"
        " `delay=`, Celery `countdown=`, Dramatiq `delay=`): the handler's start minus"
        " (publish call + 2 s).",
        "- **drain total**: the worker running while the publisher publishes N jobs one by"
        " one: seconds from the first publish to the N-th job's start. **drain: publisher"
        " with worker** is the publisher's own rate meanwhile; compare with publish single.",
        "- **rss**: VmRSS of the worker's process tree (its session) after the jobs above"
        " were drained from a classic queue (once per row, not per round).",
        "",
        "## Each peer's configuration",
        "",
    ]
    for peer in peers:
        out.append(f"**{peer.family.name}** (rows: {', '.join(v.name for v in peer.variants)})")
        out.append("")
        out += [f"- {workload}: {setting}" for workload, setting in peer.family.settings().items()]
        out.append("")
    out += ["## Aims of issue 27 in this run", ""]
    out += markdown_table(
        ["aim", "queue", "met", "figures"],
        [[v.aim, v.queue_type, verdict_word(v.met), v.figures] for v in verdicts],
    )
    out += ["", "## Results", ""]
    for figure, (unit, more, _kind) in FIGURES.items():
        sections = [(q, table_rows(results, figure, q)) for q in options.queue_types]
        if not any(rows for _, rows in sections):
            continue
        better = "higher" if more else "lower"
        out += [f"### {figure} ({unit}, {better} is better; ratio to {reference_row(figure)})", ""]
        for queue_type, rows in sections:
            if rows:
                out += [f"{queue_type} queues:", "", *markdown_table(HEADER, rows), ""]
        if figure in images:
            out += [f"![{figure}]({images[figure]})", ""]
    if results.warnings:
        out += ["## Warnings", "", *[f"- {w}" for w in results.warnings], ""]
    return "\n".join(out) + "\n"


def scale_note(config: dict[str, Any]) -> str:
    """Say when this run was smaller than the defaults, and why that is allowed."""
    defaults = (DEFAULT_JOBS, DEFAULT_ROUNDS, DEFAULT_RSS_JOBS)
    if (config["jobs"], config["rounds"], config["rss_jobs"]) == defaults:
        return "The defaults: a full run."
    return (
        f"**Smaller than the defaults** ({DEFAULT_JOBS:,} jobs, {DEFAULT_ROUNDS} rounds, RSS"
        f" after {DEFAULT_RSS_JOBS:,} jobs): the full default run takes well over 25 minutes"
        " on this 2-core machine (each round starts ~13 worker processes per queue type and"
        " publishes every job one by one several times); rerun the defaults on a bigger one."
    )


def verdict_word(met: bool | None) -> str:
    return "not measured" if met is None else ("yes" if met else "**no**")


def json_number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


def figure_tree(
    results: Results, value: Callable[[str, str, str], float]
) -> dict[str, dict[str, dict[str, float | None]]]:
    """figure -> queue type -> row -> ``value`` (rounded; None for NaN: JSON has no NaN)."""
    return {
        figure: {
            queue_type: {row: json_number(value(figure, queue_type, row)) for row in rows}
            for queue_type, rows in by_queue.items()
        }
        for figure, by_queue in results.values.items()
    }


def report(
    options: Options, config: dict[str, Any], peers: Sequence[Peer], results: Results
) -> dict[str, Any]:
    """Print the tables and aims, write the page and plots; the JSON summary."""

    print_tables(results, options.queue_types)
    verdicts = aims(results, options.queue_types)
    print("\nAims (issue 27), on medians of ratios:")
    for verdict in verdicts:
        print(f"  [{verdict_word(verdict.met)}] {verdict.queue_type}: {verdict.aim}")
        print(f"      {verdict.figures}")
    for warning in results.warnings:
        print(f"WARNING: {warning}")
    images: dict[str, str] = {}
    image_dir = options.output.parent / "images"
    for figure in FIGURES:
        path = image_dir / f"{IMAGE_PREFIX}{slug(figure)}.png"
        if plot(results, figure, options.queue_types, path):
            images[figure] = os.path.relpath(path, options.output.parent)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(
        page(
            options=options,
            config=config,
            peers=peers,
            results=results,
            verdicts=verdicts,
            images=images,
        )
    )
    print(f"\nWrote {options.output.name} and {len(images)} plots in {image_dir.name}/")
    return {
        "config": config,
        "median": figure_tree(results, results.median),
        "ratio_to_raw": figure_tree(
            results, lambda f, q, r: results.ratio(f, q, r, reference_row(f))
        ),
        "not_applicable": results.na,
        "aims": [
            {"aim": v.aim, "queue_type": v.queue_type, "met": v.met, "figures": v.figures}
            for v in verdicts
        ],
        "warnings": results.warnings,
    }
