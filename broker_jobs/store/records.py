"""The values the stores take and hand back: job records, claims, executions,
summaries. Plain enums and frozen dataclasses with no store behind them, so the
worker, the dashboard and the command line hold, compare and print them without a
database, and every store answers with the same types (``docs/store.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

from broker_jobs.envelope import Job


class Status(StrEnum):
    QUEUED = "queued"  # published and confirmed (a publisher given the ledger), not claimed
    SCHEDULED = "scheduled"  # the same, delayed: due at ``due_at``
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"  # cancelled before it started: never runs


#: Statuses that end a job: prune may delete them. A claim of such a key answers DONE
#: (CANCELLED for a cancelled one).
TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.DEAD, Status.CANCELLED})
#: Known to the ledger from its publish on, not claimed yet: a claim takes it as new.
WAITING = frozenset({Status.QUEUED, Status.SCHEDULED})
#: What :meth:`Store.cancel` may cancel: nothing has started (a RUNNING record with no
#: holder was released at a shutdown before its handler started).
CANCELLABLE = frozenset({Status.QUEUED, Status.SCHEDULED, Status.RETRYING})
#: What :meth:`Store.reset_for_replay` resets to QUEUED.
REPLAYABLE = frozenset({Status.DEAD, Status.FAILED})


class ClaimOutcome(StrEnum):
    CLAIMED = "claimed"  # run it
    DONE = "done"  # already SUCCEEDED, FAILED or DEAD: ack without running (a duplicate)
    BUSY = "busy"  # RUNNING under another worker's live lease: re-check later
    STALE = "stale"  # an older attempt than the ledger knows: ack without running
    CANCELLED = "cancelled"  # cancelled before it started: ack without running


@dataclass(frozen=True)
class JobRecord:
    """One idempotency key's state; all times are timezone-aware UTC."""

    idempotency_key: str
    job_id: str
    task: str
    status: Status
    attempts: int  # the attempt number last claimed (0: never claimed, e.g. a poison message)
    created_at: datetime
    updated_at: datetime  # last change of status (a lease renewal does not count)
    worker: str | None  # who holds the lease (RUNNING) or recorded the outcome
    lease_until: datetime | None  # RUNNING only
    last_error: str | None
    due_at: datetime | None  # RETRYING only: when the next attempt is due

    @property
    def released(self) -> bool:
        """RUNNING with no holder: claimed, then given back unstarted at a shutdown
        (:meth:`Store.release`); its delivery waits in the queue again."""
        return self.status is Status.RUNNING and self.worker is None

    @property
    def waiting_status(self) -> Status:
        """Its status as figures and filters count it: a released record is QUEUED
        there (no worker runs it), though the ledger keeps it RUNNING for the claim
        rules."""
        return Status.QUEUED if self.released else self.status

    @property
    def state_label(self) -> str:
        """Its state for people: the waiting status, saying when it was released."""
        return "queued (released)" if self.released else self.status.value

    def outcome_by(self, holder: str) -> Status | None:
        """The outcome ``holder`` recorded here (None: none of its). A holder id is
        one delivery's own (``worker_id#n``), so only that run's commit can have
        written it: met by a try after the ledger failed, it is an earlier try's
        commit whose answer the failure took (a connection dropped in the commit),
        not a lease taken over."""
        if self.worker != holder or self.status is Status.RUNNING:
            return None
        return self.status


@dataclass(frozen=True)
class KeptPayload:
    """The payload the ledger keeps for a key (:meth:`Store.kept_payload`)."""

    #: The job's payload; None when its JSON was larger than :data:`MAX_PAYLOAD_BYTES`
    #: (too large to keep: only its size is).
    payload: dict[str, Any] | None
    size: int  # bytes of its JSON text (UTF-8)
    kept_at: datetime  # when it was kept (aware UTC)

    @property
    def too_large(self) -> bool:
        return self.payload is None


class PayloadText(NamedTuple):
    """A payload as stored: its JSON text (None when too large to keep) and size."""

    text: str | None
    size: int


@dataclass(frozen=True)
class Output:
    """What a success leaves beside its status (:meth:`Store.succeed`'s ``output``):
    the handler's result as stored, and the follow-up jobs it asked for, to be
    published after the success is recorded (``JobContext.then``)."""

    #: The handler's return value as JSON text (text None: too large, only its size);
    #: None when it returned nothing to keep.
    result: PayloadText | None = None
    #: The follow-ups, exactly as they are published (ids, keys, due times).
    follow_ups: tuple[Job, ...] = ()

    @property
    def empty(self) -> bool:
        return self.result is None and not self.follow_ups


@dataclass(frozen=True)
class KeptOutput:
    """What the ledger keeps of a success (:meth:`Store.output`)."""

    #: The result, parsed (never evaluated); None when the handler returned none or
    #: its JSON was too large to keep (then ``result_size`` says how large).
    result: Any
    #: Bytes of the result's JSON text (UTF-8); None when no result was kept.
    result_size: int | None
    #: The follow-up jobs recorded with the success, in the order they are published.
    follow_ups: tuple[Job, ...]
    #: When the broker confirmed every follow-up (None: not yet, or none).
    sent_at: datetime | None
    kept_at: datetime  # when the success recorded it (aware UTC)
    #: The result was larger than the cap: only ``result_size`` was kept (a kept
    #: JSON ``null`` is a result, not this).
    result_too_large: bool = False

    @property
    def follow_ups_pending(self) -> bool:
        """Follow-ups recorded that the broker has not confirmed yet (a worker died
        between the record and the ack): the job's next delivery publishes them."""
        return bool(self.follow_ups) and self.sent_at is None


