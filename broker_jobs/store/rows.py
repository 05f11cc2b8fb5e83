"""How the SQL stores read their rows back: both keep a record's columns and an
execution's in the same order (``idempotency_key, job_id, task, status, ...``), and
differ only in how a time is stored (fixed-width UTC text in SQLite, timestamptz in
PostgreSQL), so each passes its reading of a time and the rest is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from broker_jobs.store.records import (
    Execution,
    ExecutionOutcome,
    JobRecord,
    KeptOutput,
    KeptPayload,
    LeaderRecord,
    Status,
)
from broker_jobs.store.values import read_leader_schedules, read_output, read_payload

#: A time as a store's driver returns it -> aware UTC (None for NULL).
ReadTime = Callable[[Any], datetime | None]


def record_of(row: Sequence[Any], time: ReadTime) -> JobRecord:
    """A row of the records' columns."""
    key, job_id, task, status, attempts, created, updated, worker, lease, error, due = row
    return JobRecord(
        idempotency_key=key,
        job_id=job_id,
        task=task,
        status=Status(status),
        attempts=attempts,
        created_at=_required(time(created)),
        updated_at=_required(time(updated)),
        worker=worker,
        lease_until=time(lease),
        last_error=error,
        due_at=time(due),
    )


def execution_of(row: Sequence[Any], time: ReadTime) -> Execution:
    """A row of the executions' columns (``idempotency_key, job_id, attempt, worker,
    started_at, finished_at, outcome, error``)."""
    key, job_id, attempt, worker, started, finished, outcome, error = row
    return Execution(
        idempotency_key=key,
        job_id=job_id,
        attempt=attempt,
        worker=worker,
        started_at=_required(time(started)),
        finished_at=time(finished),
        outcome=ExecutionOutcome(outcome) if outcome is not None else None,
        error=error,
    )


def kept_payload_of(row: Sequence[Any] | None, time: ReadTime) -> KeptPayload | None:
    """A row of ``payload, bytes, kept_at``; None for no row (no payload kept)."""
    if row is None:
        return None
    text, size, kept_at = row
    return read_payload(text, size, _required(time(kept_at)))


def kept_output_of(row: Sequence[Any] | None, time: ReadTime) -> KeptOutput | None:
    """A row of ``result, result_bytes, follow_ups, sent_at, kept_at``; None for no
    row (the success kept no output)."""
    if row is None:
        return None
    result, size, follow_ups, sent_at, kept_at = row
    return read_output(result, size, follow_ups, time(sent_at), _required(time(kept_at)))


def leader_of(row: Sequence[Any] | None, time: ReadTime) -> LeaderRecord | None:
    """A row of ``group_name, identity, since, seen_at`` and, where the store has the
    column, ``schedules``; None for no row."""
    if row is None:
        return None
    name, identity, since, seen_at, *rest = row
    schedules = read_leader_schedules(identity, rest[0]) if rest else None
    return LeaderRecord(name, identity, _required(time(since)), _required(time(seen_at)), schedules)


def status_counts(rows: Iterable[Sequence[Any]]) -> dict[Status, int]:
    """Rows of ``status, count(*)`` as :meth:`Store.counts` answers (every status)."""
    counts = dict.fromkeys(Status, 0)
    counts.update({Status(status): int(n) for status, n in rows})
    return counts


def _required(moment: datetime | None) -> datetime:
    assert moment is not None  # NOT NULL columns
    return moment
