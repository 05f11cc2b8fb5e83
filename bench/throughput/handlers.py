"""The app of ``bench.throughput`` and what its no-op handlers record: each one's start
time by slot (:data:`RECORDER`), and each success counted by the timed stores."""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel

from bench.throughput.options import Options
from broker_jobs import App
from broker_jobs.store import MemoryStore, SQLiteStore, Store
from topology import Topology

TASK = "bench.noop"
TASK_ASYNC = "bench.noop_async"


class Noop(BaseModel):
    """The benchmark tasks' payload: a slot number in the recorder."""

    seq: int


class Recorder:
    """Handler start times (``time.time()``) by slot; preallocated per phase."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def reset(self, slots: int) -> None:
        self.starts = [math.nan] * slots

    def seen(self) -> int:
        return sum(1 for moment in self.starts if not math.isnan(moment))


RECORDER = Recorder()


def make_app(namespace: str) -> App:
    app = App(namespace=namespace)

    @app.task(TASK)
    def noop(payload: Noop) -> None:
        starts = RECORDER.starts
        if payload.seq < len(starts):
            starts[payload.seq] = time.time()

    @app.task(TASK_ASYNC)
    async def noop_async(payload: Noop) -> None:
        starts = RECORDER.starts
        if payload.seq < len(starts):
            starts[payload.seq] = time.time()

    return app


class Settled:
    """Counts recorded successes (the worker's last step before the ack)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.last = math.nan  # time.perf_counter() of the latest

    def add(self, count: int = 1) -> None:
        with self.lock:
            self.count += count
            self.last = time.perf_counter()


class CountsSuccesses(Store):
    """A store that counts the successes it records into ``settled``: one at a time
    (the per-delivery path's batches of one too) or in the fast path's batches
    (``try_succeed_many`` of the memory store lands in ``succeed_many``)."""

    settled: Settled

    def succeed(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        super().succeed(key, worker, now=now)
        self.settled.add()

    def succeed_many(self, finished: Sequence[tuple[str, str]]) -> list[str]:
        lost = super().succeed_many(finished)
        self.settled.add(len(finished) - len(lost))
        return lost


class TimedSQLiteStore(CountsSuccesses, SQLiteStore):
    def __init__(self, path: Path, settled: Settled) -> None:
        super().__init__(path)
        self.settled = settled


class TimedMemoryStore(CountsSuccesses, MemoryStore):
    def __init__(self, settled: Settled) -> None:
        super().__init__()
        self.settled = settled


@dataclass(frozen=True)
class Target:
    url: str
    app: App
    options: Options

    @classmethod
    def fresh(cls, url: str, options: Options) -> Target:
        return cls(url, make_app(f"bthr{secrets.token_hex(4)}"), options)

    def queue(self, task: str) -> str:
        return self.app.names.task_queue(task)

    @property
    def topology(self) -> Topology:
        return self.app.topology()
