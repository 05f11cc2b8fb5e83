"""The daemons as an operator sees them, from their heartbeats in the ledger
(:mod:`broker_jobs.store.processes`): ``broker-jobs workers``, the dashboard's
workers page and the exporter's ``broker_jobs_processes`` metric read them here.

Whether a process is alive, stopping, stopped or lost is
:func:`broker_jobs.store.processes.liveness`'s judgement (the worker's crash-loop
rule asks it too).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from broker_jobs.clock import utc_now
from broker_jobs.ops.readable import when
from broker_jobs.store.base import Store
from broker_jobs.store.processes import Liveness, ProcessKind, ProcessRecord, liveness

_ZERO = timedelta(0)


@dataclass(frozen=True)
class ProcessView:
    """One process: its last record and what the reader makes of it."""

    record: ProcessRecord
    liveness: Liveness
    silent_for: timedelta

    @property
    def present(self) -> bool:
        """Alive or stopping: its role and its running jobs are still so (a lost or
        stopped process's last heartbeat names a role it no longer has, and jobs
        that ran on or were taken over long since)."""
        return self.liveness in (Liveness.ALIVE, Liveness.STOPPING)

    @property
    def kind_and_role(self) -> str:
        """``beat (leading)``; ``beat (was leading)`` for a process no longer present."""
        kind, role = self.record.kind.value, self.record.role
        if role is None:
            return kind
        return f"{kind} ({role})" if self.present else f"{kind} (was {role})"

    def document(self) -> dict[str, Any]:
        """As ``--json`` and ``/api/workers`` give it."""
        r = self.record
        return {
            "id": r.id,
            "kind": r.kind.value,
            "namespace": r.namespace,
            "state": self.liveness.value,
            "host": r.host,
            "pid": r.pid,
            "version": r.version,
            "tasks": list(r.tasks),
            "concurrency": r.concurrency,
            "processes": r.processes,
            "role": r.role,
            "paused": list(r.paused),
            "ended": r.ended,
            "held": r.held if self.present else None,
            "started_at": when(r.started_at),
            "last_seen": when(r.seen_at),
            "silent_s": round(self.silent_for.total_seconds(), 1),
            "heartbeat_every_s": r.every,
            "in_flight": r.in_flight,
            "running": [
                {
                    "job_id": job.job_id,
                    "task": job.task,
                    "key": job.key,
                    "attempt": job.attempt,
                    "started_at": when(job.started_at),
                }
                for job in r.running
            ],
        }


_ORDER = {Liveness.ALIVE: 0, Liveness.STOPPING: 1, Liveness.LOST: 2, Liveness.STOPPED: 3}


def process_views(
    store: Store,
    namespace: str | None = None,
    *,
    tasks: Iterable[str] = (),
    lost_after: float | None = None,
    now: datetime | None = None,
) -> list[ProcessView]:
    """The processes of ``namespace`` (all when None) that the ledger knows, those
    that run any of ``tasks`` only when given (beats and exporters always): the live
    first, then by kind, host and id."""
    now = now or utc_now()
    wanted = frozenset(tasks)
    views = [
        ProcessView(record, liveness(record, now, lost_after), max(now - record.seen_at, _ZERO))
        for record in store.processes(namespace)
        if not wanted or record.kind is not ProcessKind.WORKER or wanted & set(record.tasks)
    ]
    return sorted(
        views,
        key=lambda v: (_ORDER[v.liveness], v.record.kind.value, v.record.host, v.record.id),
    )


def liveness_counts(views: Iterable[ProcessView]) -> Counter[tuple[str, str]]:
    """How many processes of each (kind, liveness)."""
    return Counter((view.record.kind.value, view.liveness.value) for view in views)
