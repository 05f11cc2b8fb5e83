"""The scenario of ``bench.recovery``: the app its workers load, the worker processes,
and each round: kill -9 of the node, its restart, and what is timed after broker up."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench import workers as bench_workers
from bench.effects import Effects
from bench.load import Load
from bench.recovery.options import Options
from bench.workers import Record, WorkerProcess, stop_workers
from broker_jobs import App
from broker_jobs.testing.rabbit_node import RabbitNode

TASK = "bench.effect"
APP_MODULE = "recovery_app"
#: Seconds the workers have to start consuming and run a first job.
START_TIMEOUT = 60.0
#: Seconds after broker up for a round to see a job run and both workers consume.
RECOVERY_TIMEOUT = 30.0
#: Seconds the workers have to exit after SIGTERM.
STOP_TIMEOUT = 40.0
#: Seconds between two probes of the AMQP port while the node is down.
PROBE_EVERY = 0.005

#: Worker WARNINGs expected: a lost broker's, and the one at start about the task
#: having no time limit (the bench's handler is a single INSERT).
EXPECTED_WARNINGS = (
    "lost the broker at ",
    "no broker yet: ",
    "still no broker after ",
    f"task {TASK} has no time limit",
)
BACK_AFTER = re.compile(r"broker link back at .* after ([\d.]+) s without it")

APP_SOURCE = '''\
"""The app of one bench.recovery run (written by bench/recovery/rounds.py)."""

import os
import time

from pydantic import BaseModel

from broker_jobs import App


class Effect(BaseModel):
    key: str


app = App(namespace={namespace!r})


@app.task({task!r}, transactional=True)
def effect(payload: Effect, db) -> None:
    """Record the run in the store's transaction: it commits with the job's outcome."""
    db.execute({insert!r}, (payload.key, time.time(), os.getpid()))
'''


def write_app(workdir: Path, namespace: str, effects: Effects) -> App:
    """Write the app module the workers load (``recovery_app:app``) and load it here."""
    source = APP_SOURCE.format(namespace=namespace, task=TASK, insert=effects.insert_sql())
    return bench_workers.write_app(workdir, APP_MODULE, source)


# -- the workers --------------------------------------------------------------------------


class Workers:
    """The worker processes, their stderr read (and parsed) by one thread each."""

    def __init__(self, url: str, store_url: str, options: Options, workdir: Path) -> None:
        args = ["--url", url, f"{APP_MODULE}:app", "--store", store_url]
        args += ["--concurrency", str(options.concurrency)]
        self.every = [
            WorkerProcess.spawn(f"w{index}", args, workdir)
            for index in range(1, options.workers + 1)
        ]

    def exited(self) -> list[WorkerProcess]:
        return [worker for worker in self.every if not worker.alive]

    def stop(self) -> dict[str, int | None]:
        """SIGTERM each worker; their exit codes (None: still running, then killed)."""
        return stop_workers(self.every, STOP_TIMEOUT)

    def levels(self) -> dict[str, dict[str, int]]:
        """Each worker's log records by level ("?": output that is not a log line)."""
        return {w.name: dict(Counter(r.level for r in list(w.records))) for w in self.every}

    def stray(self) -> list[tuple[str, Record]]:
        return [
            (w.name, r)
            for w in self.every
            for r in list(w.records)
            if not r.expected(EXPECTED_WARNINGS)
        ]


    def exits(self) -> str:
        """The workers that exited, with their exit codes (``w1 (1), w2 (-9)``); empty
        while every one runs."""
        return ", ".join(f"{w.name} ({w.process.returncode})" for w in self.exited())


# -- rounds -------------------------------------------------------------------------------


