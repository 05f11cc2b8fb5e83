"""One drain of ``bench.celery_baseline``: a fresh queue, N tasks published, a
``celery worker`` subprocess that drains them (timed from its ``worker_ready``), the
cleanup; :func:`drain_rate` is what other benchmarks call."""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.celery_baseline.app import (
    DELAYED_DELIVERY_EXCHANGE,
    PREFETCH_MULTIPLIER,
    celery_versions,
    delayed_delivery_objects,
    make_app,
    register_noop,
)
from bench.common import REPO, Admin, child_env

if TYPE_CHECKING:
    from celery import Celery  # type: ignore[import-untyped]

POOLS = ("solo", "prefork", "threads")
QUEUE_TYPES = ("quorum", "classic")
#: Seconds to wait for the queue to hold the N published tasks, for the worker to be
#: ready, for the drain, and for the worker to stop.
FILL_TIMEOUT, READY_TIMEOUT, DRAIN_TIMEOUT, STOP_TIMEOUT = 120.0, 60.0, 300.0, 30.0
POLL_S = 0.005
#: The first argument of ``python -m bench.celery_baseline`` in the worker subprocess.
WORKER_CHILD = "_worker"


# -- the worker subprocess -----------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    queue: str
    jobs: int
    pool: str
    concurrency: int
    status: str  # a file: "ready <monotonic>" and "done <monotonic>" lines are appended
    queue_type: str = "quorum"
    prefetch_multiplier: int = PREFETCH_MULTIPLIER

    def argv(self) -> list[str]:
        return [
            "worker",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-Q",
            self.queue,
            "-l",
            "warning",
            "-n",
            f"{self.queue}@%h",
        ]


def run_worker(spec: WorkerSpec) -> None:
    """In the subprocess: a Celery worker that writes the ready and done moments.

    The count lives in shared memory created before the prefork pool forks its children,
    so the N-th task to finish, in whichever process, writes the done moment.
    ``time.monotonic()`` is the system-wide CLOCK_MONOTONIC, comparable across processes.
    """
    from celery import signals  # noqa: PLC0415 - optional dependency, imported on use

    status = Path(spec.status)

    def report(what: str, value: float | None = None) -> None:
        with status.open("a") as stream:
            stream.write(f"{what} {time.monotonic() if value is None else value!r}\n")

    # Shared by the pool's children: tasks done, the last one's moment, the longest gap
    # between two consecutive completions (a stall shows there).
    context = multiprocessing.get_context("fork")
    counter = context.Value("q", 0)
    last, longest = context.RawValue("d", math.nan), context.RawValue("d", 0.0)
    jobs = spec.jobs

    def count() -> None:
        with counter.get_lock():
            now = time.monotonic()
            longest.value = max(longest.value, now - last.value) if counter.value else 0.0
            last.value = now
            counter.value += 1
            done = counter.value == jobs
        if done:
            report("gap", longest.value)
            report("done", now)

    def on_ready(**_: Any) -> None:
        report("ready")

    signals.worker_ready.connect(on_ready, weak=False)
    app = make_app(spec.url, spec.queue, spec.queue_type, spec.prefetch_multiplier)
    register_noop(app, count)
    app.worker_main(spec.argv())


# -- one drain --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CeleryDrain:
    """One drain of ``jobs`` tasks by one worker."""

    pool: str
    concurrency: int
    jobs: int
    rate: float  # jobs / (worker_ready to the N-th task done)
    rate_from_spawn: float  # jobs / (subprocess spawn to the N-th task done)
    startup_s: float  # subprocess spawn to worker_ready
    fill_s: float  # untimed: publishing the N tasks until the queue held them
    left: int  # ready messages left in the queue after the worker stopped
    longest_gap_s: float  # the longest time between two consecutive task completions
    prefetch: int  # the worker's prefetch count: multiplier x concurrency


def fill(app: Celery, admin: Admin, queue: str, jobs: int) -> float:
    """Publish ``jobs`` no-op tasks (no confirms) and wait until the queue holds them."""
    noop = register_noop(app)
    start = time.perf_counter()
    with app.connection_for_write() as connection:
        app.amqp.queues[queue].bind(connection.default_channel).declare()
        with app.producer_or_acquire() as producer:
            for _ in range(jobs):
                noop.apply_async(producer=producer)
    deadline = time.monotonic() + FILL_TIMEOUT
    while (depth := admin.depth_if_exists(queue)) != jobs:
        if depth is not None and depth > jobs:
            raise RuntimeError(f"{queue} holds {depth} messages, more than {jobs}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{queue} holds {depth} of {jobs} tasks after {FILL_TIMEOUT:g} s")
        time.sleep(0.02)
    return time.perf_counter() - start


