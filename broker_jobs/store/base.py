"""The idempotency store: what every store does, and the claim rules they share.

The worker claims a job's idempotency key before running it and records the outcome
before acking (``docs/store.md``). The records double as the job-status ledger.

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

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import TracebackType
from typing import Any, NamedTuple, Protocol, Self

from broker_jobs.envelope import Job
from broker_jobs.errors import BrokerJobsError

#: Error texts are stored truncated to this many bytes of UTF-8 (a traceback's tail
#: is cut, with a marker), so one huge exception cannot bloat the ledger.
MAX_ERROR_BYTES = 4096
_TRUNCATED = "\n... [truncated by broker-jobs]"

#: A job's payload is kept (as JSON text) only up to this many bytes of UTF-8: a
#: larger one is not kept at all (its size is), so one huge job cannot bloat the
#: ledger. Cut JSON would not be JSON, so nothing is truncated.
MAX_PAYLOAD_BYTES = 64 * 1024

#: How long the worker should keep terminal records before pruning them. It must be
#: longer than any window in which a duplicate can still arrive: redelivery after a
#: broker or worker outage, a publisher retrying an unconfirmed job, beat catching up
#: missed runs. A pruned key runs again if its job shows up once more.
DEFAULT_RETENTION = timedelta(days=7)


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


class StoreError(BrokerJobsError):
    """The store failed: unreachable database, a schema from a newer version, a store
    used after close... The message says what to do; passwords are masked."""


class LeaseLostError(StoreError):
    """This worker no longer holds the job's lease (another worker took over after it
    expired, or the record already has an outcome). Do not ack as if the outcome was
    recorded: the holder of the lease decides the job's fate."""

    def __init__(self, key: str, worker: str | None, record: JobRecord | None, action: str):
        self.key = key
        self.worker = worker
        self.record = record
        if record is None:
            state = "there is no record of it"
        elif record.status is Status.RUNNING and record.worker is None:
            state = "it was released (no worker holds it)"
        elif record.status is Status.RUNNING:
            until = record.lease_until.isoformat() if record.lease_until else "-"
            state = f"it is running under {record.worker}'s lease until {until}"
        else:
            state = f"it is {record.status.value} (recorded by {record.worker or 'nobody'})"
        super().__init__(
            f"cannot {action} job key {key!r} as worker {worker!r}: {state}. This worker"
            " lost the lease; leave the job to the record's holder (do not record an outcome)"
        )