@dataclass
class Round:
    """One kill -9: wall times (``time.time()``) and what was seen after it."""

    number: int
    killed_at: float
    dead_at: float  # kill() returned: beam gone, ports free
    up_at: float | None = None  # the AMQP port first accepted a connection
    start_returned_at: float | None = None
    first_run_at: float | None = None
    published_again_at: float | None = None  # the first confirm after broker up
    consuming_at: dict[str, float | None] = field(default_factory=dict)
    loss_noticed_at: dict[str, float | None] = field(default_factory=dict)
    outage_logged: dict[str, float | None] = field(default_factory=dict)
    not_published: int = 0
    carried_over: int = 0
    error: str | None = None

    def after_up(self, moment: float | None) -> float | None:
        if moment is None or self.up_at is None:
            return None
        return moment - self.up_at

    @property
    def downtime(self) -> float | None:
        return None if self.up_at is None else self.up_at - self.killed_at

    @property
    def first_run(self) -> float | None:
        return self.after_up(self.first_run_at)

    @property
    def all_consuming(self) -> float | None:
        times = list(self.consuming_at.values())
        if not times or any(t is None for t in times):
            return None
        return self.after_up(max(t for t in times if t is not None))


def probe_port(port: int, found: list[float], stop: threading.Event) -> None:
    """Append the first moment a TCP connection to ``port`` succeeds."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                found.append(time.time())
                return
        except OSError:
            time.sleep(PROBE_EVERY)


def kill_and_restart(node: RabbitNode, number: int) -> Round:
    killed_at = time.time()
    node.kill()
    dead_at = time.time()
    accepted: list[float] = []
    stop = threading.Event()
    probe = threading.Thread(target=probe_port, args=(node.amqp_port, accepted, stop))
    probe.start()
    try:
        node.start()
    finally:
        start_returned_at = time.time()
        stop.set()
        probe.join()
    record = Round(number, killed_at, dead_at, start_returned_at=start_returned_at)
    record.up_at = accepted[0] if accepted else start_returned_at
    return record


def wait_recovered(record: Round, workers: Workers, effects: Effects, load: Load) -> None:
    """Wait for a job to run after broker up and for every worker to consume again."""
    assert record.up_at is not None
    deadline = time.monotonic() + RECOVERY_TIMEOUT
    while True:
        if record.first_run_at is None:
            record.first_run_at = effects.first_after(record.up_at)
        for worker in workers.every:
            consuming = worker.first(" consuming ", record.killed_at)
            record.consuming_at[worker.name] = consuming.at if consuming else None
        done = record.first_run_at is not None and all(record.consuming_at.values())
        if exits := workers.exits():
            record.error = f"worker(s) exited: {exits}"
            return
        if done:
            break
        if time.monotonic() > deadline:
            missing = [] if record.first_run_at else ["no job ran"]
            missing += [f"{n} not consuming" for n, at in record.consuming_at.items() if not at]
            record.error = f"within {RECOVERY_TIMEOUT:g} s of broker up: {', '.join(missing)}"
            return
        time.sleep(0.02)
    record.published_again_at = load.confirmed_since(record.up_at)
    for worker in workers.every:
        lost = worker.first("lost the broker", record.killed_at)
        record.loss_noticed_at[worker.name] = lost.at if lost else None
        back = worker.first("broker link back", record.killed_at)
        outage = BACK_AFTER.search(back.message) if back else None
        record.outage_logged[worker.name] = float(outage.group(1)) if outage else None


def steady(seconds: float, workers: Workers) -> str | None:
    """Let the load run; a worker exit ends it early (the error)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if exits := workers.exits():
            return f"worker(s) exited: {exits}"
        time.sleep(0.05)
    return None


def warm_up(workers: Workers, effects: Effects) -> None:
    """Wait until every worker consumes and a first job ran."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if exits := workers.exits():
            raise SystemExit(
                f"worker(s) exited at start: {exits}\n"
                + "\n".join(r.message for w in workers.exited() for r in w.records[-5:])
            )
        consuming = all(w.first(" consuming ", 0.0) for w in workers.every)
        if consuming and effects.count() > 0:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the workers did not consume and run a job in {START_TIMEOUT:g} s")
        time.sleep(0.05)
