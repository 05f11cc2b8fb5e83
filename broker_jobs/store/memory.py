"""An in-process store: nothing survives the process, and other processes cannot see
it. For tests, and for jobs that need no durability: a job whose worker restarts, or
that finished longer ago than the last :data:`DEFAULT_MAX_FINISHED` jobs, runs again
if it is delivered again."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from broker_jobs.dead_letter import DeadLetter, DeadLetterFilter
from broker_jobs.envelope import Job
from broker_jobs.store.controls import StopRequest, TaskPause
from broker_jobs.store.dead_letter_index import IndexedDeadLetter, IndexRow, read_entry
from broker_jobs.store.depths import DepthSeries, cutoffs, depth_rows, step_seconds
from broker_jobs.store.errors import StoreError
from broker_jobs.store.exclusive import ExclusiveStore, Records
from broker_jobs.store.ledger import (
    Buckets,
    Filters,
    Tally,
    newest_first,
    summaries,
    waiting_since,
)
from broker_jobs.store.processes import ProcessRecord
from broker_jobs.store.records import (
    TERMINAL,
    Claim,
    Execution,
    JobRecord,
    KeptOutput,
    KeptPayload,
    LeaderRecord,
    Output,
    PayloadText,
    Status,
    TaskSummary,
)
from broker_jobs.store.rules import track_execution
from broker_jobs.store.values import follow_ups_text, read_output, read_payload, utc

T = TypeVar("T")

#: Finished jobs a memory store keeps (their records, executions and payloads):
#: beyond them the oldest finished go first. Each takes ~0.8 KB (measured: 100,000
#: succeeded jobs, 78 MB), so the default bounds the store near 40 MB. Records of
#: jobs not finished are never dropped.
DEFAULT_MAX_FINISHED = 50_000


class _DictRecords:
    #: A dict has no transactions: effects run, then the record changes.
    connection = None

    def __init__(self, store: MemoryStore) -> None:
        self._records = store._records
        self._executions = store._executions
        self._payloads = store._payloads
        self._outputs = store._outputs
        self._letters = store._letters
        self._finished = store._finished
        self._max_finished = store.max_finished

    def load(self, key: str) -> JobRecord | None:
        return self._records.get(key)

    def save(self, record: JobRecord) -> None:
        key = record.idempotency_key
        executions = list(self._executions.get(key, ()))
        track_execution(executions, record)
        self._records[key] = record
        if executions:
            self._executions[key] = executions
        if record.status in TERMINAL:
            self._finished[key] = None
            self._finished.move_to_end(key)
            while len(self._finished) > self._max_finished:
                self._forget(self._finished.popitem(last=False)[0])
        else:  # replayed, say: unfinished again, never dropped
            self._finished.pop(key, None)

    def _forget(self, key: str) -> None:
        del self._records[key]
        self._executions.pop(key, None)
        self._payloads.pop(key, None)
        self._outputs.pop(key, None)

    def keep_payload(self, key: str, payload: PayloadText, now: datetime) -> None:
        self._payloads.setdefault(key, (payload, now))  # the first one wins

    def keep_output(self, key: str, output: Output, now: datetime) -> None:
        self._outputs[key] = _KeptOutputText.of(output, now)

    def index_letters(self, rows: Sequence[IndexRow], pass_id: str | None, now: datetime) -> None:
        self._letters.index(rows, pass_id, now)


@dataclass(frozen=True)
class _Entry:
    """An entry as the SQL stores read it back, read once when it is indexed (each
    query filters every entry)."""

    task: str
    entry: IndexedDeadLetter
    pass_id: str | None
    dead_at: datetime | None  #: as given (the document keeps milliseconds)

    @classmethod
    def of(cls, seq: int, row: IndexRow, pass_id: str | None, now: datetime) -> _Entry:
        entry = read_entry(row.document, row.body, row.body_size, seq, now)
        return cls(row.task, entry, pass_id, row.dead_at)

    @property
    def seq(self) -> int:
        return self.entry.seq

    def read(self) -> IndexedDeadLetter:
        return self.entry


class _LetterIndex:
    """The index of dead letters in a dict, in the order of first indexing; at most
    ``limit`` entries (the oldest go first, as the memory store's finished jobs do)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._seq = 0

    def index(self, rows: Sequence[IndexRow], pass_id: str | None, now: datetime) -> None:
        for row in rows:
            key = (row.task, row.letter_id)
            found = self._entries.get(key)
            if found is not None and found.dead_at != row.dead_at:
                # The job died again (replayed): a new dead letter, placed last.
                del self._entries[key]
                found = None
            if found is None:
                self._seq += 1
            seq = self._seq if found is None else found.seq
            self._entries[key] = _Entry.of(seq, row, pass_id, now)
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    def matching(self, tasks: Sequence[str], where: DeadLetterFilter | None) -> list[_Entry]:
        where, chosen = where or DeadLetterFilter(), set(tasks)
        return [
            entry
            for (task, _), entry in self._entries.items()
            if task in chosen and where.matches(entry.read().letter)
        ]

    def drop(self, task: str, letters: Sequence[DeadLetter]) -> int:
        dropped = 0
        for letter in letters:
            found = self._entries.get((task, letter.letter_id))
            if found is not None and found.dead_at == letter.dead_at:
                del self._entries[(task, letter.letter_id)]
                dropped += 1
        return dropped

    def mark(self, task: str) -> int:
        return max((e.seq for (t, _), e in self._entries.items() if t == task), default=0)

    def sweep(self, task: str, up_to: int, pass_id: str) -> int:
        doomed = [
            key
            for key, e in self._entries.items()
            if key[0] == task and e.seq <= up_to and e.pass_id != pass_id
        ]
        for key in doomed:
            del self._entries[key]
        return len(doomed)

    def clear(self) -> None:
        self._entries.clear()


@dataclass(frozen=True)
class _KeptOutputText:
    """An output as the SQL stores keep it (JSON text): what a caller does to its
    objects afterwards cannot change it."""

    result: PayloadText | None
    follow_ups: str | None
    kept_at: datetime
    sent_at: datetime | None = None

    @classmethod
    def of(cls, output: Output, now: datetime) -> _KeptOutputText:
        return cls(output.result, follow_ups_text(output.follow_ups), now)

    def read(self) -> KeptOutput:
        text, size = self.result if self.result is not None else (None, None)
        return read_output(text, size, self.follow_ups, self.sent_at, self.kept_at)


class _Held(Generic[T]):
    """The lock of an open :class:`MemoryStore` held for a ``with`` block, which gets
    ``entered``. A class, not a generator's context manager: the worker enters two a
    job, and a generator's cost twice as much (three objects a ``with``)."""

    __slots__ = ("_entered", "_store")

    def __init__(self, store: MemoryStore, entered: T) -> None:
        self._store = store
        self._entered = entered

    def __enter__(self) -> T:
        store = self._store
        store._lock.acquire()
        if store._closed:
            store._lock.release()
            raise StoreError("this MemoryStore is closed; open a new store")
        return self._entered

    def __exit__(self, *exc_info: object) -> None:
        self._store._lock.release()


class MemoryStore(ExclusiveStore):
    """Records in a dict. Thread-safe: every call holds one lock. For tests and jobs
    that need no durability: use :class:`~broker_jobs.store.sqlite.SQLiteStore` for
    anything that must last or be shared between processes. It keeps at most
    ``max_finished`` finished jobs (the oldest finished are dropped first, as prune
    would drop them), so a long-running worker's memory stays bounded.

    Records are immutable, so a change that fails half-way cannot leave a partial record:
    the dict is only written with a complete new record.
    """

    #: A dict has no transactions: a worker refuses transactional tasks on it.
    has_transactions = False

    def __init__(self, max_finished: int = DEFAULT_MAX_FINISHED) -> None:
        if isinstance(max_finished, bool) or not isinstance(max_finished, int) or max_finished < 1:
            raise StoreError(f"max_finished must be a whole number >= 1, got {max_finished!r}")
        self.max_finished = max_finished
        #: Keys of finished records, oldest finished first: which to drop first.
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._records: dict[str, JobRecord] = {}
        self._executions: dict[str, list[Execution]] = {}  # by key, oldest first
        #: As text, like the SQL stores: a caller's later change of its dict (or of
        #: the one it was given back) cannot change what is kept.
        self._payloads: dict[str, tuple[PayloadText, datetime]] = {}
        self._outputs: dict[str, _KeptOutputText] = {}
        self._letters = _LetterIndex(max_finished)
        self._fires: dict[str, datetime] = {}
        self._leaders: dict[str, LeaderRecord] = {}
        self._processes: dict[str, ProcessRecord] = {}
        self._pauses: dict[tuple[str, str], TaskPause] = {}
        self._stops: dict[str, StopRequest] = {}
        #: (namespace, task, step seconds, step start) -> jobs ready (store.depths).
        self._depths: dict[tuple[str, str, int, datetime], int] = {}
        self._closed = False
        #: The sections, made once: a worker enters two a job (claim, success).
        self._held_open: _Held[None] = _Held(self, None)
        self._held_records: _Held[Records] = _Held(self, _DictRecords(self))

    def __repr__(self) -> str:
        return f"MemoryStore(max_finished={self.max_finished})"

    def _open(self) -> _Held[None]:
        """Hold the lock of an open store."""
        return self._held_open

    def _exclusive(self, action: str = "change a record") -> _Held[Records]:
        return self._held_records

    def _snapshot(self) -> list[JobRecord]:
        with self._exclusive():
            return list(self._records.values())

    def try_claim_many(self, claims: Sequence[tuple[Job, str]], lease: float) -> list[Claim] | None:
        # A dict under a lock held only for dict operations: never a wait worth a hop.
        return self.claim_many(claims, lease)

    def try_succeed_many(self, finished: Sequence[tuple[str, str]]) -> list[str] | None:
        return self.succeed_many(finished)

    def get(self, key: str) -> JobRecord | None:
        with self._exclusive() as records:
            return records.load(key)

    def kept_payload(self, key: str) -> KeptPayload | None:
        with self._open():
            found = self._payloads.get(key)
        if found is None:
            return None
        (text, size), kept_at = found
        return read_payload(text, size, kept_at)

    def output(self, key: str) -> KeptOutput | None:
        with self._open():
            found = self._outputs.get(key)
        return None if found is None else found.read()

    def mark_follow_ups_sent(self, key: str, *, now: datetime | None = None) -> None:
        moment = utc(now)
        with self._open():
            found = self._outputs.get(key)
            if found is not None:
                self._outputs[key] = replace(found, sent_at=moment)

    def get_by_job_id(self, job_id: str) -> list[JobRecord]:
        return newest_first(r for r in self._snapshot() if r.job_id == job_id)

    def _find(self, filters: Filters, limit: int) -> list[JobRecord]:
        return filters.in_order(filter(filters.match, self._snapshot()))[:limit]

    def _count(self, filters: Filters) -> int:
        return sum(1 for record in self._snapshot() if filters.match(record))

    def counts(self) -> dict[Status, int]:
        counts = dict.fromkeys(Status, 0)
        for record in self._snapshot():
            counts[record.status] += 1
        return counts

    def executions(self, key: str) -> list[Execution]:
        with self._open():
            return list(self._executions.get(key, ()))

    def task_summaries(self, *, now: datetime | None = None) -> dict[str, TaskSummary]:
        moment = utc(now)
        with self._open():
            records = list(self._records.values())
            executions = [e for runs in self._executions.values() for e in runs]
        tallies: dict[str, Tally] = {}
        tasks: dict[str, str] = {}  # the task of each key: executions have none
        for record in records:
            tally = tallies.setdefault(record.task, Tally())
            tally.counts[record.waiting_status] += 1
            tally.wait(waiting_since(record, moment))
            tasks[record.idempotency_key] = record.task
        for execution in executions:
            finished, outcome = execution.finished_at, execution.outcome
            if finished is not None and outcome is not None:  # not still running
                tally = tallies[tasks[execution.idempotency_key]]
                tally.finished(outcome, finished, finished - execution.started_at, moment)
        return summaries(tallies)

    def outcome_buckets(
        self, *, since: datetime, bucket: timedelta, now: datetime | None = None
    ) -> dict[str, list[tuple[int, int]]]:
        buckets = Buckets.of(since, bucket, utc(now))
        with self._open():
            tasks = {key: record.task for key, record in self._records.items()}
            finished = [
                (tasks[e.idempotency_key], e.outcome, e.finished_at)
                for runs in self._executions.values()
                for e in runs
                if e.outcome is not None and e.finished_at is not None
            ]
        return buckets.tally(finished)

    def prune(self, older_than: datetime) -> int:
        cutoff = utc(older_than)
        with self._exclusive():
            doomed = [
                key
                for key, r in self._records.items()
                if r.status in TERMINAL and r.updated_at < cutoff
            ]
            for key in doomed:
                del self._records[key]
                self._executions.pop(key, None)
                self._payloads.pop(key, None)
                self._outputs.pop(key, None)
                self._finished.pop(key, None)
            return len(doomed)

    # --- the index of dead letters ---------------------------------------------------

    def dead_letters(
        self,
        tasks: Sequence[str],
        where: DeadLetterFilter | None = None,
        *,
        limit: int = 100,
        offset: int = 0,
    ) -> list[IndexedDeadLetter]:
        with self._open():
            found = self._letters.matching(tasks, where)
        return [entry.read() for entry in found[offset : offset + limit]]

    def dead_letter_counts(
        self, tasks: Sequence[str], where: DeadLetterFilter | None = None
    ) -> dict[str, int]:
        counts = dict.fromkeys(tasks, 0)
        with self._open():
            for entry in self._letters.matching(tasks, where):
                counts[entry.task] += 1
        return counts

    def unindex_dead_letters(self, task: str, letters: Sequence[DeadLetter]) -> int:
        with self._open():
            return self._letters.drop(task, letters)

    def dead_letter_mark(self, task: str) -> int:
        with self._open():
            return self._letters.mark(task)

    def sweep_dead_letters(self, task: str, *, up_to: int, pass_id: str) -> int:
        with self._open():
            return self._letters.sweep(task, up_to, pass_id)

    # --- beat records -------------------------------------------------------------

    def record_fire(self, schedule: str, fire_at: datetime) -> None:
        moment = utc(fire_at)
        with self._open():
            last = self._fires.get(schedule)
            if last is None or moment > last:
                self._fires[schedule] = moment

    def last_fire(self, schedule: str) -> datetime | None:
        with self._open():
            return self._fires.get(schedule)

    def last_fires(self, prefix: str = "") -> dict[str, datetime]:
        with self._open():
            return {k: v for k, v in sorted(self._fires.items()) if k.startswith(prefix)}

    def record_leader(
        self,
        group: str,
        identity: str,
        since: datetime,
        *,
        now: datetime | None = None,
        schedules: Mapping[str, str] | None = None,
    ) -> None:
        kept = None if schedules is None else dict(schedules)
        record = LeaderRecord(group, identity, utc(since), utc(now), kept)
        with self._open():
            self._leaders[group] = record

    def leader(self, group: str) -> LeaderRecord | None:
        with self._open():
            return self._leaders.get(group)

    def record_process(self, record: ProcessRecord) -> None:
        with self._open():
            self._processes[record.id] = record

    def processes(self, namespace: str | None = None) -> list[ProcessRecord]:
        with self._open():
            kept = [p for p in self._processes.values() if namespace in (None, p.namespace)]
        return sorted(kept, key=lambda p: p.seen_at, reverse=True)

    def forget_processes(self, seen_before: datetime) -> int:
        with self._open():
            gone = [id for id, p in self._processes.items() if p.seen_at < seen_before]
            for id in gone:
                del self._processes[id]
        return len(gone)

    def pause(
        self, namespace: str, task: str, by: str, *, now: datetime | None = None
    ) -> TaskPause:
        with self._open():
            return self._pauses.setdefault(
                (namespace, task), TaskPause(namespace, task, utc(now), by)
            )

    def resume(self, namespace: str, task: str) -> bool:
        with self._open():
            return self._pauses.pop((namespace, task), None) is not None

    def pauses(self, namespace: str) -> dict[str, TaskPause]:
        with self._open():
            return {t: p for (ns, t), p in sorted(self._pauses.items()) if ns == namespace}

    def request_stop(
        self, namespace: str, worker_id: str, by: str, *, now: datetime | None = None
    ) -> StopRequest:
        with self._open():
            asked = StopRequest(namespace, worker_id, utc(now), by)
            return self._stops.setdefault(worker_id, asked)

    def stop_requests(self, namespace: str) -> dict[str, StopRequest]:
        with self._open():
            return {w: r for w, r in sorted(self._stops.items()) if r.namespace == namespace}

    def clear_stop(self, worker_id: str) -> bool:
        with self._open():
            return self._stops.pop(worker_id, None) is not None

    def record_depths(
        self, namespace: str, depths: Mapping[str, int], *, now: datetime | None = None
    ) -> None:
        moment = utc(now)
        with self._open():
            for row in depth_rows(depths, moment):
                slot = (namespace, row.task, row.step, row.at)
                kept = self._depths.get(slot, row.ready) if row.peak else row.ready
                self._depths[slot] = max(kept, row.ready)
            oldest = cutoffs(moment)
            for slot in [s for s in self._depths if s[0] == namespace and s[3] < oldest[s[2]]]:
                del self._depths[slot]

    def depth_history(
        self, namespace: str, *, step: timedelta, since: datetime
    ) -> dict[str, DepthSeries]:
        seconds, start = step_seconds(step), utc(since)
        found: dict[str, DepthSeries] = {}
        with self._open():
            for (ns, task, each, at), ready in sorted(self._depths.items()):
                if ns == namespace and each == seconds and at >= start:
                    found.setdefault(task, []).append((at, ready))
        return found

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._records.clear()
            self._executions.clear()
            self._payloads.clear()
            self._outputs.clear()
            self._letters.clear()
            self._finished.clear()
            self._fires.clear()
            self._leaders.clear()
            self._processes.clear()
            self._pauses.clear()
            self._stops.clear()
            self._depths.clear()
