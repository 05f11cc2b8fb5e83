"""Claims of a worker killed on this host are taken over at once, not at their lease's
end (broker_jobs/worker/dead_holders.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from broker_jobs import App, Publisher
from broker_jobs.store.base import Status
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.processes import ProcessKind, ProcessRecord, pid_namespace
from broker_jobs.store.records import ExecutionOutcome
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.worker import Worker, WorkerSettings
from broker_jobs.worker.dead_holders import DeadHolders
from tests.support import Broker

NOW = datetime(2030, 1, 1, tzinfo=UTC)


class Key(BaseModel):
    key: str


def a_dead_pid() -> int:
    """The pid of a process of this host that has ended (reaped: no such pid now)."""
    probe = subprocess.Popen([sys.executable, "-c", "pass"])
    probe.wait()
    return probe.pid


def heartbeat(
    worker_id: str,
    pid: int,
    *,
    seen: datetime,
    host: str | None = None,
    namespace: str = "ns",
    pids: str | None = "ours",
) -> ProcessRecord:
    """A worker's last heartbeat; ``pids``: its PID namespace ("ours": this process's)."""
    return ProcessRecord(
        id=worker_id,
        kind=ProcessKind.WORKER,
        namespace=namespace,
        pid_namespace=pid_namespace() if pids == "ours" else pids,
        host=host or socket.gethostname(),
        pid=pid,
        version="test",
        started_at=seen - timedelta(minutes=5),
        seen_at=seen,
        every=5.0,
    )


def test_only_a_process_gone_from_this_host_with_a_silent_heartbeat_is_dead() -> None:
    store = MemoryStore()
    dead, alive = a_dead_pid(), os.getppid()
    stale = NOW - timedelta(seconds=11)
    store.record_process(heartbeat("gone", dead, seen=stale))
    store.record_process(heartbeat("alive", alive, seen=stale))  # a pid alive here
    store.record_process(heartbeat("fresh", dead, seen=NOW - timedelta(seconds=3)))
    store.record_process(heartbeat("elsewhere", dead, seen=stale, host="another-host"))
    # Containers of one host name with pids of their own (a pod's; a restarted one).
    store.record_process(heartbeat("container", dead, seen=stale, pids="pid:[4026532999]"))
    store.record_process(heartbeat("older", dead, seen=stale, pids=None))  # did not say
    holders = DeadHolders(store, "ns")
    assert holders.is_dead("gone#17", NOW)
    assert not holders.is_dead("alive#1", NOW)
    assert not holders.is_dead("fresh#1", NOW)  # another machine of this name may write it
    assert not holders.is_dead("elsewhere#1", NOW)
    assert not holders.is_dead("container#1", NOW)
    assert not holders.is_dead("older#1", NOW)
    assert not holders.is_dead("unknown#1", NOW)  # no heartbeat: nothing is known


@pytest.mark.broker
def test_a_job_claimed_by_a_worker_killed_on_this_host_runs_at_once(
    broker: Broker, make_app: Callable[[], App], tmp_path: Path
) -> None:
    """A worker killed with kill -9 leaves its claims (running jobs, and those waiting
    for a thread) to lapse with their lease: its successor held each redelivery that
    long. Its heartbeat says it ran here and its pid is gone: the lease is ended and
    the job taken over at once, its first execution `lost`."""
    app = make_app()
    ran = threading.Event()

    @app.task("held.job")
    def held(payload: Key) -> None:
        ran.set()

    with Publisher(broker.url, app) as publisher:
        job = publisher.publish("held.job", {"key": "k"})
    with SQLiteStore(tmp_path / "ledger.db") as store:
        pid = a_dead_pid()
        dead_id = f"{socket.gethostname()}:{pid}:killed"
        stale = datetime.now(UTC) - timedelta(seconds=30)  # its last heartbeat
        store.record_process(heartbeat(dead_id, pid, seen=stale, namespace=app.namespace))
        claimed = store.claim(job, f"{dead_id}#4", lease=600)
        assert claimed.record.status is Status.RUNNING
        worker = Worker(broker.url, app, store, WorkerSettings(burst=True, concurrency=2))
        outcomes: list[object] = []
        thread = threading.Thread(target=lambda: outcomes.append(asyncio.run(worker.run())))
        thread.start()
        ran_at_once = ran.wait(60)
        if not ran_at_once:
            worker.stop()
        thread.join(120)
        assert ran_at_once, "the job waited for the dead worker's lease"
        record = store.get(job.idempotency_key)
        assert record is not None
        assert record.status is Status.SUCCEEDED
        outcomes_by_holder = {e.worker: e.outcome for e in store.executions(job.idempotency_key)}
        assert outcomes_by_holder[f"{dead_id}#4"] is ExecutionOutcome.LOST
