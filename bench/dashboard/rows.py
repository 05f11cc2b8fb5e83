"""The made-up ledger of ``bench.dashboard``: records with a realistic spread of tasks,
statuses and times, and a few executions per record."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from broker_jobs.store.base import Status

#: Tasks and their shares of the ledger.
TASKS = {
    "email.send": 30,
    "webhook.deliver": 18,
    "image.resize": 16,
    "report.build": 10,
    "invoice.render": 10,
    "search.index": 8,
    "thumbnail.make": 6,
    "export.csv": 2,
}
DEMO_TASKS = {"email.send": 1, "image.resize": 1}
#: Statuses and their shares: mostly finished; a backlog, a few running, a few failing.
STATUSES = {
    Status.SUCCEEDED: 9000,
    Status.QUEUED: 300,
    Status.SCHEDULED: 150,
    Status.FAILED: 200,
    Status.DEAD: 100,
    Status.CANCELLED: 50,
    Status.RETRYING: 50,
    Status.RUNNING: 5,
}
WORKERS = [f"worker-{host}-{pid}" for host in ("a", "b", "c", "d") for pid in (4101, 4102)]
ERRORS = (
    "ConnectionError: SMTP server smtp.example.com:587 refused the connection",
    "TimeoutError: the handler ran longer than its time limit (10 s)",
    "ValueError: image is 0x0 pixels",
    "HTTPError: 503 Service Unavailable from https://hooks.example.com/in",
)


@dataclass(frozen=True)
class Row:
    """One record and its executions, times as datetimes (each store writes its own)."""

    record: tuple[Any, ...]  # the columns of broker_jobs_records, in table order
    executions: list[tuple[Any, ...]]  # (attempt, worker, started, finished, outcome, error)


def job_id(at: datetime, rng: random.Random) -> str:
    """A UUID 7 of ``at``, like :func:`broker_jobs.envelope.new_job_id`."""
    milliseconds = int(at.timestamp() * 1000)
    value = milliseconds << 80 | rng.getrandbits(80)
    value = value & ~(0xF << 76 | 0x3 << 62) | (0x7 << 76 | 0x2 << 62)  # version 7, RFC 9562
    return str(uuid.UUID(int=value))


def ledger_rows(
    count: int, now: datetime, *, days: float, tasks: dict[str, int], seed: int = 7
) -> Iterator[Row]:
    """``count`` records ordered by creation over ``days`` before ``now``: finished
    jobs over the whole span, the queued, scheduled, running and retrying ones in its
    last hour; one execution per attempt (a retried job has two or three)."""
    rng = random.Random(seed)
    task_names, task_weights = list(tasks), list(tasks.values())
    statuses, status_weights = list(STATUSES), list(STATUSES.values())
    span = days * 86400.0
    recent = {Status.QUEUED, Status.SCHEDULED, Status.RUNNING, Status.RETRYING}
    for i in range(count):
        status = rng.choices(statuses, status_weights)[0]
        task = rng.choices(task_names, task_weights)[0]
        if status in recent:
            created = now - timedelta(seconds=rng.uniform(0, 3600))
        else:
            created = now - timedelta(seconds=span * (1 - (i + rng.random()) / count))
        yield _row(rng, job_id(created, rng), task, status, created)


class _Runs:
    """A record's executions, one after another (a back-off between attempts)."""

    def __init__(self, rng: random.Random, at: datetime, worker: str) -> None:
        self.rng, self.at, self.worker = rng, at, worker
        self.executions: list[tuple[Any, ...]] = []

    def run(self, attempt: int, outcome: str, error: str | None = None) -> datetime:
        started = self.at
        finished = started + timedelta(seconds=self.rng.lognormvariate(-2.5, 0.8))
        self.executions.append((attempt, self.worker, started, finished, outcome, error))
        self.at = finished + timedelta(seconds=2**attempt)
        return finished


def _row(rng: random.Random, jid: str, task: str, status: Status, created: datetime) -> Row:
    runs = _Runs(rng, created + timedelta(milliseconds=rng.uniform(1, 40)), rng.choice(WORKERS))
    worker: str | None = runs.worker
    error: str | None = None
    due: datetime | None = None
    lease: datetime | None = None
    if status in (Status.QUEUED, Status.SCHEDULED, Status.CANCELLED):
        attempts, worker, updated = 0, None, created
        if status is Status.SCHEDULED:
            due = created + timedelta(seconds=rng.uniform(60, 7200))
        if status is Status.CANCELLED:
            updated = created + timedelta(seconds=rng.uniform(1, 600))
    elif status is Status.SUCCEEDED:
        attempts = rng.choices((1, 2, 3), (85, 12, 3))[0]
        for attempt in range(1, attempts):
            runs.run(attempt, "retrying", rng.choice(ERRORS))
        updated = runs.run(attempts, "succeeded")
    elif status in (Status.FAILED, Status.DEAD):
        attempts, error = (1 if status is Status.FAILED else 3), rng.choice(ERRORS)
        for attempt in range(1, attempts):
            runs.run(attempt, "retrying", error)
        updated = runs.run(attempts, status.value, error)
    elif status is Status.RETRYING:
        attempts, error = rng.choice((1, 2)), rng.choice(ERRORS)
        for attempt in range(1, attempts + 1):
            updated = runs.run(attempt, "retrying", error)
        due = updated + timedelta(seconds=2**attempts)
    else:  # RUNNING: the record's insert trigger opens its execution
        attempts, updated = 1, runs.at
        lease = updated + timedelta(seconds=30)
    record = (jid, jid, task, status.value, attempts, created, updated, worker, lease, error, due)
    return Row(record, runs.executions)


def chunks(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
