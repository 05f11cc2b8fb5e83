"""Paused tasks (docs/operations.md, "pause and resume"): an operator's
``broker-jobs pause TASK`` is a row in the ledger, so it holds across worker and
broker restarts and every worker of the namespace reads the same answer; each
worker looks every few seconds and stops starting the task's jobs while the row is
there (:mod:`broker_jobs.worker.pausing`)."""

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
