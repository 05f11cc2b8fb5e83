"""Claims held by a worker process that is gone for certain: ended at once, not at
their lease's end.

A worker killed with ``kill -9`` or by the OOM killer cannot give its claims back:
every job it had claimed (running, and waiting for a handler thread: up to its
prefetch) waited for its lease to lapse, a minute by default, before its redelivery
could run. The worker that meets such a redelivery (its successor on the same host,
started by systemd or a supervisor) asks the ledger's heartbeats about the holder: a
process of this host and of this PID namespace, whose pid no process has, and whose
heartbeat has missed two beats, is dead; its lease is ended now (``Store.lapse``) and
the job taken over, its execution ``lost`` as after a lapsed lease. Anything less
certain waits for the lease, as before: a holder on another host, or in another PID
namespace (containers of one host name, each with its own pids; a container
restarted gets a new one), a pid alive, a heartbeat still fresh (another machine
with the same host name writes it), a heartbeat that does not say its namespace.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from broker_jobs.store.base import Store
from broker_jobs.store.processes import ProcessRecord, pid_alive, pid_namespace

#: Heartbeat periods a dead holder's record must have missed.
MISSED_BEATS = 2


class DeadHolders:
    """Which holders of claims are processes known to be gone, from ``store``'s
    heartbeats of ``namespace``; blocking (call it on the store's thread)."""

    def __init__(self, store: Store, namespace: str, *, host: str | None = None) -> None:
        self._store = store
        self._namespace = namespace
        self._host = host or socket.gethostname()
        self._pids = pid_namespace()
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
            and self._pids is not None
            and record.pid_namespace == self._pids  # the pid means the same process here
            and record.pid != os.getpid()
            and silent > timedelta(seconds=MISSED_BEATS * record.every)
            and not pid_alive(record.pid)
        )