class Store(ABC):
    """Where the worker claims jobs and records outcomes; also the job-status ledger.

    Every method is safe to call from several threads; ``claim`` and the record methods
    are atomic across processes (and, for PostgreSQL, hosts). ``now`` parameters exist
    for tests with fixed clocks; leave them out in production.
    """

    @abstractmethod
    def claim(self, job: Job, worker: str, lease: float, *, now: datetime | None = None) -> Claim:
        """Decide whether ``worker`` runs ``job`` (see :func:`decide`); on CLAIMED the
        record is RUNNING, held by ``worker`` for ``lease`` seconds, attempts = job.attempt."""

    @abstractmethod
    def renew(self, key: str, worker: str, lease: float, *, now: datetime | None = None) -> None:
        """Extend the lease to ``now + lease``; LeaseLostError if not ours."""

    @abstractmethod
    def succeed(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        """RUNNING (ours) -> SUCCEEDED; LeaseLostError if not ours."""

    def claim_many(self, claims: Sequence[tuple[Job, str]], lease: float) -> list[Claim]:
        """:meth:`claim` for several jobs, each under its own holder, in order, as one
        call (the SQLite store runs them in one transaction of its group commit)."""
        check_lease(lease)  # before any write: a batch fails whole or not at all
        return [self.claim(job, worker, lease) for job, worker in claims]

    def try_claim_many(self, claims: Sequence[tuple[Job, str]], lease: float) -> list[Claim] | None:
        """:meth:`claim_many` done at once, on the caller's thread, if that needs no
        waiting (for a lock held elsewhere, a disk flush, the network); else None,
        and the caller calls :meth:`claim_many` with the same claims where waiting is
        harmless (some may be claimed already under their holders: it finds them
        ours). The worker tries it on its event loop: jobs claimed there start without
        a hop through the store's thread. This default never claims at once."""
        return None

    def try_succeed_many(self, finished: Sequence[tuple[str, str]]) -> list[str] | None:
        """:meth:`succeed_many` done at once on the caller's thread if that needs no
        waiting, else None (and the caller calls :meth:`succeed_many`, where waiting
        is harmless). Like :meth:`try_claim_many`, for the worker's event loop; this
        default never records at once (a durable store's commit waits for the disk)."""
        return None

    def succeed_many(self, finished: Sequence[tuple[str, str]]) -> list[str]:
        """:meth:`succeed` for several ``(key, worker)`` pairs, as one call; return the
        keys whose lease was lost (not raised: the others are recorded all the same)."""
        lost = []
        for key, worker in finished:
            try:
                self.succeed(key, worker)
            except LeaseLostError:
                lost.append(key)
        return lost

    @abstractmethod
    def succeed_with(
        self,
        key: str,
        worker: str,
        effects: Callable[[Any], None],
        *,
        now: datetime | None = None,
    ) -> None:
        """Run ``effects(connection)`` and record SUCCEEDED in one transaction of the
        store's database, so a handler's own writes happen exactly once: both commit
        or neither. ``connection`` is the store's (sqlite3 or psycopg; None for the
        memory store, which has no transactions). An exception from ``effects``
        propagates unchanged (the store's own steps raise :class:`StoreError`)."""

    def is_outage(self, error: BaseException) -> bool:
        """Whether ``error``, raised by a transactional handler's own statements, means
        that the database cannot be used now (the connection lost, the disk full, the
        file locked) rather than that the handler failed: the worker then waits for
        the ledger and runs the transaction again, spending no attempt."""
        return False

    @abstractmethod
    def retry(
        self,
        key: str,
        worker: str,
        error: str,
        due_at: datetime,
        *,
        now: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        """RUNNING (ours) -> RETRYING with the error and the next attempt's due time.
        ``payload``: the job's, kept with the outcome if the key has none yet."""

    @abstractmethod
    def fail(
        self,
        key: str,
        worker: str,
        error: str,
        *,
        now: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        """RUNNING (ours) -> FAILED: a permanent error, no retry. ``payload``: as for
        :meth:`retry`."""

    @abstractmethod
    def dead(
        self,
        key: str,
        worker: str | None,
        error: str,
        *,
        job: Job | None = None,
        job_id: str | None = None,
        task: str | None = None,
        now: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        """-> DEAD (dead-lettered). See :func:`dead_record` for the rules, including
        poison messages that never got a claim (the record is created). ``payload``:
        kept with the record it writes, if the key has none yet."""

    @abstractmethod
    def release(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        """Give a claim back without an outcome (shutdown before the job started): the
        record stays RUNNING with no holder and an expired lease, so the next claim
        takes it at once. A no-op when ``worker`` does not hold it."""

    @abstractmethod
    def get(self, key: str) -> JobRecord | None: ...

    @abstractmethod
    def get_by_job_id(self, job_id: str) -> list[JobRecord]:
        """Records of a job id, newest updated first (normally one)."""

    @abstractmethod
    def find(
        self,
        *,
        status: Status | None = None,
        task: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        key: str | None = None,
        after: tuple[datetime, str] | None = None,
        limit: int = 100,
    ) -> list[JobRecord]:
        """Records matching every given filter, newest updated first (ties: key
        descending), at most ``limit``. ``since``/``until``: updated at or after /
        before; ``key``: keys starting with it (``%`` and ``_`` are plain characters);
        ``after``: only records that come after ``(updated_at, key)`` in that order
        (keyset paging: see :meth:`page`)."""

    def page(
        self,
        *,
        status: Status | None = None,
        task: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        key: str | None = None,
        after: tuple[datetime, str] | None = None,
        limit: int = 100,
    ) -> Page:
        """:meth:`find`, with where the next page starts (keyset paging: as fast on
        the thousandth page as on the first, with the ``(updated_at)`` indexes)."""
        check_limit(limit)
        records = self.find(
            status=status,
            task=task,
            since=since,
            until=until,
            key=key,
            after=after,
            limit=limit + 1,
        )
        more = len(records) > limit
        records = records[:limit]
        last = records[-1] if more and records else None
        return Page(records, (last.updated_at, last.idempotency_key) if last else None)

    @abstractmethod
    def counts(self) -> dict[Status, int]:
        """How many records have each status (every status is a key)."""

    @abstractmethod
    def task_summaries(self, *, now: datetime | None = None) -> dict[str, TaskSummary]:
        """Per task with records: counts by status, the oldest waiting job, executions
        finished in the last minute and hour by outcome, and their p50/p99 durations."""

    @abstractmethod
    def outcome_buckets(
        self, *, since: datetime, bucket: timedelta, now: datetime | None = None
    ) -> dict[str, list[tuple[int, int]]]:
        """Per task with executions finished in (``since``, ``now``]: for each bucket of
        ``bucket`` length from ``since``, oldest first (the last may be partial), how
        many succeeded and how many failed (retrying, failed, dead), counted as
        :meth:`task_summaries` counts its hour. A bucket holds its end and not its
        start, as the summaries' windows do: the twelve 5-minute buckets since an hour
        before ``now`` add up to the hour's totals. By task name in order; a bucket
        without executions is ``(0, 0)``; no buckets (``{}``) when ``now <= since``.
        ``bucket`` must be positive."""

    @abstractmethod
    def record_published(
        self, jobs: Sequence[Job], *, now: datetime | None = None
    ) -> list[JobRecord | None]:
        """Record confirmed jobs as QUEUED (SCHEDULED when ``job.due_at`` is later than
        ``now``, with that due time), each only if its key has no record: a worker may
        have claimed it already, and a key seen before keeps its record. Returns, per
        job, the record its key already had (None when it was recorded now), so a
        caller can warn that a finished key will be skipped as a duplicate. Each record
        created is kept with its job's payload (:meth:`kept_payload`)."""

    @abstractmethod
    def kept_payload(self, key: str) -> KeptPayload | None:
        """The payload the ledger keeps for ``key``; None when it keeps none.

        Payloads are not kept on the hot path (a claim, a success): the ledger has one
        when the job was published with the ledger (:meth:`record_published`), or once
        it failed (:meth:`retry`, :meth:`fail`, :meth:`dead` given ``payload``), the
        first of these for the key (a later one never replaces it). One larger than
        :data:`MAX_PAYLOAD_BYTES` is kept as its size only (``too_large``). Pruning a
        record deletes its payload."""

    def payload(self, key: str) -> dict[str, Any] | None:
        """The job's payload, when the ledger has one (see :meth:`kept_payload`; None
        too for a payload too large to keep)."""
        kept = self.kept_payload(key)
        return None if kept is None else kept.payload

    def lookup(self, ref: str) -> JobRecord | None:
        """The record of a job named by its idempotency key or its job id (the key
        first). :class:`StoreError` if the id has several records (each key named)."""
        record = self.get(ref)
        if record is not None:
            return record
        records = self.get_by_job_id(ref)
        if len(records) > 1:
            keys = ", ".join(repr(r.idempotency_key) for r in records)
            raise StoreError(f"job id {ref!r} has {len(records)} records ({keys}): name one key")
        return records[0] if records else None

    @abstractmethod
    def cancel(self, ref: str, *, now: datetime | None = None) -> Cancellation:
        """Cancel the job named by ``ref`` (key or job id, see :meth:`lookup`) if it has
        not started: QUEUED, SCHEDULED, RETRYING or RUNNING without a holder become
        CANCELLED, and a claim of its key then answers CANCELLED. A running job is not
        interrupted."""

    @abstractmethod
    def reset_for_replay(self, key: str, *, now: datetime | None = None) -> JobRecord | None:
        """DEAD or FAILED -> QUEUED with attempts 0, no holder and no due time (the
        error and the executions stay), so the job published again runs. Returns the
        new record; None when the record was in another state (or missing) and is
        left as it is: a job replayed twice runs once."""

    @abstractmethod
    def executions(self, key: str) -> list[Execution]:
        """Every execution of the job of ``key``, oldest first (empty when it has no
        record, or was never claimed: a poison message dead-lettered unclaimed)."""

    @abstractmethod
    def prune(self, older_than: datetime) -> int:
        """Delete SUCCEEDED, FAILED, DEAD and CANCELLED records (:data:`TERMINAL`)
        updated before ``older_than``, with their executions and kept payloads; never
        waiting, RUNNING or RETRYING ones. Returns how many records were deleted."""

    # --- beat records: two small facts the beat keeps beside the ledger -----------------

    @abstractmethod
    def record_fire(self, schedule: str, fire_at: datetime) -> None:
        """Remember ``fire_at`` as the last emitted fire of ``schedule`` (an opaque key;
        the beat passes ``"<namespace>/<schedule name>"``). Monotonic: a fire older than
        (or equal to) the stored one changes nothing, whatever the order in which threads
        or processes call. Durable when it returns. :meth:`prune` never deletes fires."""

    @abstractmethod
    def last_fire(self, schedule: str) -> datetime | None:
        """The last fire recorded for ``schedule`` (aware UTC), None if none was."""

    @abstractmethod
    def last_fires(self, prefix: str = "") -> dict[str, datetime]:
        """The last fire of every schedule whose key starts with ``prefix`` (all when
        empty; case-sensitive)."""

    @abstractmethod
    def record_leader(
        self, group: str, identity: str, since: datetime, *, now: datetime | None = None
    ) -> None:
        """``identity`` leads the beat of ``group`` since ``since``, seen at ``now``: one
        record per group, the last writer wins (the broker decides who leads; the record
        only answers ``beat status``)."""

    @abstractmethod
    def leader(self, group: str) -> LeaderRecord | None:
        """The last leader recorded for ``group``, None if none was."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; idempotent. The store cannot be used afterwards."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# --- the rules, shared by the stores -------------------------------------------------


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
        created_at=record.created_at if record else now,
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
            created_at=now,
            updated_at=now,
            worker=worker,
            lease_until=None,
            last_error=error,
            due_at=None,
        )
    if record.status in TERMINAL:
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


def clip_error(error: str) -> str:
    """``error`` as stored: at most :data:`MAX_ERROR_BYTES` of UTF-8, NUL characters
    escaped (PostgreSQL text cannot hold them), unencodable characters replaced."""
    data = error.replace("\x00", "\\x00").encode("utf-8", "replace")
    if len(data) <= MAX_ERROR_BYTES:
        return data.decode("utf-8")
    keep = MAX_ERROR_BYTES - len(_TRUNCATED.encode("utf-8"))
    return data[:keep].decode("utf-8", "ignore") + _TRUNCATED


def payload_text(payload: Mapping[str, Any] | None) -> PayloadText | None:
    """``payload`` as the ledger stores it: compact JSON text, unless its UTF-8 is
    larger than :data:`MAX_PAYLOAD_BYTES` (then only the size). None for no payload,
    or one that is no JSON (a job's always is: it came as JSON or was sent as JSON).
    Control characters (NUL included) are escaped by JSON: PostgreSQL text takes it."""
    if payload is None:
        return None
    try:
        text = json.dumps(dict(payload), ensure_ascii=False, separators=(",", ":"))
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON's escapes carry it
        text = json.dumps(dict(payload), separators=(",", ":"))
        data = text.encode("utf-8")
    except (TypeError, ValueError):
        return None
    return PayloadText(text if len(data) <= MAX_PAYLOAD_BYTES else None, len(data))


def read_payload(text: str | None, size: int, kept_at: datetime) -> KeptPayload:
    """A stored payload back (JSON parsed, never evaluated); text that is not a JSON
    object (no code writes such) reads as not kept, like one too large."""
    payload = None
    if text is not None:
        try:
            found = json.loads(text)
        except ValueError:
            found = None
        payload = found if isinstance(found, dict) else None
    return KeptPayload(payload, size, kept_at)


def utc(moment: datetime | None) -> datetime:
    """``moment`` in UTC (now when None); naive datetimes are refused."""
    if moment is None:
        return datetime.now(UTC)
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} must be timezone-aware (for example datetime.now(UTC))")
    return moment.astimezone(UTC)


def check_lease(lease: float) -> float:
    if not lease > 0:
        raise ValueError(f"lease must be a positive number of seconds, got {lease!r}")
    return float(lease)


def check_limit(limit: int) -> int:
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return limit


_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^:/@\s]*):[^@\s]*@", re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)


def mask_dsn(text: str) -> str:
    """Mask passwords in database URLs (``scheme://user:***@host``) and in libpq
    ``password=...`` settings (keyword form or URL query) anywhere in ``text``."""
    return _KEYWORD_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", text))


# --- stores that read, decide and write under one exclusive section --------------------


class Records(Protocol):
    """The view of the records inside an exclusive section."""

    #: The database connection of the section (None for the memory store).
    connection: Any

    def load(self, key: str) -> JobRecord | None: ...

    def save(self, record: JobRecord) -> None:
        """Insert or replace the record of ``record.idempotency_key``."""

    def keep_payload(self, key: str, payload: PayloadText, now: datetime) -> None:
        """Keep ``payload`` for ``key`` unless it has one already (the first wins)."""


class ExclusiveStore(Store):
    """A store whose state changes run as read, decide, write inside one exclusive
    section (a lock, an immediate transaction); the rules above are applied in Python."""

    @abstractmethod
    def _exclusive(self) -> AbstractContextManager[Records]:
        """Enter a section no other thread or process changes records in; commit on
        normal exit, undo on an exception."""

    def claim(self, job: Job, worker: str, lease: float, *, now: datetime | None = None) -> Claim:
        lease, moment = check_lease(lease), utc(now)
        with self._exclusive() as records:
            return _claim_in(records, job, worker, lease, moment)

    def claim_many(self, claims: Sequence[tuple[Job, str]], lease: float) -> list[Claim]:
        # One section for the batch: one lock (a transaction) for the worker's
        # batches, not one per job.
        lease, moment = check_lease(lease), utc(None)
        with self._exclusive() as records:
            return [_claim_in(records, job, worker, lease, moment) for job, worker in claims]

    def succeed_many(self, finished: Sequence[tuple[str, str]]) -> list[str]:
        moment, lost = utc(None), []
        with self._exclusive() as records:
            for key, worker in finished:
                record = records.load(key)
                if record is None or not holds(record, worker):
                    lost.append(key)
                    continue
                records.save(_finished_record(record, Status.SUCCEEDED, moment))
        return lost

    def renew(self, key: str, worker: str, lease: float, *, now: datetime | None = None) -> None:
        lease, moment = check_lease(lease), utc(now)
        with self._held(key, worker, "renew the lease of") as (records, record):
            records.save(replace(record, lease_until=moment + timedelta(seconds=lease)))

    def succeed(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        self._finish(key, worker, "record success of", now=now, status=Status.SUCCEEDED)

    def succeed_with(
        self,
        key: str,
        worker: str,
        effects: Callable[[Any], None],
        *,
        now: datetime | None = None,
    ) -> None:
        moment = utc(now)
        try:
            with self._held(key, worker, "record success of") as (records, record):
                try:
                    effects(records.connection)
                except Exception as error:  # past the store's translation of its own errors
                    raise _EffectsFailed(error) from error
                records.save(_finished_record(record, Status.SUCCEEDED, moment))
        except _EffectsFailed as failed:
            raise failed.error from failed.error.__cause__

    def retry(
        self,
        key: str,
        worker: str,
        error: str,
        due_at: datetime,
        *,
        now: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        self._finish(
            key,
            worker,
            "record a retry of",
            now=now,
            status=Status.RETRYING,
            error=error,
            due_at=utc(due_at),
            payload=payload,
        )

    def fail(
        self,
        key: str,
        worker: str,
        error: str,
        *,
        now: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        self._finish(
            key,
            worker,
            "record failure of",
            now=now,
            status=Status.FAILED,
            error=error,
            payload=payload,
        )

    def _finish(
        self,
        key: str,
        worker: str,
        action: str,
        *,
        now: datetime | None,
        status: Status,
        error: str | None = None,
        due_at: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        moment = utc(now)
        with self._held(key, worker, action) as (records, record):
            records.save(_finished_record(record, status, moment, error, due_at))
            _keep(records, key, payload, moment)

    def dead(
        self,
        key: str,
        worker: str | None,
        error: str,
        *,
        job: Job | None = None,
        job_id: str | None = None,
        task: str | None = None,
        now: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        moment = utc(now)
        with self._exclusive() as records:
            new = dead_record(
                records.load(key),
                key,
                worker,
                error,
                job=job,
                job_id=job_id,
                task=task,
                now=moment,
            )
            if new is not None:
                records.save(new)
                _keep(records, key, payload, moment)

    def release(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        moment = utc(now)
        with self._exclusive() as records:
            record = records.load(key)
            if record is not None and holds(record, worker):
                records.save(replace(record, worker=None, lease_until=moment))

    def record_published(
        self, jobs: Sequence[Job], *, now: datetime | None = None
    ) -> list[JobRecord | None]:
        moment = utc(now)
        with self._exclusive() as records:
            existing = []
            for job in jobs:
                record = records.load(job.idempotency_key)
                if record is None:
                    records.save(published_record(job, moment))
                    _keep(records, job.idempotency_key, job.payload, moment)
                existing.append(record)
            return existing

    def cancel(self, ref: str, *, now: datetime | None = None) -> Cancellation:
        moment = utc(now)
        found = self.lookup(ref)
        if found is None:
            return Cancellation(CancelOutcome.UNKNOWN, None)
        with self._exclusive() as records:
            result = cancelled(records.load(found.idempotency_key), moment)
            if result.outcome is CancelOutcome.CANCELLED:
                assert result.record is not None
                records.save(result.record)
            return result

    def reset_for_replay(self, key: str, *, now: datetime | None = None) -> JobRecord | None:
        moment = utc(now)
        with self._exclusive() as records:
            new = replay_record(records.load(key), moment)
            if new is not None:
                records.save(new)
            return new

    @contextmanager
    def _held(self, key: str, worker: str, action: str) -> Iterator[tuple[Records, JobRecord]]:
        """An exclusive section on a record that ``worker`` must hold."""
        with self._exclusive() as records:
            record = records.load(key)
            if record is None or not holds(record, worker):
                raise LeaseLostError(key, worker, record, action)
            yield records, record


class _EffectsFailed(Exception):
    """Carries a transactional handler's exception out of the store's section
    unchanged (a section turns the database's own errors into StoreError)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _claim_in(records: Records, job: Job, worker: str, lease: float, moment: datetime) -> Claim:
    """:meth:`Store.claim` in the exclusive section of ``records``."""
    record = records.load(job.idempotency_key)
    outcome = decide(record, job, worker, moment)
    if outcome is not ClaimOutcome.CLAIMED:
        assert record is not None  # only a missing record is claimed without one
        return Claim(outcome, record)
    new = claimed_record(record, job, worker, lease, moment)
    records.save(new)
    return Claim(outcome, new)


def _finished_record(
    record: JobRecord,
    status: Status,
    moment: datetime,
    error: str | None = None,
    due_at: datetime | None = None,
) -> JobRecord:
    """``record`` (held) ended with ``status``: its lease given up."""
    return replace(
        record,
        status=status,
        updated_at=moment,
        lease_until=None,
        last_error=clip_error(error) if error is not None else record.last_error,
        due_at=due_at,
    )


def _keep(records: Records, key: str, payload: Mapping[str, Any] | None, moment: datetime) -> None:
    """Keep ``payload`` for ``key`` in the section of ``records`` (if it is JSON)."""
    stored = payload_text(payload)
    if stored is not None:
        records.keep_payload(key, stored, moment)
