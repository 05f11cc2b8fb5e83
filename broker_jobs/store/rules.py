"""The claim and state-change rules every store applies, as pure functions of a
record: what a claim decides, what a claim, publish, cancel, replay or dead-letter
writes, how executions follow a record. Written once so the stores cannot drift
apart (``docs/store.md``): the memory and SQLite stores apply them inside their
exclusive sections, the PostgreSQL store under a row lock; where one statement does
the work instead (PostgreSQL's claim upsert, the SQL stores' execution triggers), the
statement names the rule it writes in SQL.

Claim rules (:func:`decide`), for a job ``J`` claimed by worker ``W`` at ``now``:

    no record                                      CLAIMED  (a RUNNING record is created)
    QUEUED or SCHEDULED (known, not claimed yet)   CLAIMED  (as a new key; created_at kept)
    CANCELLED                                      CANCELLED (ack, do not run; counted)
    SUCCEEDED, FAILED or DEAD                      DONE     (a duplicate: ack, do not run)
    RETRYING, J.attempt >  record.attempts         CLAIMED  (the next attempt)
    RETRYING, J.attempt <= record.attempts         STALE    (an old attempt: ack, do not run)
    RUNNING,  J.attempt <  record.attempts         STALE    (a newer attempt already runs)
    RUNNING,  held by W                            CLAIMED  (redelivered to the same worker)
    RUNNING,  lease expired (lease_until <= now)   CLAIMED  (take over a dead worker's job)
    RUNNING,  live lease of another worker         BUSY     (re-check later)

The record methods (renew, succeed, retry, fail) need a RUNNING record held by the
calling worker and raise :class:`LeaseLostError` otherwise. A worker whose lease
expired keeps it until another worker actually takes over.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from broker_jobs.envelope import Job
from broker_jobs.store.errors import LeaseLostError
from broker_jobs.store.records import (
    CANCELLABLE,
    REPLAYABLE,
    TERMINAL,
    WAITING,
    Cancellation,
    CancelOutcome,
    ClaimOutcome,
    Execution,
    ExecutionOutcome,
    JobRecord,
    Status,
)
from broker_jobs.store.values import clip_error


def decide(record: JobRecord | None, job: Job, worker: str, now: datetime) -> ClaimOutcome:
    """The claim rules of the module docstring."""
    if record is None or record.status in WAITING:
        return ClaimOutcome.CLAIMED
    if record.status is Status.CANCELLED:
        return ClaimOutcome.CANCELLED
    if record.status in TERMINAL:
        return ClaimOutcome.DONE
    if record.status is Status.RETRYING:
        return ClaimOutcome.CLAIMED if job.attempt > record.attempts else ClaimOutcome.STALE
    if job.attempt < record.attempts:
        return ClaimOutcome.STALE
    expired = record.lease_until is None or record.lease_until <= now
    return ClaimOutcome.CLAIMED if record.worker == worker or expired else ClaimOutcome.BUSY


def created_time(job: Job, now: datetime) -> datetime:
    """A new record's ``created_at``: when its job was made (the message's
    ``bj-created-at``), so that a job published without the ledger shows when it was
    published, not when a worker first claimed it; never after ``now`` (a publisher
    whose clock runs ahead).
    """
    return min(job.created_at, now)


def claimed_record(
    record: JobRecord | None, job: Job, worker: str, lease: float, now: datetime
) -> JobRecord:
    """The RUNNING record a claim leaves (created, or taken over from ``record``)."""
    return JobRecord(
        idempotency_key=job.idempotency_key,
        job_id=job.id,
        task=job.task,
        status=Status.RUNNING,
        attempts=job.attempt,
        created_at=record.created_at if record else created_time(job, now),
        updated_at=now,
        worker=worker,
        lease_until=now + timedelta(seconds=lease),
        last_error=record.last_error if record else None,
        due_at=None,
    )


def holds(record: JobRecord | None, worker: str | None) -> bool:
    return record is not None and record.status is Status.RUNNING and record.worker == worker


def published_record(job: Job, now: datetime) -> JobRecord:
    """What :meth:`Store.record_published` writes for a key without a record."""
    due = job.due_at is not None and job.due_at > now
    return JobRecord(
        idempotency_key=job.idempotency_key,
        job_id=job.id,
        task=job.task,
        status=Status.SCHEDULED if due else Status.QUEUED,
        attempts=0,
        created_at=now,
        updated_at=now,
        worker=None,
        lease_until=None,
        last_error=None,
        due_at=job.due_at if due else None,
    )


def cancelled(record: JobRecord | None, now: datetime) -> Cancellation:
    """What :meth:`Store.cancel` does to ``record``; save the record of a CANCELLED
    outcome."""
    if record is None:
        return Cancellation(CancelOutcome.UNKNOWN, None)
    if record.status is Status.CANCELLED:
        return Cancellation(CancelOutcome.ALREADY_CANCELLED, record)
    released = record.status is Status.RUNNING and record.worker is None
    if record.status in CANCELLABLE or released:
        new = replace(
            record, status=Status.CANCELLED, updated_at=now, lease_until=None, due_at=None
        )
        return Cancellation(CancelOutcome.CANCELLED, new)
    if record.status is Status.RUNNING:
        return Cancellation(CancelOutcome.RUNNING, record)
    return Cancellation(CancelOutcome.FINISHED, record)


def replay_record(record: JobRecord | None, now: datetime) -> JobRecord | None:
    """What :meth:`Store.reset_for_replay` writes; None to leave ``record`` as it is."""
    if record is None or record.status not in REPLAYABLE:
        return None
    return replace(
        record,
        status=Status.QUEUED,
        attempts=0,
        updated_at=now,
        worker=None,
        lease_until=None,
        due_at=None,
    )


def dead_record(
    record: JobRecord | None,
    key: str,
    worker: str | None,
    error: str,
    *,
    job: Job | None,
    job_id: str | None,
    task: str | None,
    now: datetime,
) -> JobRecord | None:
    """What ``Store.dead`` writes; None to leave the record as it is.

    - no record (a poison message never claimed): a DEAD record is created from ``job``,
      or from ``job_id`` (default: the key) and ``task`` (default: empty), attempts 0;
    - a record of another task: unchanged (a message of one task never decides
      another task's job, whatever key it carries);
    - already SUCCEEDED, FAILED or DEAD: unchanged (an outcome is never overwritten);
    - RETRYING: DEAD;
    - RUNNING: DEAD if ``worker`` holds it, or if ``worker`` is None and the lease
      expired (the holder died); else :class:`LeaseLostError`.
    """
    error = clip_error(error)
    if record is None:
        return JobRecord(
            idempotency_key=key,
            job_id=job.id if job else (job_id or key),
            task=job.task if job else (task or ""),
            status=Status.DEAD,
            attempts=job.attempt if job else 0,
            created_at=created_time(job, now) if job else now,
            updated_at=now,
            worker=worker,
            lease_until=None,
            last_error=error,
            due_at=None,
        )
    dying_task = job.task if job else task
    if record.status in TERMINAL or (dying_task and record.task and dying_task != record.task):
        return None
    if record.status is Status.RUNNING:
        expired = record.lease_until is None or record.lease_until <= now
        if not (holds(record, worker) or (worker is None and expired)):
            raise LeaseLostError(key, worker, record, "mark dead")
    return replace(
        record,
        status=Status.DEAD,
        updated_at=now,
        worker=worker if worker is not None else record.worker,
        lease_until=None,
        last_error=error,
        due_at=None,
    )


def track_execution(executions: list[Execution], record: JobRecord) -> None:
    """Bring a key's ``executions`` (oldest first) in line with its new ``record``:
    the rule the SQL stores apply in their triggers.

    - an open execution (unfinished) that is not the record's current holding (RUNNING,
      held by ``record.worker`` at ``record.attempts``) is closed: with the record's
      status as outcome, or ``released`` (RUNNING, no holder) or ``lost`` (RUNNING,
      another holder or attempt); at ``updated_at``, or ``lease_until`` for a release;
    - a holding without an open execution appends one started at ``updated_at``.

    A renewal, or a claim by the holder again (a redelivery), changes nothing.
    """
    held = record.status is Status.RUNNING and record.worker is not None
    current = False
    for index, execution in enumerate(executions):
        if execution.finished_at is not None:
            continue
        if held and execution.worker == record.worker and execution.attempt == record.attempts:
            current = True
            continue
        executions[index] = replace(execution, **closing(record))
    if held and not current:
        assert record.worker is not None
        executions.append(
            Execution(
                idempotency_key=record.idempotency_key,
                job_id=record.job_id,
                attempt=record.attempts,
                worker=record.worker,
                started_at=record.updated_at,
                finished_at=None,
                outcome=None,
                error=None,
            )
        )


def closing(record: JobRecord) -> dict[str, Any]:
    """The ``finished_at``, ``outcome`` and ``error`` of an execution that ``record``
    (its key's new state) ends."""
    if record.status is Status.RUNNING:
        released = record.worker is None
        return {
            "finished_at": (record.lease_until or record.updated_at)
            if released
            else record.updated_at,
            "outcome": ExecutionOutcome.RELEASED if released else ExecutionOutcome.LOST,
            "error": None,
        }
    failed = record.status in {Status.RETRYING, Status.FAILED, Status.DEAD}
    if failed or record.status is Status.SUCCEEDED:
        return {
            "finished_at": record.updated_at,
            "outcome": ExecutionOutcome(record.status.value),
            "error": record.last_error if failed else None,
        }
    # QUEUED, SCHEDULED, CANCELLED are no outcome of a run (and not one the executions
    # may hold): the rules reach them with no open execution, but should one be open,
    # it ended without an outcome.
    return {"finished_at": record.updated_at, "outcome": ExecutionOutcome.RELEASED, "error": None}
