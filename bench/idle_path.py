"""``python -m bench.idle_path``: where an idle worker's publish-to-start time goes.

A worker (in this process, on a ``WatchedLoop`` and reading whole frames, as
``broker-jobs worker`` runs it; memory store, ``--concurrency 8``, a sync no-op
handler) takes one confirmed job every ``--interval`` seconds from a publisher in
another process. Each step of the fast path is stamped on the monotonic clock the two
processes share: the publish call, the last bytes read from the connection before the
delivery (``StreamReader.feed_data``), the delivery handed to the fast path, decoded,
the claim's start and end, the job posted to the handler threads, a thread running
it, the handler's start. Figures: the median of each step over the jobs after
``--warmup``, in µs. The steps are instrumented by wrapping the fast path's methods
for the run (a diagnostic: the wrappers cost a few µs themselves).

Before stop 59 the worker here read its frames through aiormq's own path (``broker-jobs
worker`` reads whole frames: :mod:`broker_jobs.worker.frame_reading`), so the earlier
figures of docs/worker.md from this command measured a slower read than a worker's.

    python -m bench.idle_path                      # 300 jobs, one every 10 ms
    python -m bench.idle_path --jobs 100 --warmup 10   # a smoke run

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from bench.common import (
    Admin,
    add_number,
    bench_parser,
    describe_broker,
    from_args,
    measure_workers_on_broker,
    print_config,
)
from broker_jobs import App, Publisher, QueueOptions
from broker_jobs.store.memory import MemoryStore
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.watched_loop import WatchedLoop
from broker_jobs.worker import Worker, WorkerSettings, fast_path, frame_reading

TASK = "bench.idle"

#: The steps, in order: (from, to) stamps.
STEPS = (
    ("publish", "read"),
    ("read", "deliver"),
    ("deliver", "decoded"),
    ("decoded", "claiming"),
    ("claiming", "claimed"),
    ("claimed", "posted"),
    ("posted", "on thread"),
    ("on thread", "started"),
    ("deliver", "started"),
    ("publish", "started"),
)


class Idle(BaseModel):
    n: int


@dataclass(frozen=True)
class Options:
    url: str | None
    jobs: int
    interval: float
    warmup: int


class Stamps:
    """When each job reached each step (``time.monotonic()``), by the job's number."""

    def __init__(self) -> None:
        self.at: dict[int, dict[str, float]] = {}

    def mark(self, step: str, n: int, at: float | None = None) -> None:
        """Job ``n`` reached ``step`` now (or ``at``); the first time counts."""
        self.at.setdefault(n, {}).setdefault(step, time.monotonic() if at is None else at)

    def medians(self, skip: int) -> dict[str, float]:
        rows = [row for n, row in self.at.items() if n >= skip and "started" in row]
        found = {}
        for start, end in STEPS:
            spans = [row[end] - row[start] for row in rows if start in row and end in row]
            if spans:
                found[f"{start} -> {end}"] = statistics.median(spans) * 1e6
        return found


class StampedStore(MemoryStore):
    """The memory store, stamping the claims the loop makes at once."""

    def __init__(self, stamps: Stamps) -> None:
        super().__init__()
        self._stamps = stamps

    def try_claim_many(self, claims: Any, lease: float) -> Any:
        for job, _ in claims:
            self._stamps.mark("claiming", job.payload["n"])
        found = super().try_claim_many(claims, lease)
        for job, _ in claims:
            self._stamps.mark("claimed", job.payload["n"])
        return found


@contextlib.contextmanager
def stamped_fast_path(stamps: Stamps) -> Iterator[None]:
    """The fast path's steps stamped for the run, restored after."""
    path = fast_path.FastPath
    originals = {name: getattr(path, name) for name in ("deliver", "_fast", "_start", "_run")}
    feed_data = asyncio.StreamReader.feed_data
    read_at = [0.0]

    def fed(self: asyncio.StreamReader, data: bytes) -> None:
        read_at[0] = time.monotonic()  # the last read before a delivery is its own
        feed_data(self, data)

    def deliver(self: Any, delivered: Any, task: str, acks: Any) -> None:
        at = time.monotonic()  # before the body is parsed for the job's number
        n = Idle.model_validate_json(delivered.body).n
        stamps.mark("read", n, read_at[0])
        stamps.mark("deliver", n, at)
        originals["deliver"](self, delivered, task, acks)

    def fast(self: Any, delivered: Any, task: str, acks: Any) -> Any:
        item = originals["_fast"](self, delivered, task, acks)
        if item is not None:
            stamps.mark("decoded", item.payload.n)
        return item

    def start(self: Any, items: Any, claims: Any) -> None:
        for item in items:
            stamps.mark("posted", item.payload.n)
        originals["_start"](self, items, claims)

    def run(self: Any, item: Any) -> None:
        stamps.mark("on thread", item.payload.n)
        originals["_run"](self, item)

    replaced: dict[str, Callable[..., Any]] = {
        "deliver": deliver, "_fast": fast, "_start": start, "_run": run,
    }  # fmt: skip
    for name, function in replaced.items():
        setattr(path, name, function)
    asyncio.StreamReader.feed_data = fed  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        asyncio.StreamReader.feed_data = feed_data  # type: ignore[method-assign]
        for name, function in originals.items():
            setattr(path, name, function)


