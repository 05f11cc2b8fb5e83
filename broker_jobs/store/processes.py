"""The heartbeat records of the daemons (docs/operations.md, "Workers"): every worker
process, beat and exporter with a ledger keeps one record there, rewritten every
few seconds, so that ``broker-jobs workers``, the dashboard and the exporter's
metrics show who runs, where, what it holds, and who fell silent.

A record is one JSON document per process id (the stores keep it as text beside
its id, namespace and last-seen time): new fields need no schema change, and a
reader of an older version ignores what it does not know. Whether a process is
lost is the reader's judgement (:func:`liveness`), from ``seen_at`` and ``every``:
the writer says only what it is doing. A process is *lost* when its record is older than
:func:`lost_after` (three of its own heartbeat periods, at least
:data:`MIN_LOST_AFTER` seconds) without saying it stopped: killed, its host gone, or
cut off from the ledger. The judgement uses the reader's clock against the writer's,
so hosts' clocks must agree to well within it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from broker_jobs.store.errors import StoreError

#: Running jobs a record lists (it counts them all in ``in_flight``): bounds the
#: record of a worker with a large concurrency.
MAX_LISTED_RUNNING = 50


class ProcessKind(StrEnum):
    WORKER = "worker"
    BEAT = "beat"
    EXPORTER = "exporter"


class ProcessState(StrEnum):
    """What a process said of itself in its last heartbeat."""

    RUNNING = "running"
    STOPPING = "stopping"  # asked to stop: starts nothing, lets running jobs finish
    STOPPED = "stopped"  # its last record, written on a graceful exit


@dataclass(frozen=True)
class RunningJob:
    """A job a worker was running at its heartbeat."""

    job_id: str
    task: str
    key: str
    attempt: int
    started_at: datetime


@dataclass(frozen=True)
class ProcessRecord:
    """One daemon's heartbeat. Times are aware UTC, on the writer's clock."""

    id: str
    kind: ProcessKind
    namespace: str
    host: str
    pid: int
    version: str
    started_at: datetime
    seen_at: datetime
    #: Seconds between its heartbeats (the reader judges silence against it).
    every: float
    state: ProcessState = ProcessState.RUNNING
    tasks: tuple[str, ...] = ()
    concurrency: int | None = None
    #: Worker processes of the command that started it (``--processes``).
    processes: int | None = None
    #: Jobs running (or claimed, waiting for a handler thread) at the heartbeat.
    in_flight: int = 0
    #: Up to :data:`MAX_LISTED_RUNNING` of them, the longest-running first.
    running: tuple[RunningJob, ...] = ()
    #: A word on its role, where it has one: a beat's ``leading`` or ``following``.
    role: str | None = None
    #: Its tasks that it holds paused (it starts none of their jobs).
    paused: tuple[str, ...] = ()
    #: Why it stopped, when not because it was asked to: the error it exited with
    #: (its exit code and message's first line), for an operator to see.
    ended: str | None = None
    #: Why it holds its deliveries at the heartbeat, when it does (its ``/readyz``
    #: reason: the broker confirms none of its publishes, a handler is stuck).
    held: str | None = None
    #: The PID namespace its pid counts in (:func:`pid_namespace`; None: unknown).
    #: Containers of one host name may each have their own: a pid means something
    #: to a reader only in the same one.
    pid_namespace: str | None = None


#: Heartbeat periods of silence after which a process is lost.
LOST_AFTER_BEATS = 3
#: Seconds of silence that never make a process lost, whatever its period.
MIN_LOST_AFTER = 15.0


class Liveness(StrEnum):
    ALIVE = "alive"
    STOPPING = "stopping"
    STOPPED = "stopped"
    LOST = "lost"


def lost_after(record: ProcessRecord, override: float | None = None) -> float:
    """Seconds of silence after which ``record``'s process is lost (``override``:
    the operator's own threshold)."""
    if override is not None:
        return override
    return max(LOST_AFTER_BEATS * record.every, MIN_LOST_AFTER)


def liveness(record: ProcessRecord, now: datetime, override: float | None = None) -> Liveness:
    """Whether ``record``'s process is alive, stopping, stopped or lost at ``now``."""
    if record.state is ProcessState.STOPPED:
        return Liveness.STOPPED
    if (now - record.seen_at).total_seconds() > lost_after(record, override):
        return Liveness.LOST
    return Liveness.STOPPING if record.state is ProcessState.STOPPING else Liveness.ALIVE


def process_document(record: ProcessRecord) -> str:
    """``record`` as the JSON text the stores keep."""
    document = {
        "id": record.id,
        "kind": record.kind.value,
        "namespace": record.namespace,
        "host": record.host,
        "pid": record.pid,
        "version": record.version,
        "started_at": record.started_at.isoformat(),
        "seen_at": record.seen_at.isoformat(),
        "every": record.every,
        "state": record.state.value,
        "tasks": list(record.tasks),
        "concurrency": record.concurrency,
        "processes": record.processes,
        "in_flight": record.in_flight,
        "running": [
            {
                "job_id": job.job_id,
                "task": job.task,
                "key": job.key,
                "attempt": job.attempt,
                "started_at": job.started_at.isoformat(),
            }
            for job in record.running[:MAX_LISTED_RUNNING]
        ],
        "role": record.role,
        "paused": list(record.paused),
        "ended": record.ended,
        "held": record.held,
        "pid_namespace": record.pid_namespace,
    }
    return json.dumps(document, separators=(",", ":"))


def process_of(text: str) -> ProcessRecord:
    """The record a store kept as ``text``; :class:`StoreError` if it is not one."""
    try:
        document = json.loads(text)
        return ProcessRecord(
            id=str(document["id"]),
            kind=ProcessKind(document["kind"]),
            namespace=str(document["namespace"]),
            host=str(document["host"]),
            pid=int(document["pid"]),
            version=str(document["version"]),
            started_at=datetime.fromisoformat(document["started_at"]),
            seen_at=datetime.fromisoformat(document["seen_at"]),
            every=float(document["every"]),
            state=ProcessState(document.get("state", "running")),
            tasks=tuple(map(str, document.get("tasks") or ())),
            concurrency=document.get("concurrency"),
            processes=document.get("processes"),
            in_flight=int(document.get("in_flight") or 0),
            running=tuple(
                RunningJob(
                    job_id=str(job["job_id"]),
                    task=str(job["task"]),
                    key=str(job["key"]),
                    attempt=int(job["attempt"]),
                    started_at=datetime.fromisoformat(job["started_at"]),
                )
                for job in document.get("running") or ()
            ),
            role=document.get("role"),
            paused=tuple(map(str, document.get("paused") or ())),
            ended=_text_or_none(document.get("ended")),
            held=_text_or_none(document.get("held")),
            pid_namespace=_text_or_none(document.get("pid_namespace")),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise StoreError(f"a heartbeat record that is not one ({error}): {text[:200]!r}") from None


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def pid_alive(pid: int) -> bool:
    """Whether a process of this host has ``pid`` (one of another user's counts, and
    so does a zombie: reap your own children before asking)."""
    if pid <= 0:
        return True  # not a single process's pid: never taken for gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_namespace() -> str | None:
    """This process's PID namespace, as Linux names it (``pid:[4026531836]``); None
    where it cannot be read (another OS, no /proc)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
