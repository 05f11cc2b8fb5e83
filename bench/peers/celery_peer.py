"""Celery: ``celery worker`` (solo, prefork) on the app of bench/celery_baseline/, with
the settings documented for throughput, and ``apply_async`` with publisher confirms.

    python -m bench.peers.celery_peer worker SPEC_JSON    # the worker process
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.celery_baseline.app import PREFETCH_MULTIPLIER, delayed_delivery_objects, make_app
from bench.common import Admin

from .common import FamilyBase, OwnQueueLane, Variant, WorkerProcess, python_command, record

if TYPE_CHECKING:
    from celery import Celery  # type: ignore[import-untyped]
    from celery.app.task import Task  # type: ignore[import-untyped]

NAME = "celery"
TASK = "bench.compare_noop"


def noop_task(app: Celery) -> Task:
    @app.task(name=TASK, acks_late=True, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def noop(seq: int) -> None:
        record(seq)

    return noop


def fair_app(url: str, queue: str, queue_type: str, *, confirm: bool) -> Celery:
    """``make_app`` with a topic exchange: Celery's native delayed delivery (quorum
    queues) does not route through direct exchanges, and a classic queue does not mind."""
    return make_app(
        url, queue, queue_type, PREFETCH_MULTIPLIER, exchange_type="topic", confirm_publish=confirm
    )


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    queue: str
    queue_type: str
    pool: str
    concurrency: int


def run_worker(spec: WorkerSpec) -> None:
    app = fair_app(spec.url, spec.queue, spec.queue_type, confirm=False)
    noop_task(app)
    argv = ["worker", "-P", spec.pool, "-c", str(spec.concurrency), "-Q", spec.queue]
    # No gossip, mingle, heartbeat events or remote control: idle costs during a drain.
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    argv += ["-l", "warning", "-n", f"{spec.queue}@%h"]
    app.worker_main(argv)


class CeleryPublisher:
    """``apply_async`` on an app with ``confirm_publish``: each call waits for its confirm."""

    def __init__(self, url: str, queue: str, queue_type: str) -> None:
        self._app = fair_app(url, queue, queue_type, confirm=True)
        self._task = noop_task(self._app)

    def publish(self, seq: int, delay: float | None = None) -> None:
        if delay is None:
            self._task.apply_async(args=(seq,))
        else:
            self._task.apply_async(args=(seq,), countdown=delay)

    def publish_batch(self, seqs: range) -> None:
        raise NotImplementedError("Celery has no batched confirm")

    def close(self) -> None:
        self._app.close()


@dataclass
class CeleryLane(OwnQueueLane):
    PREFIX = "celery"

    def declare(self) -> None:
        app = fair_app(self.url, self.queue, self.queue_type, confirm=False)
        try:
            with app.connection_for_write() as connection:
                app.amqp.queues[self.queue].bind(connection.default_channel).declare()
        finally:
            app.close()

    def publisher(self) -> CeleryPublisher:
        return CeleryPublisher(self.url, self.queue, self.queue_type)

    def fill(self, seqs: range) -> None:
        """Without confirms, one producer (untimed: only the queue's content matters)."""
        app = fair_app(self.url, self.queue, self.queue_type, confirm=False)
        noop = noop_task(app)
        try:
            with app.producer_or_acquire() as producer:
                for seq in seqs:
                    noop.apply_async(args=(seq,), producer=producer)
        finally:
            app.close()

    def worker(self, variant: Variant, workdir: Path) -> WorkerProcess:
        spec = WorkerSpec(self.url, self.queue, self.queue_type, variant.pool, variant.processes)
        argv = python_command("-m", "bench.peers.celery_peer", "worker", json.dumps(asdict(spec)))
        return WorkerProcess(variant.name, argv, workdir)

    def owned(self) -> tuple[list[str], list[str]]:
        return [self.queue], [self.queue]


def delete_delayed_delivery(url: str) -> None:
    """What Celery declares for native delayed delivery (28 levels): once, at the end."""
    with Admin(url) as admin:
        admin.delete_named(*delayed_delivery_objects())


def delayed_delivery_existed(url: str) -> bool:
    with Admin(url) as admin:
        return admin.exchange_exists(delayed_delivery_objects()[1][-1])


class CeleryFamily(FamilyBase):
    name = NAME
    batch_na: str | None = (
        "n/a: Celery has no batched confirm (group/chord publish each task, one confirm each)"
    )

    def lane(self, url: str, queue_type: str) -> CeleryLane:
        return CeleryLane(url, queue_type)

    def settings(self) -> dict[str, str]:
        return {
            "publish": "task.apply_async(args=(seq,)) on an app with broker_transport_options="
            '{"confirm_publish": True} (each publish waits for its confirm);'
            " delayed: apply_async(countdown=2)",
            "worker": "celery worker -P solo -c 1 | -P prefork -c 2 (one per CPU: the"
            " documented default), --without-gossip --without-mingle --without-heartbeat,"
            f" -l warning; worker_prefetch_multiplier={PREFETCH_MULTIPLIER} (Celery's"
            " optimizing guide raises it for many short tasks; default 4),"
            " task_acks_late=True (acked after the task, like the others),"
            " task_ignore_result=True, result_backend=None, worker_enable_remote_control=False",
            "queue": "task_queues=(Queue(..., durable=True, queue_arguments={'x-queue-type':"
            " 'classic'|'quorum'}),) behind a topic exchange; worker_detect_quorum_queues=True"
            " (per-consumer QoS on quorum queues), broker_native_delayed_delivery_queue_type"
            "='quorum' (the default: countdown on quorum queues goes through Celery's"
            " celery_delayed_* queues; on classic queues the worker holds ETA tasks)",
        }


VARIANTS = (
    Variant("celery solo", NAME, processes=1, pool="solo"),
    Variant("celery prefork 2", NAME, processes=2, pool="prefork"),
)


def main(argv: list[str]) -> int:
    if argv[:1] != ["worker"] or len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    fields: dict[str, Any] = json.loads(argv[1])
    run_worker(WorkerSpec(**fields))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