def publish_paced(url: str, namespace: str, jobs: int, interval: float, out: Any) -> None:
    """In the publisher's process: one confirmed job every ``interval`` s; sends each
    job's (number, publish call time) to ``out``."""
    with Publisher(url, namespace=namespace) as publisher:
        began = time.monotonic()
        for n in range(jobs):
            pause = began + n * interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            sent = time.monotonic()
            publisher.publish(TASK, {"n": n})
            out.send((n, sent))
    out.close()


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    stamps = Stamps()
    app = App(namespace=f"benchidle{secrets.token_hex(4)}")

    @app.task(TASK, queue=QueueOptions())  # no time limit: as bench.compare's
    def idle(payload: Idle) -> None:
        stamps.mark("started", payload.n)

    with Admin(url) as admin:
        config = describe_broker(url, node, admin)
        admin.declare(app.topology())
    config.update(
        jobs=options.jobs,
        interval=f"{options.interval:g} s",
        warmup=options.warmup,
        worker="in this process, WatchedLoop, whole frames, memory store, concurrency 8,"
        " sync no-op",
    )
    print_config("Where an idle worker's publish-to-start time goes", config, 10)
    worker = Worker(url, app, StampedStore(stamps), WorkerSettings(concurrency=8))
    loop = WatchedLoop()
    # A daemon thread: a worker that does not stop cannot hold the process at its exit.
    serving = threading.Thread(
        target=loop.run_until_complete, args=(_reading_whole_frames(worker),), daemon=True
    )
    try:
        with stamped_fast_path(stamps):
            serving.start()
            try:
                _wait_consuming(url, app)
                _publish_from_another_process(url, app.namespace, options, stamps)
                deadline = time.monotonic() + 30
                while len(_started(stamps)) < options.jobs and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:  # also when the publisher or the wait failed
                loop.call_soon_threadsafe(worker.stop)
                serving.join(60)
    finally:
        if not serving.is_alive():
            loop.close()
        with Admin(url) as admin:
            admin.delete(app.topology())
    figures = stamps.medians(options.warmup)
    print(f"\n{len(_started(stamps)) - options.warmup} jobs (medians, µs):")
    for step, value in figures.items():
        print(f"  {step:<22} {value:7.0f}")
    return {"config": config, "median_us": figures}


async def _reading_whole_frames(worker: Worker) -> Any:
    """``worker.run()`` reading whole frames in one step, as ``broker-jobs worker``
    runs it (:mod:`broker_jobs.worker.frame_reading`; entered on the running loop)."""
    with frame_reading.reading_whole_frames():
        return await worker.run()


def _started(stamps: Stamps) -> list[int]:
    return [n for n, row in stamps.at.items() if "started" in row]


def _wait_consuming(url: str, app: App) -> None:
    queue = app.names.task_queue(TASK)
    with Admin(url) as admin:
        deadline = time.monotonic() + 60
        while admin.consumers(queue) == 0:
            if time.monotonic() > deadline:
                raise SystemExit("the worker did not start consuming within 60 s")
            time.sleep(0.05)


def _publish_from_another_process(
    url: str, namespace: str, options: Options, stamps: Stamps
) -> None:
    context = multiprocessing.get_context("spawn")
    receiving, sending = context.Pipe(duplex=False)
    publisher = context.Process(
        target=publish_paced, args=(url, namespace, options.jobs, options.interval, sending)
    )
    publisher.start()
    sending.close()
    with contextlib.suppress(EOFError):
        while True:
            n, sent = receiving.recv()
            stamps.at.setdefault(n, {})["publish"] = sent
    publisher.join(60)
    if publisher.exitcode != 0:
        raise SystemExit(f"the publisher failed (exit code {publisher.exitcode})")


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("idle_path", __doc__)
    add_number(parser, "--jobs", int, 300, "jobs")
    add_number(parser, "--interval", float, 0.01, "seconds between two publishes")
    add_number(parser, "--warmup", int, 20, "first jobs left out of the medians")
    args = parser.parse_args(argv)
    if args.jobs <= args.warmup or args.interval <= 0 or args.warmup < 0:
        parser.error("--jobs must exceed --warmup; --interval must be positive")
    return from_args(Options, args)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    return measure_workers_on_broker(options.url, lambda url, node: bench(options, url, node))


if __name__ == "__main__":
    sys.exit(main())
