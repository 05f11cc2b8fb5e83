"""Claims held by a worker process that is gone for certain: ended at once, not at
their lease's end.

A worker killed with ``kill -9`` or by the OOM killer cannot give its claims back:
every job it had claimed (running, and waiting for a handler thread: up to its
prefetch) waited for its lease to lapse, a minute by default, before its redelivery
could run. The worker that meets such a redelivery (its successor on the same host,
started by systemd or a container's restart) asks the ledger's heartbeats about the
holder: a process of this host, whose pid no process here has, and whose heartbeat
has missed two beats, is dead; its lease is ended now (``Store.lapse``) and the job
taken over, its execution ``lost`` as after a lapsed lease. Anything less certain (a
holder on another host, a pid alive here, a heartbeat still fresh: another machine
with the same host name writes it) waits for the lease, as before.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from broker_jobs.store.base import Store
from broker_jobs.store.processes import ProcessRecord, pid_alive

#: Heartbeat periods a dead holder's record must have missed.
MISSED_BEATS = 2


class DeadHolders:
    """Which holders of claims are processes known to be gone, from ``store``'s
    heartbeats of ``namespace``; blocking (call it on the store's thread)."""

    def __init__(self, store: Store, namespace: str, *, host: str | None = None) -> None:
        self._store = store
        self._namespace = namespace
        self._host = host or socket.gethostname()
        self._dead: set[str] = set()  # dead stays dead: asked once per worker id

    def is_dead(self, holder: str, now: datetime) -> bool:
        """Whether ``holder`` (a claim's worker: ``WORKER_ID#N``) belongs to a worker
        process known to be gone."""
        worker_id = holder.partition("#")[0]
        if worker_id in self._dead:
            return True
        record = next(
            (r for r in self._store.processes(self._namespace) if r.id == worker_id), None
        )
        if record is None or not self._gone(record, now):
            return False
        self._dead.add(worker_id)
        return True

    def _gone(self, record: ProcessRecord, now: datetime) -> bool:
        silent = now - record.seen_at
        return (
            record.host == self._host
            and record.pid != os.getpid()
            and silent > timedelta(seconds=MISSED_BEATS * record.every)
            and not pid_alive(record.pid)
        )
