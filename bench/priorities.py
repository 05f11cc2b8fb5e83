"""Priorities under a backlog: the order a worker starts mixed levels in, and what
the levels cost.

Each round publishes a backlog of ``--per-level`` jobs at each level (low first,
then normal, then high: a FIFO worker would start them in that order) to one task
of a fresh namespace, then drains it with a burst :class:`Worker` (memory store, in
this process) and records the level of every start. Workloads, interleaved in
every round:

- ``none`` (a task without priorities: one queue, the baseline of the drain rate),
  ``strict`` and ``6:3:1``, each for no-op jobs and for jobs of ``--job-ms``.

Figures: for strict, how many starts came before a higher level's last start
("early": a lower job started while higher work was still waiting, in the broker
or in the worker's hands); for weights, each level's share of the starts while
every level still had work (until the first level ran out), to compare with
6:3:1 = 0.6/0.3/0.1; the drain rate, as a ratio to ``none`` of the same job
length; jobs lost or run twice.

    python -m bench.priorities               # a throwaway RabbitMQ node
    python -m bench.priorities --url amqp://guest:guest@localhost:5672/ --rounds 5

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from bench.common import Admin, add_url_argument, broker, describe_broker
from broker_jobs import App, JobRequest, Publisher
from broker_jobs.store.memory import MemoryStore
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.worker import Worker, WorkerSettings
from topology.priority import Priority

TASK = "bench.levels"


class Step(BaseModel):
    key: str
    level: str


@dataclass(frozen=True)
class Workload:
    policy: str  # "strict", "6:3:1", or "none" (no priorities: the baseline)
    job_ms: float

    @property
    def name(self) -> str:
        return f"{self.policy}, {self.job_ms:g} ms jobs"


class Starts:
    def __init__(self) -> None:
        self.levels: list[str] = []
        self.keys: Counter[str] = Counter()
        self._lock = threading.Lock()

    def record(self, payload: Step) -> None:
        with self._lock:
            self.levels.append(payload.level)
            self.keys[payload.key] += 1


def run_workload(
    url: str, admin: Admin, workload: Workload, options: argparse.Namespace
) -> dict[str, Any]:
    starts = Starts()
    app = App(namespace=f"benchprio{secrets.token_hex(4)}")
    priorities = None if workload.policy == "none" else workload.policy
    pause = workload.job_ms / 1000

    @app.task(TASK, priorities=priorities, time_limit=60)
    def step(payload: Step) -> None:
        starts.record(payload)
        if pause:
            time.sleep(pause)

    levels = [Priority.LOW, Priority.NORMAL, Priority.HIGH]
    requests = [
        JobRequest(
            TASK,
            {"key": f"{level.value}-{n}", "level": level.value},
            priority=None if priorities is None else level,
        )
        for level in levels
        for n in range(options.per_level)
    ]
    try:
        with Publisher(url, app) as publisher:
            publisher.publish_many(requests)
        settings = WorkerSettings(burst=True, concurrency=options.concurrency)
        began = time.perf_counter()
        asyncio.run(Worker(url, app, MemoryStore(), settings).run())
        seconds = time.perf_counter() - began
    finally:
        admin.delete(app.topology())
    keys = {str(request.payload["key"]) for request in requests}  # type: ignore[index]
    return {
        "workload": workload.name,
        "jobs": len(requests),
        "seconds": seconds,
        "rate": len(starts.levels) / seconds,
        "lost": len(keys - set(starts.keys)),
        "twice": sum(1 for count in starts.keys.values() if count > 1),
        **order_figures(workload.policy, starts.levels),
    }


def order_figures(policy: str, started: list[str]) -> dict[str, Any]:
    if policy == "strict":
        return {"early": early_starts(started)}
    if policy == "none":
        return {}
    last = last_starts(started)
    window = started[: min(last.values()) + 1]
    counts = Counter(window)
    return {"shares": {level.value: counts[level.value] / len(window) for level in Priority}}


def last_starts(started: list[str]) -> dict[str, int]:
    """Each level's last start (its index)."""
    return {level: index for index, level in enumerate(started)}


def early_starts(started: list[str]) -> int:
    """Starts of a level before the last start of a higher one."""
    rank = {level.value: level.rank for level in Priority}
    last = last_starts(started)
    return sum(
        1
        for index, level in enumerate(started)
        if any(rank[other] < rank[level] and last[other] > index for other in last)
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_url_argument(parser)
    parser.add_argument("--per-level", type=int, default=1000, help="jobs per level (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--concurrency", type=int, default=4, help="worker concurrency (4)")
    parser.add_argument("--job-ms", type=float, default=5.0, help="a job's length (5 ms)")
    return parser.parse_args(argv)


def bench(options: argparse.Namespace, url: str, node: RabbitNode | None) -> dict[str, Any]:
    workloads = [
        Workload(policy, job_ms)
        for job_ms in (0.0, options.job_ms)
        for policy in ("none", "strict", "6:3:1")
    ]
    admin = Admin(url)
    try:
        config = {
            **describe_broker(url, node, admin),
            "per_level": options.per_level,
            "rounds": options.rounds,
            "concurrency": options.concurrency,
            "store": "memory",
            "workloads": [workload.name for workload in workloads],
        }
        print("Configuration:")
        for key, value in config.items():
            print(f"  {key}: {value}")
        rounds = []
        for index in range(options.rounds):
            found = [run_workload(url, admin, workload, options) for workload in workloads]
            for figure in found:
                print(f"round {index + 1}: {describe(figure)}")
            rounds.append(found)
    finally:
        admin.close()
    table = medians(workloads, rounds)
    print("\nMedians over rounds:")
    for row in table:
        print(f"  {describe(row)}")
    return {"bench": "priorities", "config": config, "medians": table, "rounds": rounds}


def medians(workloads: list[Workload], rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    table = []
    for index, workload in enumerate(workloads):
        runs = [found[index] for found in rounds]
        base = workloads.index(Workload("none", workload.job_ms))
        baseline = statistics.median(found[base]["rate"] for found in rounds)
        row: dict[str, Any] = {
            "workload": workload.name,
            "rate": statistics.median(run["rate"] for run in runs),
            "lost": sum(run["lost"] for run in runs),
            "twice": sum(run["twice"] for run in runs),
        }
        row["rate_vs_none"] = row["rate"] / baseline
        if "early" in runs[0]:
            row["early"] = statistics.median(run["early"] for run in runs)
        if "shares" in runs[0]:
            row["shares"] = {
                level.value: statistics.median(run["shares"][level.value] for run in runs)
                for level in Priority
            }
        table.append(row)
    return table


def describe(figure: dict[str, Any]) -> str:
    text = f"{figure['workload']}: {figure['rate']:.0f} jobs/s"
    if "rate_vs_none" in figure:
        text += f" ({figure['rate_vs_none']:.2f} x none)"
    if "early" in figure:
        text += f", early starts {figure['early']:g}"
    if "shares" in figure:
        shares = figure["shares"]
        text += ", shares " + "/".join(f"{shares[level.value]:.2f}" for level in Priority)
    return text + f", lost {figure['lost']}, twice {figure['twice']}"


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    with broker(options.url) as (url, node):
        result = bench(options, url, node)
    print(json.dumps(result, sort_keys=False))
    problems = sum(row["lost"] + row["twice"] for row in result["medians"])
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
