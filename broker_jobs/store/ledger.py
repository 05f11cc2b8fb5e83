"""What the stores share to answer the ledger's queries: the filters of
:meth:`~broker_jobs.store.base.Store.find` (as Python and as SQL), the figures of
:meth:`~broker_jobs.store.base.Store.task_summaries` and the buckets of
:meth:`~broker_jobs.store.base.Store.outcome_buckets`. Each store gathers the figures
its own way (a dict walk, SQL aggregates) into a :class:`Tally` per task, which
builds the summary: every store reports the same numbers for the same ledger."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, Unpack

from broker_jobs.store.records import ExecutionOutcome, JobRecord, Status, TaskSummary
from broker_jobs.store.values import utc

#: The windows of the execution counts.
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
#: Outcomes counted as failed (a handler raised: retried later, or not).
FAILED_OUTCOMES = frozenset(
    {ExecutionOutcome.RETRYING, ExecutionOutcome.FAILED, ExecutionOutcome.DEAD}
)
#: Outcomes of executions that ran a handler to its end. The counts and durations are
#: of these only: a release ends an execution whose handler never started, and a lost
#: lease's "duration" is the lease, not the work.
COUNTED_OUTCOMES = FAILED_OUTCOMES | {ExecutionOutcome.SUCCEEDED}


# --- find ---------------------------------------------------------------------------------


class Filtering(TypedDict, total=False):
    """The filters :meth:`~broker_jobs.store.base.Store.find` and ``page`` take, each
    optional (None: not filtered by it)."""

    status: Status | None
    task: str | None
    since: datetime | None  # updated at or after
    until: datetime | None  # updated before
    key: str | None  # keys starting with it
    after: tuple[datetime, str] | None  # after this (updated_at, key) of a listing
    oldest_first: bool | None  # the listing's order: oldest updated first (else newest)


#: A record's status as figures and filters count it (``JobRecord.waiting_status``):
#: a released record (RUNNING, no holder) is QUEUED.
WAITING_STATUS_SQL = "CASE WHEN status = 'running' AND worker IS NULL THEN 'queued' ELSE status END"
#: The conditions of a status filter where a released record moves it.
STATUS_FILTER_SQL = {
    Status.QUEUED: "(status = {status} OR (status = 'running' AND worker IS NULL))",
    Status.RUNNING: "(status = {status} AND worker IS NOT NULL)",
}


@dataclass(frozen=True)
class Filters:
    """The filters of one ``find`` call, times in UTC, and its order (``after`` is a
    place in that order)."""

    status: Status | None = None
    task: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    key: str | None = None
    after: tuple[datetime, str] | None = None
    #: Oldest updated first, ties by key ascending; else newest first, ties descending.
    oldest_first: bool = False

    @classmethod
    def of(cls, **given: Unpack[Filtering]) -> Filters:
        """The filters of a call's arguments: a status by its value, times in UTC
        (a naive one is refused); TypeError for a name that is no filter."""
        unknown = sorted(given.keys() - Filtering.__optional_keys__)
        if unknown:
            raise TypeError(f"find() got an unexpected keyword argument {unknown[0]!r}")
        status, since, until = given.get("status"), given.get("since"), given.get("until")
        after = given.get("after")
        return cls(
            status=Status(status) if status is not None else None,
            task=given.get("task"),
            since=utc(since) if since is not None else None,
            until=utc(until) if until is not None else None,
            key=given.get("key"),
            after=(utc(after[0]), after[1]) if after is not None else None,
            oldest_first=bool(given.get("oldest_first")),
        )

    def match(self, record: JobRecord) -> bool:
        return (
            (self.status is None or record.waiting_status is self.status)
            and (self.task is None or record.task == self.task)
            and (self.since is None or record.updated_at >= self.since)
            and (self.until is None or record.updated_at < self.until)
            and (self.key is None or record.idempotency_key.startswith(self.key))
            and (self.after is None or self._comes_after(record, self.after))
        )

    def _comes_after(self, record: JobRecord, after: tuple[datetime, str]) -> bool:
        place = (record.updated_at, record.idempotency_key)
        return place > after if self.oldest_first else place < after

    def in_order(self, records: Iterable[JobRecord]) -> list[JobRecord]:
        """``records`` in this listing's order (:meth:`order_sql` in Python)."""
        return sorted(
            records, key=lambda r: (r.updated_at, r.idempotency_key), reverse=not self.oldest_first
        )

    def sql(self, dialect: Dialect, *, key_range: bool = False) -> tuple[str, dict[str, Any]]:
        """``WHERE ...`` (empty without filters) and its named parameters. With
        ``key_range``, a key prefix is also written as a range of the key (where keys
        compare by code point: SQLite), which lets the primary key find its matches."""
        conditions: list[str] = []
        params: dict[str, Any] = {}

        def add(template: str, **values: Any) -> None:
            marks = {name: dialect.mark(name) for name in values}
            conditions.append(template.format(key=dialect.key, **marks))
            params.update(values)

        if self.status is not None:
            add(STATUS_FILTER_SQL.get(self.status, "status = {status}"), status=self.status.value)
        if self.task is not None:
            add("task = {task}", task=self.task)
        if self.since is not None:
            add("updated_at >= {since}", since=dialect.time(self.since))
        if self.until is not None:
            add("updated_at < {until}", until=dialect.time(self.until))
        if self.key is not None:
            add(dialect.starts_with, prefix=self.key)
            low, high = prefix_range(self.key)
            if key_range:
                add("{key} >= {key_from}", key_from=low)
            if key_range and high is not None:
                add("{key} < {key_to}", key_to=high)
        if self.after is not None:
            at, last = self.after
            past = ">" if self.oldest_first else "<"  # further along the listing's order
            add(
                f"(updated_at {past} {{at}} OR (updated_at = {{at}} AND {{key}} {past} {{last}}))",
                at=dialect.time(at),
                last=last,
            )
        return (f"WHERE {' AND '.join(conditions)}" if conditions else ""), params

    def order_sql(self, dialect: Dialect) -> str:
        """``ORDER BY ...`` of the listing: by ``updated_at``, ties by key (by code
        point), both descending (newest first) or both ascending (oldest first). Either
        way an index on ``updated_at`` (with the key) is read forwards or backwards."""
        way = "ASC" if self.oldest_first else "DESC"
        return f"ORDER BY updated_at {way}, {dialect.key} {way}"


