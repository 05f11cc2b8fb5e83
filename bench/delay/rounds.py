"""One round of ``bench.delay``: a fresh namespace, its consumer process, its delayed
jobs published at a steady rate, and what is left in its queues at the end."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from bench.common import Admin
from bench.delay.consumer import ConsumerProcess, Record
from bench.delay.options import MIN_DELAY, Options
from bench.delay.publishing import TASK, Published, fresh_app, publish_round
from topology import Topology

#: After the last publish, every job must be consumed within the longest delay plus this.
DRAIN_MARGIN = 30.0


@dataclass(frozen=True)
class Round:
    """Everything measured in one round."""

    namespace: str
    published: Published
    records: list[Record]
    errors: list[str]
    leftover: int


def run_round(options: Options, url: str, admin: Admin, index: int) -> Round:
    app = fresh_app()
    topology = app.topology()  # with the ladder: all of it, to delete afterwards
    delays = draw_delays(options, index)
    try:
        admin.declare(topology)
        consumer = ConsumerProcess(url, app.names.task_queue(TASK))
        try:
            consumer.wait_ready()
            published = asyncio.run(publish_round(url, app, delays, options.rate))
            deadline = time.time() + options.max_delay + DRAIN_MARGIN
            report = consumer.results(published.job_ids + published.warm_up_ids, deadline)
        finally:
            consumer.stop()
        leftover = queued(admin, topology)
    finally:
        admin.delete(topology)
    records = [Record(*values) for values in report["records"]]
    return Round(app.namespace, published, records, list(report["errors"]), leftover)


def draw_delays(options: Options, index: int) -> list[float]:
    """Uniform delays, reproducible from the seed and the round's index."""
    rng = random.Random(options.seed + index)
    return [rng.uniform(MIN_DELAY, options.max_delay) for _ in range(options.jobs)]


def queued(admin: Admin, topology: Topology) -> int:
    """Messages left in the round's queues (ladder, task and dead-letter queues)."""
    return sum(admin.depth(queue.name) for queue in topology.queues)
