"""The idempotency store: what every store does (:class:`Store`), and where the names
the rest of the library imports from ``broker_jobs.store.base`` live.

The worker claims a job's idempotency key before running it and records the outcome
before acking (``docs/store.md``). The records double as the job-status ledger.

A store implements the queries and the atomic steps its database makes possible;
what callers give is checked here once (leases, limits, aware times, clipped
errors, payloads as stored), and the public methods that only differ in the rule
they apply (:meth:`Store.retry` and :meth:`Store.fail`; :meth:`Store.dead`,
:meth:`Store.cancel` and :meth:`Store.reset_for_replay`; :meth:`Store.find` and
:meth:`Store.page`) are written once on top of a store's ``_finish``, ``_rewrite``
and ``_find``. The rules themselves are :mod:`broker_jobs.store.rules`; the values,
:mod:`broker_jobs.store.records`.

Why some 700 lines: this is the contract every store meets, one abstract method
with its documented promise per operation (claims, outcomes, the ledger's queries,
the dead letters' index, beat records, heartbeats, controls, queue depths); split,
a reader could no longer see in one place what a store must do.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Unpack

from broker_jobs.closing import Closing
from broker_jobs.dead_letter import DeadLetter, DeadLetterFilter
from broker_jobs.envelope import Job
from broker_jobs.store.controls import StopRequest, TaskPause
from broker_jobs.store.dead_letter_index import IndexedDeadLetter, IndexRow
from broker_jobs.store.depths import DepthSeries
from broker_jobs.store.errors import LeaseLostError, StoreError
from broker_jobs.store.ledger import Filtering, Filters
from broker_jobs.store.processes import ProcessRecord
from broker_jobs.store.records import (
    CANCELLABLE,
    REPLAYABLE,
    SUCCESS,
    TERMINAL,
    WAITING,
    Cancellation,
    CancelOutcome,
    Claim,
    ClaimOutcome,
    Execution,
    ExecutionOutcome,
    Finish,
    JobRecord,
    KeptOutput,
    KeptPayload,
    LeaderRecord,
    Output,
    Page,
    PayloadText,
    Status,
    TaskSummary,
    succeeded_with,
)
from broker_jobs.store.rules import (
    cancelled,
    claimed_record,
    closing,
    dead_record,
    decide,
    holds,
    published_record,
    replay_record,
    track_execution,
)
from broker_jobs.store.values import (
    MAX_ERROR_BYTES,
    MAX_PAYLOAD_BYTES,
    check_lease,
    check_limit,
    clip_error,
    follow_ups_text,
    json_text,
    mask_dsn,
    payload_text,
    read_output,
    read_payload,
    utc,
)

__all__ = [
    # the interface
    "Store",
    "DEFAULT_RETENTION",
    # the values (broker_jobs.store.records)
    "Status",
    "TERMINAL",
    "WAITING",
    "CANCELLABLE",
    "REPLAYABLE",
    "ClaimOutcome",
    "Claim",
    "JobRecord",
    "KeptPayload",
    "PayloadText",
    "Finish",
    "SUCCESS",
    "Output",
    "KeptOutput",
    "CancelOutcome",
    "Cancellation",
    "TaskSummary",
    "Page",
    "ExecutionOutcome",
    "Execution",
    "LeaderRecord",
    # errors (broker_jobs.store.errors)
    "StoreError",
    "LeaseLostError",
    # the rules (broker_jobs.store.rules)
    "decide",
    "claimed_record",
    "holds",
    "published_record",
    "cancelled",
    "replay_record",
    "dead_record",
    "track_execution",
    "closing",
    "succeeded_with",
    # checks and stored forms (broker_jobs.store.values)
    "MAX_ERROR_BYTES",
    "MAX_PAYLOAD_BYTES",
    "clip_error",
    "payload_text",
    "json_text",
    "follow_ups_text",
    "read_output",
    "read_payload",
    "utc",
    "check_lease",
    "check_limit",
    "mask_dsn",
]


#: How long the worker should keep terminal records before pruning them. It must be
#: longer than any window in which a duplicate can still arrive: redelivery after a
#: broker or worker outage, a publisher retrying an unconfirmed job, beat catching up
#: missed runs. A pruned key runs again if its job shows up once more.
DEFAULT_RETENTION = timedelta(days=7)


#: What changes one record under the store's lock: the record (None without one) and
#: the time of the change -> the record to write, or None to leave it as it is.
Rule = Callable[[JobRecord | None, datetime], JobRecord | None]


class Store(Closing, ABC):
    """Where the worker claims jobs and records outcomes; also the job-status ledger.

    Every method is safe to call from several threads; ``claim`` and the record methods
    are atomic across processes (and, for PostgreSQL, hosts). ``now`` parameters exist
    for tests with fixed clocks; leave them out in production.
    """

    #: Whether :meth:`succeed_with` gives a transactional handler a database
    #: connection whose writes commit with the success (not the memory store's).
    has_transactions: bool = True

    @abstractmethod
    def claim(self, job: Job, worker: str, lease: float, *, now: datetime | None = None) -> Claim:
        """Decide whether ``worker`` runs ``job`` (the rules of
        :func:`~broker_jobs.store.rules.decide`); on CLAIMED the record is RUNNING, held
        by ``worker`` for ``lease`` seconds, attempts = job.attempt."""

    @abstractmethod
    def renew(self, key: str, worker: str, lease: float, *, now: datetime | None = None) -> None:
        """Extend the lease to ``now + lease``; LeaseLostError if not ours."""

    def succeed(
        self,
        key: str,
        worker: str,
        *,
        now: datetime | None = None,
        output: Output | None = None,
    ) -> None:
        """RUNNING (ours) -> SUCCEEDED; LeaseLostError if not ours. ``output``: the
        handler's result and follow-ups, kept in the same atomic step (replacing any
        the key had; :meth:`output` reads it)."""
        finish = SUCCESS if output is None or output.empty else succeeded_with(output)
        self._finish(key, worker, finish, now)

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

    def succeed_many_keeping(self, finished: Sequence[tuple[str, str, Output]]) -> list[str]:
        """:meth:`succeed` with an output for several ``(key, worker, output)``, as one
        call (one transaction where the store can); the keys whose lease was lost."""
        lost = []
        for key, worker, output in finished:
            try:
                self.succeed(key, worker, output=output)
            except LeaseLostError:
                lost.append(key)
        return lost

    @abstractmethod
    def succeed_with(
        self,
        key: str,
        worker: str,
        effects: Callable[[Any], Output | None],
        *,
        now: datetime | None = None,
    ) -> None:
        """Run ``effects(connection)`` and record SUCCEEDED in one transaction of the
        store's database, so a handler's own writes happen exactly once: both commit
        or neither. ``connection`` is the store's (sqlite3 or psycopg; None for the
        memory store, which has no transactions). The :class:`Output` that
        ``effects`` returns (None: none) is kept in the same transaction, as
        :meth:`succeed` keeps it. An exception from ``effects`` propagates unchanged
        (the store's own steps raise :class:`StoreError`)."""

    def is_outage(self, error: BaseException) -> bool:
        """Whether ``error``, raised by a transactional handler's own statements, means
        that the database cannot be used now (the connection lost, the disk full, the
        file locked) rather than that the handler failed: the worker then waits for
        the ledger and runs the transaction again, spending no attempt."""
        return False

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
        stored, due = payload_text(payload), utc(due_at)
        finish = Finish(Status.RETRYING, "record a retry of", clip_error(error), due, stored)
        self._finish(key, worker, finish, now)

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
        stored = payload_text(payload)
        finish = Finish(Status.FAILED, "record failure of", clip_error(error), payload=stored)
        self._finish(key, worker, finish, now)

    @abstractmethod
    def _finish(self, key: str, worker: str, finish: Finish, now: datetime | None) -> None:
        """RUNNING (ours) -> ``finish.status`` at ``now`` (else the store's time): the
        lease given up, ``finish.error`` (when given) and ``finish.due_at`` written, and
        ``finish.payload`` kept if the key has none; one atomic step. LeaseLostError
        (saying ``finish.action``) if ``worker`` does not hold the record."""

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
        letter: DeadLetter | None = None,
    ) -> None:
        """-> DEAD (dead-lettered). See :func:`~broker_jobs.store.rules.dead_record` for
        the rules, including poison messages that never got a claim (the record is
        created). ``payload``: kept with the record it writes, if the key has none yet.
        ``letter``: the dead letter made of it, indexed in the same step
        (:mod:`~broker_jobs.store.dead_letter_index`)."""

        def rule(record: JobRecord | None, moment: datetime) -> JobRecord | None:
            return dead_record(
                record, key, worker, error, job=job, job_id=job_id, task=task, now=moment
            )

        row = IndexRow.of(letter) if letter is not None and self.indexes_dead_letters else None
        self._rewrite(
            key, rule, now, f"mark job key {key!r} dead", payload_text(payload), letter=row
        )

    @abstractmethod
    def _rewrite(
        self,
        key: str,
        rule: Rule,
        now: datetime | None,
        action: str,
        payload: PayloadText | None = None,
        *,
        letter: IndexRow | None = None,
    ) -> JobRecord | None:
        """Apply ``rule`` to ``key``'s record at ``now`` (else the store's time) as one
        atomic step: write what it returns (creating the record if there was none) and
        keep ``payload`` with it if the key has none; return it. ``letter``: a dead
        letter to index in the same step (whatever the rule returns). ``action``: what
        a :class:`StoreError` says could not be done."""

    @abstractmethod
    def release(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        """Give a claim back without an outcome (shutdown before the job started): the
        record stays RUNNING with no holder and an expired lease, so the next claim
        takes it at once. A no-op when ``worker`` does not hold it."""

    @abstractmethod
    def lapse(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        """End ``worker``'s lease now, its process known dead (it cannot give its claim
        back itself): the record stays RUNNING under it, so the next claim takes the
        job over as after a lease that lapsed (its execution ``lost``). A no-op when
        ``worker`` does not hold it."""

    @abstractmethod
    def get(self, key: str) -> JobRecord | None: ...

    @abstractmethod
    def get_by_job_id(self, job_id: str) -> list[JobRecord]:
        """Records of a job id, newest updated first (normally one)."""

    def find(self, *, limit: int = 100, **filters: Unpack[Filtering]) -> list[JobRecord]:
        """Records matching every given filter, newest updated first (ties: key
        descending), or with ``oldest_first=True`` oldest updated first (ties: key
        ascending), at most ``limit``. ``since``/``until``: updated at or after /
        before; ``key``: keys starting with it (``%`` and ``_`` are plain characters);
        ``after``: only records that come after ``(updated_at, key)`` in that order
        (keyset paging: see :meth:`page`). The filters: :class:`Filtering`."""
        limit = check_limit(limit)
        return self._find(Filters.of(**filters), limit)

    def page(self, *, limit: int = 100, **filters: Unpack[Filtering]) -> Page:
        """:meth:`find`, with where the next page starts (keyset paging: as fast on
        the thousandth page as on the first, in either order, with the
        ``(updated_at)`` indexes); pass the same ``oldest_first`` with its ``after``."""
        limit = check_limit(limit)
        records = self._find(Filters.of(**filters), limit + 1)
        more = len(records) > limit
        records = records[:limit]
        last = records[-1] if more and records else None
        return Page(records, (last.updated_at, last.idempotency_key) if last else None)

    @abstractmethod
    def _find(self, filters: Filters, limit: int) -> list[JobRecord]:
        """The query of :meth:`find`: the records ``filters`` match in their order
        (:meth:`Filters.order_sql`: newest updated first, ties by key descending by code
        point; or the reverse), at most ``limit``."""

    def count(self, **filters: Unpack[Filtering]) -> int:
        """How many records :meth:`find` with these filters returns without a limit
        (the dashboard's "N matching"). A count reads every matching entry of the
        index it uses (docs/dashboard.md, Performance: up to ~200 ms at 1,000,000)."""
        return self._count(Filters.of(**filters))

    @abstractmethod
    def _count(self, filters: Filters) -> int:
        """The query of :meth:`count`."""

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

    @abstractmethod
    def output(self, key: str) -> KeptOutput | None:
        """What the success of ``key`` kept (its result, its follow-ups and whether the
        broker confirmed them); None when it kept nothing (no success yet, a handler
        that returned None and asked for no follow-up, a task that opted out). Pruning
        a record deletes its output."""

    def output_of(self, record: JobRecord) -> KeptOutput | None:
        """:meth:`output` of ``record``'s success: None unless it succeeded and kept
        one. An output kept by another success of the key (a record an older version
        pruned, leaving its output) is not this one's: a success's output is kept
        with its record's ``updated_at``."""
        if record.status is not Status.SUCCEEDED:
            return None
        kept = self.output(record.idempotency_key)
        return kept if kept is not None and kept.kept_at == record.updated_at else None

    @abstractmethod
    def mark_follow_ups_sent(self, key: str, *, now: datetime | None = None) -> None:
        """Record that the broker confirmed every follow-up of ``key``'s success (a
        later delivery of the job then publishes none again). No output: nothing."""

    def result(self, ref: str) -> Any:
        """The result the handler of the job named by ``ref`` (key or job id, see
        :meth:`lookup`) returned, as JSON values (a pydantic model's fields as a
        dict); None when the job has not succeeded, returned nothing, or its result
        was too large to keep (:meth:`output` tells these apart)."""
        record = self.lookup(ref)
        kept = None if record is None else self.output_of(record)
        return None if kept is None else kept.result

    def wait(self, ref: str, *, timeout: float, poll: float = 0.05) -> JobRecord:
        """Wait until the job named by ``ref`` (key or job id) has ended (succeeded,
        failed, dead or cancelled) and return its record; :class:`TimeoutError` after
        ``timeout`` seconds, saying the status it was in. It reads the ledger every
        ``poll`` seconds (doubling up to 1 s): for scripts and tests, not for a hot
        path (from async code: ``await asyncio.to_thread(store.wait, ref, timeout=30)``).
        A job the ledger has no record of yet (not claimed, published without the
        ledger) is waited for too."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.lookup(ref)
            if record is not None and record.status in TERMINAL:
                return record
            left = deadline - time.monotonic()
            if left <= 0:
                state = _state(record)
                raise TimeoutError(f"job {ref!r} did not end within {timeout:g} s ({state})")
            time.sleep(min(poll, left))
            poll = min(poll * 2, 1.0)

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

    def cancel(self, ref: str, *, now: datetime | None = None) -> Cancellation:
        """Cancel the job named by ``ref`` (key or job id, see :meth:`lookup`) if it has
        not started: QUEUED, SCHEDULED, RETRYING or RUNNING without a holder become
        CANCELLED, and a claim of its key then answers CANCELLED. A running job is not
        interrupted."""
        found = self.lookup(ref)
        if found is None:
            return Cancellation(CancelOutcome.UNKNOWN, None)
        key = found.idempotency_key
        decided: list[Cancellation] = []  # the last decision is the one written

        def rule(record: JobRecord | None, moment: datetime) -> JobRecord | None:
            decided.append(cancelled(record, moment))
            return decided[-1].record if decided[-1].outcome is CancelOutcome.CANCELLED else None

        self._rewrite(key, rule, now, f"cancel job key {key!r}")
        return decided[-1]

    def reset_for_replay(self, key: str, *, now: datetime | None = None) -> JobRecord | None:
        """DEAD or FAILED -> QUEUED with attempts 0, no holder and no due time (the
        error and the executions stay), so the job published again runs. Returns the
        new record; None when the record was in another state (or missing) and is
        left as it is: a job replayed twice runs once."""
        return self._rewrite(key, replay_record, now, f"reset job key {key!r}")

    @abstractmethod
    def executions(self, key: str) -> list[Execution]:
        """Every execution of the job of ``key``, oldest first (empty when it has no
        record, or was never claimed: a poison message dead-lettered unclaimed)."""

    @abstractmethod
    def prune(self, older_than: datetime) -> int:
        """Delete SUCCEEDED, FAILED, DEAD and CANCELLED records (:data:`TERMINAL`)
        updated before ``older_than``, with their executions and kept payloads; never
        waiting, RUNNING or RETRYING ones. Returns how many records were deleted."""

    # --- the index of dead letters (broker_jobs.store.dead_letter_index) ---------------

    #: Whether this store keeps the index (a PostgreSQL role that may not write its
    #: table does not: dead letters are then read from their queues).
    indexes_dead_letters: bool = True

    def index_dead_letters(
        self, letters: Sequence[DeadLetter], *, pass_id: str | None = None
    ) -> None:
        """Index ``letters``, seen by the pass ``pass_id`` (None: not by a pass). One
        transaction. An entry already there is rewritten in its place when it is the
        same dead-lettering (the same dead at: a second copy in the queue); one of an
        earlier dead-lettering of the job (it was replayed and died again) is replaced
        by a new entry, placed last."""
        if self.indexes_dead_letters and letters:
            self._index([IndexRow.of(letter) for letter in letters], pass_id)

    @abstractmethod
    def _index(self, rows: Sequence[IndexRow], pass_id: str | None) -> None:
        """Insert or rewrite ``rows`` (by task and letter id, as
        :meth:`index_dead_letters` says), stamped ``pass_id``."""

    @abstractmethod
    def dead_letters(
        self,
        tasks: Sequence[str],
        where: DeadLetterFilter | None = None,
        *,
        limit: int = 100,
        offset: int = 0,
    ) -> list[IndexedDeadLetter]:
        """The indexed dead letters of ``tasks`` that ``where`` takes, in the order
        they were first indexed (their queues' order), ``offset`` of them skipped."""

    @abstractmethod
    def dead_letter_counts(
        self, tasks: Sequence[str], where: DeadLetterFilter | None = None
    ) -> dict[str, int]:
        """How many indexed dead letters of each of ``tasks`` (0s included) ``where``
        takes."""

    @abstractmethod
    def unindex_dead_letters(self, task: str, letters: Sequence[DeadLetter]) -> int:
        """Drop the entries of ``letters`` (dead letters of ``task`` a pass took), each
        only while it is still that dead-lettering (the same letter id and dead at): a
        job replayed and dead again meanwhile has a new entry, which stays. How many
        were dropped."""

    @abstractmethod
    def dead_letter_mark(self, task: str) -> int:
        """The place of ``task``'s newest entry (0 without one): a pass takes it
        before it starts, and sweeps up to it when it ends."""

    @abstractmethod
    def sweep_dead_letters(self, task: str, *, up_to: int, pass_id: str) -> int:
        """Drop ``task``'s entries placed up to ``up_to`` that the pass ``pass_id``
        did not see (their dead letters left the queue); how many."""

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
        self,
        group: str,
        identity: str,
        since: datetime,
        *,
        now: datetime | None = None,
        schedules: Mapping[str, str] | None = None,
    ) -> None:
        """``identity`` leads the beat of ``group`` since ``since``, seen at ``now``, with
        ``schedules`` (each one's digest, by name): one record per group, the last
        writer wins (the broker decides who leads; the record answers ``beat status``
        and lets the other beats compare their schedules with the leader's)."""

    @abstractmethod
    def leader(self, group: str) -> LeaderRecord | None:
        """The last leader recorded for ``group``, None if none was."""

    # --- heartbeats: one record per daemon process (broker_jobs.store.processes) -------

    @abstractmethod
    def record_process(self, record: ProcessRecord) -> None:
        """Write ``record`` as the heartbeat of its process (one per id: the last
        write wins). Not durable at once (a lost heartbeat is rewritten seconds later)."""

    @abstractmethod
    def processes(self, namespace: str | None = None) -> list[ProcessRecord]:
        """The heartbeat records of ``namespace``'s processes (all when None), the
        most recently seen first."""

    @abstractmethod
    def forget_processes(self, seen_before: datetime) -> int:
        """Delete the records last seen before ``seen_before``; how many went."""

    # --- paused tasks (broker_jobs.store.controls) ---------------------------------------

    @abstractmethod
    def pause(
        self, namespace: str, task: str, by: str, *, now: datetime | None = None
    ) -> TaskPause:
        """Pause ``task`` of ``namespace`` (durable when it returns); a task paused
        already stays paused since its first pause. The pause in force."""

    @abstractmethod
    def resume(self, namespace: str, task: str) -> bool:
        """Lift the pause of ``task``; whether it was paused."""

    @abstractmethod
    def pauses(self, namespace: str) -> dict[str, TaskPause]:
        """The paused tasks of ``namespace``, by task."""

    @abstractmethod
    def request_stop(
        self, namespace: str, worker_id: str, by: str, *, now: datetime | None = None
    ) -> StopRequest:
        """Ask worker ``worker_id`` to stop gracefully (durable when it returns); a
        second request keeps the first. The request in force."""

    @abstractmethod
    def stop_requests(self, namespace: str) -> dict[str, StopRequest]:
        """The stop requests of ``namespace``'s workers, by worker id."""

    @abstractmethod
    def clear_stop(self, worker_id: str) -> bool:
        """Delete the stop request of ``worker_id`` (it stopped); whether there was one."""

    # --- queue depths over time (broker_jobs.store.depths) ----------------------------

    @abstractmethod
    def record_depths(
        self, namespace: str, depths: Mapping[str, int], *, now: datetime | None = None
    ) -> None:
        """A sample of ``depths`` (jobs ready in each task's queue) at ``now``: its
        minute's row takes it, its hour's row keeps the larger; rows older than
        :data:`~broker_jobs.store.depths.KEEP` are deleted. Not durable at once (a
        sample lost to a power cut is a gap in a chart)."""

    @abstractmethod
    def depth_history(
        self, namespace: str, *, step: timedelta, since: datetime
    ) -> dict[str, DepthSeries]:
        """By task (in order), the samples of ``step`` (a minute or an hour) of
        ``namespace`` whose step starts at or after ``since``, oldest first."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; idempotent. The store cannot be used afterwards."""


def _state(record: JobRecord | None) -> str:
    """What :meth:`Store.wait`'s timeout says of the job it waited for."""
    if record is not None:
        return f"status {record.status.value}"
    return (
        "no record: not taken by a worker yet, or a second publish of a key that another"
        " job holds, which the worker skips as a duplicate without recording its id: wait"
        " by the idempotency key"
    )