@dataclass(frozen=True)
class Dialect:
    """How a SQL store writes what :meth:`Filters.sql` needs."""

    mark: Callable[[str], str]  # the placeholder of a named parameter
    key: str  # the key column as compared (by code point)
    starts_with: str  # keys starting with {prefix}, whose % and _ are plain characters
    time: Callable[[datetime], Any]  # a time as a parameter


def prefix_range(prefix: str) -> tuple[str, str | None]:
    """The keys starting with ``prefix`` as a range in code point order: at least
    ``prefix`` and below the second value (None: no upper bound), the first string
    after every one that starts with ``prefix``."""
    kept = prefix
    while kept:
        last = ord(kept[-1]) + 1
        if last == 0xD800:  # surrogates are not characters of a key
            last = 0xE000
        if last <= 0x10FFFF:
            return prefix, kept[:-1] + chr(last)
        kept = kept[:-1]  # U+10FFFF: the bound moves to the character before
    return prefix, None


def newest_first(records: Iterable[JobRecord]) -> list[JobRecord]:
    """``records`` in the order of ``find``: newest updated first, ties by key
    descending (by code point, as the SQL stores compare them)."""
    return Filters().in_order(records)


# --- task summaries -----------------------------------------------------------------------

#: Per task and status: how many records, and since when the oldest of them waits
#: (the rule of :func:`waiting_since`). Marks: {now}; tables: {records}.
COUNTS_SQL = (
    f"SELECT task, {WAITING_STATUS_SQL}, count(*), min(CASE"
    f" WHEN {WAITING_STATUS_SQL} = 'queued' THEN updated_at"
    " WHEN status IN ('scheduled', 'retrying') AND due_at <= {now} THEN due_at END)"
    f" FROM {{records}} GROUP BY task, {WAITING_STATUS_SQL}"
)
_OUTCOMES = ", ".join(f"'{o.value}'" for o in sorted(COUNTED_OUTCOMES))
#: The executions of the last hour that count (:data:`COUNTED_OUTCOMES`), with their
#: task. Marks: {now}, {hour} (an hour before now); tables: {records}, {executions}.
FINISHED_SQL = (
    "FROM {executions} AS e JOIN {records} AS r ON r.idempotency_key = e.idempotency_key"
    f" WHERE e.outcome IN ({_OUTCOMES}) AND e.finished_at > {{hour}}"
    " AND e.finished_at <= {now}"
)
#: Per task: the executions of :data:`FINISHED_SQL` that succeeded and failed in the
#: last minute (mark {minute}) and hour; a store may add columns after them.
FINISHED_COUNTS_SQL = (
    "SELECT r.task,"
    " count(*) FILTER (WHERE e.outcome = 'succeeded' AND e.finished_at > {minute}),"
    " count(*) FILTER (WHERE e.outcome <> 'succeeded' AND e.finished_at > {minute}),"
    " count(*) FILTER (WHERE e.outcome = 'succeeded'),"
    " count(*) FILTER (WHERE e.outcome <> 'succeeded'){more} " + FINISHED_SQL + " GROUP BY r.task"
)


