"""Ledger records and executions as JSON documents, and the keyset cursor of a page
of jobs as an opaque token: what `broker-jobs jobs --json` prints and the
dashboard's `/api/` serves, in one place so the two cannot drift apart."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime, timedelta
from typing import Any

from broker_jobs.errors import BrokerJobsError
from broker_jobs.store.base import (
    MAX_PAYLOAD_BYTES,
    Execution,
    JobRecord,
    KeptOutput,
    KeptPayload,
    utc,
)

#: Why the ledger may have no payload of a job (the page, `jobs show`).
PAYLOAD_NOT_KEPT = (
    "not kept: the ledger keeps a job's payload when it was published with the ledger"
    " and recorded before a worker claimed it, or after a failure (not on every claim:"
    " that would cost throughput)"
)


class CursorError(BrokerJobsError, ValueError):
    """A token that is not a cursor :func:`encode_cursor` wrote."""


def iso(moment: datetime | None) -> str | None:
    """A time for a JSON document: ISO 8601 with microseconds, ``Z``; None stays None."""
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


def seconds(duration: timedelta | None) -> float | None:
    """A duration for a JSON document: seconds; None stays None."""
    return None if duration is None else duration.total_seconds()


def record_document(record: JobRecord) -> dict[str, Any]:
    """A ledger record in a JSON document."""
    return {
        "idempotency_key": record.idempotency_key,
        "job_id": record.job_id,
        "task": record.task,
        "state": record.waiting_status.value,
        "released": record.released,
        "attempts": record.attempts,
        "created_at": iso(record.created_at),
        "updated_at": iso(record.updated_at),
        "worker": record.worker,
        "lease_until": iso(record.lease_until),
        "due_at": iso(record.due_at),
        "last_error": record.last_error,
    }


def execution_document(execution: Execution) -> dict[str, Any]:
    """An execution in a JSON document."""
    return {
        "attempt": execution.attempt,
        "worker": execution.worker,
        "started_at": iso(execution.started_at),
        "finished_at": iso(execution.finished_at),
        "duration_seconds": seconds(execution.duration),
        "outcome": execution.outcome.value if execution.outcome else None,
        "error": execution.error,
    }


def payload_document(kept: KeptPayload | None) -> dict[str, Any] | None:
    """The payload the ledger keeps, in a JSON document; None when it keeps none.
    ``payload`` is None when it was too large to keep (``too_large``)."""
    if kept is None:
        return None
    return _kept_document("payload", kept.payload, kept.size, kept.kept_at)


def result_document(kept: KeptOutput | None) -> dict[str, Any] | None:
    """The handler's result the ledger keeps, in a JSON document; None when it keeps
    none. ``value`` is None when it was too large to keep (``too_large``)."""
    if kept is None or kept.result_size is None:
        return None
    return _kept_document("value", kept.result, kept.result_size, kept.kept_at)


def _kept_document(name: str, value: Any, size: int, kept_at: datetime) -> dict[str, Any]:
    """A JSON value the ledger keeps up to the cap (``value`` None: too large)."""
    return {
        name: value,
        "bytes": size,
        "too_large": value is None,
        "max_bytes": MAX_PAYLOAD_BYTES,
        "kept_at": iso(kept_at),
    }


def follow_ups_document(kept: KeptOutput | None) -> dict[str, Any]:
    """The follow-up jobs recorded with the success, and when the broker confirmed
    them all (``sent_at`` None: not yet; the job's next delivery publishes them)."""
    jobs = kept.follow_ups if kept is not None else ()
    return {
        "jobs": [
            {
                "job_id": job.id,
                "task": job.task,
                "idempotency_key": job.idempotency_key,
                "due_at": iso(job.due_at),
            }
            for job in jobs
        ],
        "sent_at": iso(kept.sent_at) if kept is not None else None,
    }


def size_too_large_text(size: int) -> str:
    """Why a payload or result the ledger counted (``size`` bytes) is not shown."""
    return (
        f"Too large to keep: its JSON is {size:,} bytes, the ledger keeps up to"
        f" {MAX_PAYLOAD_BYTES:,}"
    )


def too_large_text(kept: KeptPayload) -> str:
    """Why a payload the ledger counted is not shown."""
    return size_too_large_text(kept.size)


def encode_cursor(after: tuple[datetime, str]) -> str:
    """Store.page's keyset position as an opaque token (URL-safe base64 of JSON)."""
    moment, key = after
    data = json.dumps([utc(moment).isoformat(), key], separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def decode_cursor(token: str) -> tuple[datetime, str]:
    """The position :func:`encode_cursor` wrote; :class:`CursorError` for anything else."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        data = None
    if isinstance(data, list) and len(data) == 2 and all(isinstance(v, str) for v in data):
        try:
            return utc(datetime.fromisoformat(data[0])), data[1]
        except ValueError:
            pass  # not a time, or one without a zone: not ours either
    raise CursorError(
        f"{token!r} is not a cursor printed by `broker-jobs jobs list`: copy the token"
        " after --after from the previous page (or its JSON's next)"
    )