@dataclass(frozen=True)
class Finish:
    """How the holder of a claim ends it (:meth:`Store.succeed`, ``retry``, ``fail``):
    what a store's ``_finish`` records, the arguments checked and the error clipped."""

    status: Status  # SUCCEEDED, RETRYING or FAILED
    action: str  # what a LeaseLostError says could not be done
    error: str | None = None  # RETRYING, FAILED: the error, as stored
    due_at: datetime | None = None  # RETRYING: when the next attempt is due (UTC)
    payload: PayloadText | None = None  # kept with the outcome if the key has none
    #: SUCCEEDED: the result and follow-ups, written in the same atomic step (they
    #: replace any kept for the key before). None: nothing to keep.
    output: Output | None = None


#: :meth:`Store.succeed`'s finish.
SUCCESS = Finish(Status.SUCCEEDED, "record success of")


def succeeded_with(output: Output) -> Finish:
    """:meth:`Store.succeed`'s finish when the success keeps ``output``."""
    return Finish(Status.SUCCEEDED, SUCCESS.action, output=output)


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    record: JobRecord  # the record after the claim (CLAIMED) or the one that decided it


class CancelOutcome(StrEnum):
    """What :meth:`Store.cancel` did."""

    CANCELLED = "cancelled"  # it was queued, scheduled, retrying or released: now cancelled
    ALREADY_CANCELLED = "already-cancelled"  # nothing changed
    RUNNING = "running"  # a handler runs it: not interrupted, nothing changed
    FINISHED = "finished"  # succeeded, failed or dead already: nothing changed
    UNKNOWN = "unknown"  # no record has that key or job id: nothing changed


@dataclass(frozen=True)
class Cancellation:
    outcome: CancelOutcome
    record: JobRecord | None  # after the change (CANCELLED) or as found; None if UNKNOWN


@dataclass(frozen=True)
class TaskSummary:
    """One task's jobs in the ledger (:meth:`Store.task_summaries`)."""

    task: str
    counts: dict[Status, int]  # every status a key
    #: When the oldest job still waiting to start was published (QUEUED) or became due
    #: (SCHEDULED or RETRYING whose due time passed); None when none waits.
    oldest_waiting: datetime | None
    succeeded_last_minute: int  # executions that ended so, by their finish time
    failed_last_minute: int  # executions ending retrying, failed or dead
    succeeded_last_hour: int
    failed_last_hour: int
    #: Durations of the executions finished in the last hour (None when none did).
    p50: timedelta | None
    p99: timedelta | None


@dataclass(frozen=True)
class Page:
    """Where a listing of :meth:`Store.find` goes on: pass ``after`` of the last page."""

    records: list[JobRecord]
    #: ``(updated_at, idempotency_key)`` of the last record, for the next page; None at
    #: the end.
    after: tuple[datetime, str] | None


class ExecutionOutcome(StrEnum):
    """How an execution (one claim of a job, held by one worker) ended."""

    SUCCEEDED = "succeeded"  # succeed, succeed_many, succeed_with
    RETRYING = "retrying"  # retry: a later attempt is due
    FAILED = "failed"  # fail: a permanent error
    DEAD = "dead"  # dead: dead-lettered (by the holder, or after its lease expired)
    RELEASED = "released"  # release: given back without an outcome (shutdown)
    LOST = "lost"  # the lease lapsed and another claim took the job over


@dataclass(frozen=True)
class Execution:
    """One execution of a job: a claim (CLAIMED) and how it ended. Times are aware UTC.

    A job has one per claim that ran it: attempt 1, its retries, a takeover after a
    worker died. ``finished_at`` and ``outcome`` are None while it runs; a takeover
    closes the lost execution at the new claim's time, a release at the release's.
    """

    idempotency_key: str
    job_id: str
    attempt: int
    worker: str  # the holder (the worker id that claimed it)
    started_at: datetime
    finished_at: datetime | None
    outcome: ExecutionOutcome | None
    error: str | None  # RETRYING, FAILED, DEAD: the error recorded with the outcome

    @property
    def duration(self) -> timedelta | None:
        """``finished_at - started_at``; None while it runs."""
        return None if self.finished_at is None else self.finished_at - self.started_at


@dataclass(frozen=True)
class LeaderRecord:
    """The beat leader a group last heard of (for ``beat status``); times are aware UTC."""

    group: str
    identity: str  # who leads
    since: datetime  # when it became leader (its own account)
    seen_at: datetime  # when it last announced itself
    #: The digest of each of its schedules, by name (``scheduler.digests``); None when
    #: it did not say (a beat of an older version, a store without the column).
    schedules: Mapping[str, str] | None = None