def window_params(now: datetime, time: Callable[[datetime], Any]) -> dict[str, Any]:
    """The {now}, {minute} and {hour} parameters of the summary queries."""
    return {"now": time(now), "minute": time(now - MINUTE), "hour": time(now - HOUR)}


@dataclass
class Tally:
    """A task's figures as a store gathers them."""

    counts: dict[Status, int] = field(default_factory=lambda: dict.fromkeys(Status, 0))
    oldest_waiting: datetime | None = None
    succeeded_last_minute: int = 0
    failed_last_minute: int = 0
    succeeded_last_hour: int = 0
    failed_last_hour: int = 0
    durations: list[timedelta] = field(default_factory=list)
    #: p50 and p99 when the store computed them (else they come from ``durations``).
    percentiles: tuple[timedelta | None, timedelta | None] | None = None

    def wait(self, since: datetime | None) -> None:
        """Count a job waiting to start since ``since`` (None: not waiting)."""
        if since is not None and (self.oldest_waiting is None or since < self.oldest_waiting):
            self.oldest_waiting = since

    def finished(
        self, outcome: ExecutionOutcome, finished_at: datetime, duration: timedelta, now: datetime
    ) -> None:
        """Count an execution that ended with ``outcome`` at ``finished_at``."""
        if outcome not in COUNTED_OUTCOMES or not now - HOUR < finished_at <= now:
            return
        failed = outcome in FAILED_OUTCOMES
        minute = finished_at > now - MINUTE
        self.add_counts(
            int(minute and not failed), int(minute and failed), int(not failed), int(failed)
        )
        self.durations.append(duration)

    def add_counts(self, *counts: int) -> None:
        """Add executions that succeeded and failed in the last minute, and in the last
        hour (the columns of :data:`FINISHED_COUNTS_SQL`)."""
        minute_ok, minute_failed, hour_ok, hour_failed = counts
        self.succeeded_last_minute += minute_ok
        self.failed_last_minute += minute_failed
        self.succeeded_last_hour += hour_ok
        self.failed_last_hour += hour_failed

    def summary(self, task: str) -> TaskSummary:
        if self.percentiles is None:
            durations = sorted(self.durations)
            p50, p99 = percentile(durations, 0.5), percentile(durations, 0.99)
        else:
            p50, p99 = self.percentiles
        return TaskSummary(
            task=task,
            counts=self.counts,
            oldest_waiting=self.oldest_waiting,
            succeeded_last_minute=self.succeeded_last_minute,
            failed_last_minute=self.failed_last_minute,
            succeeded_last_hour=self.succeeded_last_hour,
            failed_last_hour=self.failed_last_hour,
            p50=p50,
            p99=p99,
        )


def waiting_since(record: JobRecord, now: datetime) -> datetime | None:
    """Since when ``record`` waits to start: QUEUED since it became so (published, or
    reset for a replay); SCHEDULED or RETRYING since its due time, once that passed;
    None for the others (:data:`COUNTS_SQL` in Python)."""
    if record.waiting_status is Status.QUEUED:
        return record.updated_at
    due = record.status in (Status.SCHEDULED, Status.RETRYING)
    if due and record.due_at is not None and record.due_at <= now:
        return record.due_at
    return None


def tally_records(
    rows: Iterable[Sequence[Any]], parse: Callable[[Any], datetime | None]
) -> dict[str, Tally]:
    """Tallies from the rows of :data:`COUNTS_SQL`; ``parse``: a time as stored."""
    tallies: dict[str, Tally] = {}
    for task, status, count, oldest in rows:
        tally = tallies.setdefault(task, Tally())
        tally.counts[Status(status)] = int(count)
        tally.wait(parse(oldest))
    return tallies


