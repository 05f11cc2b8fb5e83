"""Dramatiq: ``RabbitmqBroker(confirm_delivery=True)`` and a no-op actor.

The worker is ``dramatiq bench.peers.dramatiq_app --processes P --threads T``; this module
builds its broker and actor from the environment the bench sets. Dramatiq declares its
own queues (``<q>``, ``<q>.DQ`` for delays, ``<q>.XQ`` for dead letters) with only
``x-dead-letter-*`` (and ``x-max-priority``) arguments: classic queues, no queue-type
option (``RabbitmqBroker._build_queue_arguments``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from .common import FamilyBase, OwnQueueLane, Variant, WorkerProcess, python_command, record

NAME = "dramatiq"
ACTOR = "bench_compare_noop"
URL_ENV, QUEUE_ENV = "BENCH_DRAMATIQ_URL", "BENCH_DRAMATIQ_QUEUE"
#: Dramatiq's default: each worker process prefetches 2 x its threads (worker.py).
DEFAULT_PREFETCH_PER_THREAD = 2
QUORUM_NA = "n/a: Dramatiq declares classic queues (no queue-type option)"


def make_actor(url: str, queue: str, *, confirm: bool) -> Any:
    broker = RabbitmqBroker(url=url, confirm_delivery=confirm)

    def noop(seq: int) -> None:
        record(seq)

    decorate = dramatiq.actor(actor_name=ACTOR, queue_name=queue, broker=broker, max_retries=0)
    return decorate(noop)


class DramatiqPublisher:
    """``actor.send``: with ``confirm_delivery=True`` each publish waits for its confirm."""

    def __init__(self, url: str, queue: str) -> None:
        self._actor = make_actor(url, queue, confirm=True)

    def publish(self, seq: int, delay: float | None = None) -> None:
        if delay is None:
            self._actor.send(seq)
        else:
            self._actor.send_with_options(args=(seq,), delay=int(delay * 1000))

    def publish_batch(self, seqs: range) -> None:
        raise NotImplementedError("Dramatiq has no batched confirm")

    def close(self) -> None:
        self._actor.broker.close()


@dataclass
class DramatiqLane(OwnQueueLane):
    PREFIX = "dramatiq"

    def declare(self) -> None:
        if self.queue_type != "classic":
            raise ValueError(QUORUM_NA)
        actor = make_actor(self.url, self.queue, confirm=False)
        try:
            actor.broker.declare_queue(self.queue, ensure=True)
        finally:
            actor.broker.close()

    def publisher(self) -> DramatiqPublisher:
        return DramatiqPublisher(self.url, self.queue)

    def fill(self, seqs: range) -> None:
        """Without confirms (untimed: only the queue's content matters)."""
        actor = make_actor(self.url, self.queue, confirm=False)
        try:
            for seq in seqs:
                actor.send(seq)
        finally:
            actor.broker.close()

    def worker(self, variant: Variant, workdir: Path) -> WorkerProcess:
        argv = python_command(
            "-m", "dramatiq", "bench.peers.dramatiq_app",
            "--processes", str(variant.processes), "--threads", str(variant.threads),
            "--queues", self.queue,
        )  # fmt: skip
        env = {URL_ENV: self.url, QUEUE_ENV: self.queue}
        return WorkerProcess(variant.name, argv, workdir, env)

    def owned(self) -> tuple[list[str], list[str]]:
        return [self.queue, f"{self.queue}.DQ", f"{self.queue}.XQ"], []


class DramatiqFamily(FamilyBase):
    name = NAME
    batch_na: str | None = (
        "n/a: Dramatiq has no batched confirm (group/pipeline enqueue each message,"
        " one confirm each)"
    )

    def queue_type_na(self, queue_type: str) -> str | None:
        return None if queue_type == "classic" else QUORUM_NA

    def lane(self, url: str, queue_type: str) -> DramatiqLane:
        return DramatiqLane(url, queue_type)

    def settings(self) -> dict[str, str]:
        return {
            "publish": "actor.send(seq) on RabbitmqBroker(confirm_delivery=True) (each"
            " publish waits for its confirm); delayed: send_with_options(delay=2000)",
            "worker": "dramatiq bench.peers.dramatiq_app --processes 1|2 --threads 8,"
            " default middleware, default prefetch (dramatiq_queue_prefetch unset:"
            f" {DEFAULT_PREFETCH_PER_THREAD} x threads = 16 per process; delay queue"
            " 1000 x threads), max_retries=0 (a no-op never fails)",
            "queue": "declared by Dramatiq: durable classic <q>, <q>.DQ, <q>.XQ;"
            " quorum: " + QUORUM_NA,
        }


VARIANTS = (
    Variant("dramatiq 1x8", NAME, processes=1, threads=8),
    Variant("dramatiq 2x8", NAME, processes=2, threads=8),
)

if os.environ.get(QUEUE_ENV):
    # In the worker: the broker and actor ``dramatiq`` finds when it imports this module.
    noop_actor = make_actor(os.environ[URL_ENV], os.environ[QUEUE_ENV], confirm=False)
    dramatiq.set_broker(noop_actor.broker)