def read_status(path: Path) -> dict[str, float]:
    moments: dict[str, float] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            what, _, moment = line.partition(" ")
            moments[what] = float(moment)
    return moments


@contextlib.contextmanager
def worker_process(spec: WorkerSpec, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The worker subprocess, warm-shut-down (SIGTERM) on exit, killed if it hangs."""
    command = [sys.executable, "-m", "bench.celery_baseline", WORKER_CHILD]
    command.append(json.dumps(asdict(spec)))
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=child_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            # Its own session: the group is the worker and its pool children only.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def log_tail(log: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


def wait_for(
    status: Path, what: str, process: subprocess.Popen[bytes], timeout: float, log: Path
) -> float:
    deadline = time.monotonic() + timeout
    while (moment := read_status(status).get(what)) is None:
        if process.poll() is not None:
            raise RuntimeError(
                f"the celery worker exited ({process.returncode}) before '{what}':\n"
                + log_tail(log)
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"no '{what}' from the celery worker after {timeout:g} s")
        time.sleep(POLL_S)
    return moment


def drain(
    url: str,
    jobs: int,
    *,
    concurrency: int = 1,
    pool: str = "solo",
    queue_type: str = "quorum",
    prefetch_multiplier: int = PREFETCH_MULTIPLIER,
) -> CeleryDrain:
    """One round: a fresh queue, N tasks published, a worker drains them, cleanup.

    ``queue_type="classic"`` is for diagnosis only: the comparison is on quorum queues.
    """
    celery_versions()
    if (
        min(jobs, concurrency, prefetch_multiplier) < 1
        or pool not in POOLS
        or queue_type not in QUEUE_TYPES
    ):
        raise ValueError(
            f"bad drain: jobs={jobs}, concurrency={concurrency}, pool={pool!r},"
            f" queue_type={queue_type!r}, prefetch_multiplier={prefetch_multiplier}"
        )
    queue = f"bench-celery-{secrets.token_hex(4)}"
    app = make_app(url, queue, queue_type, prefetch_multiplier)
    admin = Admin(url, "bench celery admin")
    delayed_queues, delayed_exchanges = delayed_delivery_objects()
    delayed_existed = admin.depth_if_exists(delayed_queues[0]) is not None or admin.exchange_exists(
        DELAYED_DELIVERY_EXCHANGE
    )
    try:
        fill_s = fill(app, admin, queue, jobs)
        app.close()  # the publisher's connections: not open while the worker drains
        with tempfile.TemporaryDirectory(prefix="bcel") as directory:
            status, log = Path(directory) / "status", Path(directory) / "worker.log"
            spec = WorkerSpec(
                url, queue, jobs, pool, concurrency, str(status), queue_type, prefetch_multiplier
            )
            spawned = time.monotonic()
            with worker_process(spec, log) as process:
                ready = wait_for(status, "ready", process, READY_TIMEOUT, log)
                done = wait_for(status, "done", process, DRAIN_TIMEOUT, log)
                longest_gap = read_status(status).get("gap", math.nan)
        left = admin.depth_if_exists(queue) or 0  # after the worker stopped: unacked ones are back
    finally:
        app.close()
        admin.delete_named([queue], [queue])
        if not delayed_existed:
            admin.delete_named(delayed_queues, delayed_exchanges)
        admin.close()
    return CeleryDrain(
        pool=pool,
        concurrency=concurrency,
        jobs=jobs,
        rate=jobs / (done - ready),
        rate_from_spawn=jobs / (done - spawned),
        startup_s=ready - spawned,
        fill_s=fill_s,
        left=left,
        longest_gap_s=longest_gap,
        prefetch=prefetch_multiplier * concurrency,
    )


def drain_rate(
    url: str,
    jobs: int,
    *,
    concurrency: int = 1,
    pool: str = "solo",
    prefetch_multiplier: int = PREFETCH_MULTIPLIER,
) -> float:
    """Celery's drain rate (jobs/s) on this machine: see the module's docstring.

    One drain (a fresh quorum queue, ``jobs`` tasks, one worker); call it once per round
    and take the median. Raises CeleryMissingError when celery is not installed.
    """
    return drain(
        url, jobs, concurrency=concurrency, pool=pool, prefetch_multiplier=prefetch_multiplier
    ).rate