def percentile(ordered: Sequence[timedelta], fraction: float) -> timedelta | None:
    """The ``fraction`` percentile of ``ordered`` (ascending), interpolated between
    the closest ranks like PostgreSQL's ``percentile_cont``; None when empty."""
    if not ordered:
        return None
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summaries(tallies: dict[str, Tally]) -> dict[str, TaskSummary]:
    """The summaries of ``tallies``, by task name in order."""
    return {task: tallies[task].summary(task) for task in sorted(tallies)}


# --- outcome buckets ----------------------------------------------------------------------

_MICROSECOND = timedelta(microseconds=1)

#: Per task and bucket (a 0-based index, the column ``bucket``): the executions of
#: :data:`FINISHED_SQL` since {since} that succeeded and failed. {finished_us}: the
#: store's expression of ``e.finished_at`` as integer microseconds since the epoch;
#: marks {since_us} and {width_us} are integers too, so the index is exact integer
#: arithmetic (a bucket holds its end: see :meth:`Buckets.index`).
BUCKETS_SQL = (
    "SELECT r.task, ({finished_us} - {since_us} - 1) / {width_us} AS bucket,"
    " count(*) FILTER (WHERE e.outcome = 'succeeded'),"
    " count(*) FILTER (WHERE e.outcome <> 'succeeded') "
    + FINISHED_SQL.replace("{hour}", "{since}")
    + " GROUP BY r.task, bucket"
)


def micros(moment: datetime | timedelta) -> int:
    """``moment`` as integer microseconds (since the epoch for a time)."""
    span = moment - datetime(1970, 1, 1, tzinfo=UTC) if isinstance(moment, datetime) else moment
    return span // _MICROSECOND


@dataclass(frozen=True)
class Buckets:
    """The buckets of one ``outcome_buckets`` call, times in UTC."""

    since: datetime
    width: timedelta
    now: datetime

    @classmethod
    def of(cls, since: datetime, bucket: timedelta, now: datetime) -> Buckets:
        if bucket <= timedelta(0):
            raise ValueError(f"bucket must be a positive duration, got {bucket!r}")
        return cls(utc(since), bucket, utc(now))

    @property
    def count(self) -> int:
        """How many buckets: the last one may end after ``now`` (partial)."""
        return max(-(-(self.now - self.since) // self.width), 0)

    def index(self, finished_at: datetime) -> int | None:
        """The bucket of an execution finished at ``finished_at``; None outside
        (``since``, ``now``]. Bucket i is (since + i*width, since + (i+1)*width]."""
        if not self.since < finished_at <= self.now:
            return None
        return (finished_at - self.since - _MICROSECOND) // self.width

    def params(self, time: Callable[[datetime], Any]) -> dict[str, Any]:
        """The marks of :data:`BUCKETS_SQL`."""
        return {
            "now": time(self.now),
            "since": time(self.since),
            "since_us": micros(self.since),
            "width_us": micros(self.width),
        }

    def gather(self, rows: Iterable[Sequence[Any]]) -> dict[str, list[tuple[int, int]]]:
        """The buckets of each task from rows of (task, index, succeeded, failed), a
        task and index at most once; by task name in order."""
        found: dict[str, list[tuple[int, int]]] = {}
        for task, index, succeeded, failed in rows:
            buckets = found.setdefault(task, [(0, 0)] * self.count)
            buckets[int(index)] = (int(succeeded), int(failed))
        return {task: found[task] for task in sorted(found)}

    def tally(
        self, finished: Iterable[tuple[str, ExecutionOutcome, datetime]]
    ) -> dict[str, list[tuple[int, int]]]:
        """:meth:`gather` from executions as (task, outcome, finished_at): the query of
        :data:`BUCKETS_SQL` in Python."""
        counts: dict[tuple[str, int], list[int]] = {}
        for task, outcome, finished_at in finished:
            index = self.index(finished_at)
            if outcome in COUNTED_OUTCOMES and index is not None:
                pair = counts.setdefault((task, index), [0, 0])
                pair[outcome in FAILED_OUTCOMES] += 1
        return self.gather((task, index, ok, bad) for (task, index), (ok, bad) in counts.items())
