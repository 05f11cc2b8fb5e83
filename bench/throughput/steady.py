"""The steady phase's publisher of ``bench.throughput``, in a process of its own (so
that publishing does not share the consumer's CPU time slice)."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from bench.throughput.handlers import Noop
from broker_jobs import App, JobRequest, Publisher

#: Publishing ticks of the steady phase: rate / TICKS_PER_S jobs every tick.
TICKS_PER_S = 100


def tick_sizes(rate: float, seconds: float) -> list[int]:
    """Jobs per tick so that tick k ends with round(rate * k / TICKS_PER_S) jobs sent."""
    ticks = max(1, round(seconds * TICKS_PER_S))
    sent = [round(rate * (k + 1) / TICKS_PER_S) for k in range(ticks)]
    return [b - a for a, b in zip([0, *sent[:-1]], sent, strict=True)]


@dataclass(frozen=True)
class SteadySpec:
    url: str
    namespace: str
    task: str
    rate: float
    seconds: float


def steady_publisher(spec: SteadySpec, pipe: Connection) -> None:
    """Warm up (one job in the spare slot), say ready, wait for go, publish every tick
    on schedule, and send back ``(job_id, created_at)`` by slot."""
    url, namespace, task = spec.url, spec.namespace, spec.task
    rate, seconds = spec.rate, spec.seconds
    app = App(namespace=namespace)
    app.declare(task, Noop)
    sizes = tick_sizes(rate, seconds)
    total = sum(sizes)
    sent: list[tuple[str, float]] = []
    with Publisher(url, app, connection_name="bench steady") as publisher:
        publisher.publish(task, Noop(seq=total))
        pipe.send("ready")
        pipe.recv()
        start, seq = time.perf_counter(), 0
        for index, size in enumerate(sizes):
            delay = start + index / TICKS_PER_S - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            batch = [JobRequest(task, Noop(seq=seq + i)) for i in range(size)]
            seq += size
            for job in publisher.publish_many(batch):
                sent.append((job.id, job.created_at.timestamp()))
    pipe.send(sent)


class SteadyProcess:
    """The steady publisher, started (and warmed up) before the consumer."""

    def __init__(self, url: str, namespace: str, task: str, rate: float, seconds: float):
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=steady_publisher,
            args=(SteadySpec(url, namespace, task, rate, seconds), child),
            name="bench steady publisher",
            daemon=True,
        )
        self._process.start()
        child.close()

    def wait_ready(self) -> None:
        if not self._pipe.poll(60) or self._pipe.recv() != "ready":
            raise RuntimeError("the steady publisher did not start")

    async def run(self) -> list[tuple[str, float]]:
        self._pipe.send("go")
        sent: list[tuple[str, float]] = await asyncio.to_thread(self._pipe.recv)
        return sent

    def close(self) -> None:
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
