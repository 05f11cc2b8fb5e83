"""What an operator tells the workers through the ledger (docs/operations.md,
"pause and resume", "workers: stop"): a paused task (``broker-jobs pause TASK``) and
a worker asked to stop (``broker-jobs workers stop ID``). Rows in the ledger, so they
hold across worker and broker restarts and reach every worker, wherever it runs;
each worker reads them every heartbeat period (:mod:`broker_jobs.worker.controls`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class TaskPause:
    """``task`` of ``namespace`` is paused since ``since`` (aware UTC), by ``by``
    (who asked: a user and host, or the dashboard)."""

    namespace: str
    task: str
    since: datetime
    by: str


@dataclass(frozen=True)
class StopRequest:
    """Worker ``worker_id`` of ``namespace`` is asked to stop gracefully (asked at
    ``at``, by ``by``); it deletes the request as it exits."""

    namespace: str
    worker_id: str
    at: datetime
    by: str
