"""What the pages show, read through the library's Python API only. Every function
here blocks (the store, pika): the routes call them in a worker thread."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from broker_jobs.dashboard import chart
from broker_jobs.dashboard.filters import JobFilter, LetterFilter
from broker_jobs.dashboard.settings import DashboardSettings
from broker_jobs.errors import BrokerConnectionError, BrokerJobsError
from broker_jobs.ops.dead_letter_ledger import IndexedDeadLetters
from broker_jobs.ops.dead_letters import DeadLetter, DeadLetterQueues
from broker_jobs.ops.documents import iso, record_document, size_too_large_text, too_large_text
from broker_jobs.ops.processes import ProcessView, liveness_counts, process_views
from broker_jobs.ops.status import StatusReport, TaskStatus, collect, ledger_only
from broker_jobs.store.base import (
    Execution,
    JobRecord,
    KeptOutput,
    KeptPayload,
    LeaderRecord,
    Page,
    Status,
    utc,
)
from broker_jobs.store.depths import step_start
from broker_jobs.store.processes import RunningJob
from broker_jobs.urls import mask_text
from scheduler.status import status_document

CONNECTION_NAME = "broker-jobs dashboard"
#: How many dead letters the dead-letter view shows (read from the ledger's index).
LETTERS_SHOWN = 200
#: Upcoming fires shown per schedule.
NEXT_FIRES = 3
#: Recent jobs on a task's page.
RECENT_JOBS = 20


def dead_letter_queues(settings: DashboardSettings, tasks: tuple[str, ...]) -> DeadLetterQueues:
    """The queues, for the actions (replay, purge): they keep the index in step."""
    return DeadLetterQueues(
        settings.urls,
        settings.names,
        list(tasks),
        connection_name=CONNECTION_NAME,
        ledger=settings.store,
    )


@dataclass(frozen=True)
class Overview:
    report: StatusReport
    leader: LeaderRecord | None
    #: When the ledger's figures were taken (a large ledger's are kept a few seconds).
    ledger_taken_at: datetime
    #: Per task, the last hour's executions before ``ledger_taken_at`` in
    #: :data:`chart.BUCKETS` buckets of :data:`chart.BUCKET`: (succeeded, failed) each.
    buckets: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def buckets_of(self, task: str) -> list[tuple[int, int]]:
        """A task's buckets; all (0, 0) when nothing of it finished in the hour."""
        return self.buckets.get(task, [(0, 0)] * chart.BUCKETS)

    def sparkline(self, task: str) -> chart.Sparkline:
        """A task's chart, scaled to the page's largest bucket so the tasks compare."""
        summary = next(t.ledger for t in self.report.tasks if t.task == task)
        scale = max((ok + bad for t in self.buckets.values() for ok, bad in t), default=0)
        return chart.sparkline(
            self.buckets_of(task), summary.succeeded_last_hour, summary.failed_last_hour, scale
        )

    @property
    def ledger_behind(self) -> bool:
        """The ledger's figures are a second or more older than the broker's."""
        return (self.report.taken_at - self.ledger_taken_at).total_seconds() >= 1

    def document(self) -> dict[str, Any]:
        document = self.report.document()
        document["ledger_taken_at"] = iso(self.ledger_taken_at)
        for task in document["tasks"]:
            task["ledger"]["last_hour_buckets"] = [list(b) for b in self.buckets_of(task["task"])]
            task["ledger"]["last_hour_bucket_seconds"] = int(chart.BUCKET.total_seconds())
        leader = self.leader
        document["beat_leader"] = (
            None
            if leader is None
            else {
                "identity": leader.identity,
                "since": iso(leader.since),
                "seen_at": iso(leader.seen_at),
            }
        )
        return document


def overview(settings: DashboardSettings, tasks: tuple[str, ...] | None = None) -> Overview:
    summaries, ledger_taken_at = settings.summaries.get()
    chosen = list(tasks or settings.tasks)
    try:
        report = collect(
            settings.urls,
            settings.names,
            chosen,
            settings.store,
            connection_name=CONNECTION_NAME,
            summaries=summaries,
            lanes=settings.lanes,
        )
    except BrokerConnectionError as error:  # the ledger's figures still answer
        why = settings.broker.down = mask_text(str(error))
        report = ledger_only(settings.names, chosen, settings.store, why, summaries=summaries)
    else:
        settings.broker.down = None
        settings.publishing.refresh_if_stale()  # never waited for: the next pages show it
        report = dataclasses.replace(report, publishing=settings.publishing.last)
    leader = settings.store.leader(settings.names.namespace)
    return Overview(report, leader, ledger_taken_at, last_hour_buckets(settings, ledger_taken_at))


def last_hour_buckets(
    settings: DashboardSettings, now: datetime
) -> dict[str, list[tuple[int, int]]]:
    """The sparklines' buckets up to ``now``, the time of the summaries, so they add
    up to the totals shown beside them. Read afresh by every request, unlike the
    summaries: a range of the executions' finished_at index, quick on any ledger."""
    since = now - chart.BUCKET * chart.BUCKETS
    return settings.store.outcome_buckets(since=since, bucket=chart.BUCKET, now=now)


@dataclass(frozen=True)
class TaskView:
    status: TaskStatus
    taken_at: datetime
    recent: list[JobRecord]
    schedules: list[dict[str, Any]]
    #: Why the broker's figures are unknown; None: they were read.
    broker_down: str | None = None

    def document(self) -> dict[str, Any]:
        return {
            **self.status.document(self.taken_at),
            "recent_jobs": [record_document(record) for record in self.recent],
            "schedules": self.schedules,
            "broker_unreachable": self.broker_down,
        }


def task_view(settings: DashboardSettings, task: str) -> TaskView:
    report = overview(settings, (task,)).report
    recent = settings.store.page(task=task, limit=RECENT_JOBS).records
    mine = [entry for entry in schedules(settings)["schedules"] if entry["task"] == task]
    return TaskView(report.tasks[0], report.taken_at, recent, mine, report.broker_down)


@dataclass(frozen=True)
class JobList:
    """A page of the jobs list, and how many jobs its filters take in all."""

    page: Page
    matching: int


def jobs(settings: DashboardSettings, chosen: JobFilter) -> JobList:
    """A page of the jobs the filters take, in their order, and how many they take
    (``Store.count``: exact; up to ~200 ms at 1,000,000 records, docs/dashboard.md)."""
    page = settings.store.page(**chosen.page_arguments())  # type: ignore[arg-type]
    matching = settings.store.count(**chosen.count_arguments())  # type: ignore[arg-type]
    return JobList(page, matching)


@dataclass(frozen=True)
class Event:
    """One line of a job's timeline."""

    at: datetime
    what: str
    detail: str = ""


@dataclass(frozen=True)
class JobView:
    record: JobRecord
    executions: list[Execution]
    dead_letter: DeadLetter | None
    dead_letter_problem: str | None  # why the dead letter could not be read
    timeline: list[Event] = field(default_factory=list)
    #: The payload the ledger keeps (published with the ledger, or after a failure);
    #: the page shows the dead letter's first, when there is one.
    kept_payload: KeptPayload | None = None
    #: The handler's result and follow-ups, kept with the success (None: none).
    output: KeptOutput | None = None

    @property
    def too_large_note(self) -> str | None:
        """Why the ledger's payload is not shown, when it was too large to keep."""
        kept = self.kept_payload
        return too_large_text(kept) if kept is not None and kept.too_large else None

    @property
    def result_too_large_note(self) -> str | None:
        """Why the handler's result is not shown, when it was too large to keep."""
        output = self.output
        if output is None or not output.result_too_large or output.result_size is None:
            return None
        return size_too_large_text(output.result_size)


def job_view(settings: DashboardSettings, ref: str) -> JobView | None:
    """The job of a key or job id, with its executions, the payload the ledger keeps
    and, for a dead job, its dead letter (which holds the payload as it died)."""
    record = settings.store.lookup(ref)
    if record is None:
        return None
    executions = settings.store.executions(record.idempotency_key)
    # One lookup by key, always: the API's document has it even beside a dead letter.
    kept = settings.store.kept_payload(record.idempotency_key)
    output = settings.store.output_of(record)
    letter, problem = None, None
    if record.status is Status.DEAD:
        try:
            found = IndexedDeadLetters(settings.store, (record.task,)).find(record.idempotency_key)
            letter = found[0].letter if found else None
        except BrokerJobsError as error:
            problem = mask_text(str(error))
    events = timeline(record, executions, letter)
    return JobView(record, executions, letter, problem, events, kept, output)


def timeline(
    record: JobRecord, executions: list[Execution], letter: DeadLetter | None
) -> list[Event]:
    events = [Event(record.created_at, "created", "the job made (published)")]
    for run in executions:
        events.append(Event(run.started_at, f"attempt {run.attempt} started", run.worker))
        if run.finished_at is not None:
            outcome = run.outcome.value if run.outcome else "finished"
            events.append(
                Event(run.finished_at, f"attempt {run.attempt} {outcome}", run.error or "")
            )
    if letter is not None and letter.dead_at is not None:
        events.append(Event(letter.dead_at, "dead-lettered", letter.reason or ""))
    if record.due_at is not None:
        events.append(Event(record.due_at, "due", record.status.value))
    last = events[-1].at if events else None
    if last is None or record.updated_at > last:
        events.append(Event(record.updated_at, record.status.value, record.worker or ""))
    return sorted(events, key=lambda event: event.at)


@dataclass(frozen=True)
class LetterGroup:
    task: str
    reason: str
    letters: list[DeadLetter]


@dataclass(frozen=True)
class LettersView:
    depths: dict[str, int]
    groups: list[LetterGroup]
    shown: int
    limit: int
    matching: int  #: how many the filters take (``limit`` of them a page)
    page: int = 1  #: this page's number, from 1

    @property
    def pages(self) -> int:
        """How many pages the matching dead letters fill (1 when there are none)."""
        return max(1, -(-self.matching // self.limit))

    @property
    def first(self) -> int:
        """The number of this page's first dead letter (from 1)."""
        return (self.page - 1) * self.limit + 1

    def document(self) -> dict[str, Any]:
        return {
            "depths": self.depths,
            "limit": self.limit,
            "matching": self.matching,
            "page": self.page,
            "pages": self.pages,
            "groups": [
                {
                    "task": group.task,
                    "reason": group.reason,
                    "count": len(group.letters),
                    "dead_letters": [letter.to_json() for letter in group.letters],
                }
                for group in self.groups
            ],
        }


def letters_view(settings: DashboardSettings, chosen: LetterFilter, page: int = 1) -> LettersView:
    """Page ``page`` (from 1) of the matching dead letters, :data:`LETTERS_SHOWN` each."""
    tasks = chosen.tasks(settings.tasks)
    index, where = IndexedDeadLetters(settings.store, tasks), chosen.dead_letter_filter()
    depths = index.counts()
    matching = sum(depths.values()) if where.is_empty else sum(index.counts(where).values())
    letters = index.letters(where, limit=LETTERS_SHOWN, offset=(page - 1) * LETTERS_SHOWN)
    grouped: dict[tuple[str, str], list[DeadLetter]] = defaultdict(list)
    for letter in letters:
        grouped[letter.task, letter.reason or "unknown"].append(letter)
    groups = [LetterGroup(task, reason, found) for (task, reason), found in sorted(grouped.items())]
    return LettersView(depths, groups, len(letters), LETTERS_SHOWN, matching, page)


@dataclass(frozen=True)
class HistoryView:
    """The history page: per task and all together, the chosen range's executions in
    buckets (succeeded, failed), from the ledger's executions."""

    chosen: chart.HistoryRange
    since: datetime
    until: datetime
    buckets: dict[str, list[tuple[int, int]]]
    #: Per task, the jobs ready in its queue in each bucket (None: not sampled), from
    #: the exporter's samples (broker_jobs.ops.depth_sampling).
    depths: dict[str, list[int | None]]

    @property
    def sampled(self) -> bool:
        """Whether any queue depth was sampled in the range."""
        return any(v is not None for values in self.depths.values() for v in values)

    def depth_charts(self) -> dict[str, chart.DepthChart]:
        return {
            task: chart.depth_chart(values, self.chosen) for task, values in self.depths.items()
        }

    @property
    def overall(self) -> list[tuple[int, int]]:
        """Every task's buckets added up."""
        zero = [(0, 0)] * self.chosen.buckets
        return [
            (sum(ok for ok, _ in column), sum(bad for _, bad in column))
            for column in zip(zero, *self.buckets.values(), strict=True)
        ]

    def charts(self) -> list[tuple[str, chart.BarChart]]:
        """("all tasks", its chart), then each task's."""
        found = [("all tasks", chart.history_chart(self.overall, self.chosen))]
        found += [(t, chart.history_chart(b, self.chosen)) for t, b in self.buckets.items()]
        return found

    def document(self) -> dict[str, Any]:
        return {
            "range": self.chosen.name,
            "bucket_seconds": int(self.chosen.bucket.total_seconds()),
            "since": iso(self.since),
            "until": iso(self.until),
            "overall": [list(b) for b in self.overall],
            "tasks": {task: [list(b) for b in found] for task, found in self.buckets.items()},
            "depths": self.depths,
        }


def history(settings: DashboardSettings, chosen: chart.HistoryRange) -> HistoryView:
    """The executions of the dashboard's tasks over ``chosen``, in whole minutes or
    hours up to the current one (``Store.outcome_buckets``, the closed buckets kept:
    :mod:`broker_jobs.dashboard.history_buckets`)."""
    until = utc(None)
    since, found = settings.history.read(chosen, until)
    empty = [(0, 0)] * chosen.buckets
    buckets = {task: found.get(task, empty) for task in settings.tasks}
    return HistoryView(chosen, since, until, buckets, _depths(settings, chosen, since))


def _depths(
    settings: DashboardSettings, chosen: chart.HistoryRange, since: datetime
) -> dict[str, list[int | None]]:
    """Each task's sampled depths in ``chosen``'s buckets from ``since``: a sample
    lands in the bucket its minute or hour starts in (the step before ``since``, in
    the first)."""
    step = chosen.bucket
    series = settings.store.depth_history(
        settings.names.namespace, step=step, since=step_start(since, step)
    )
    depths: dict[str, list[int | None]] = {}
    for task in settings.tasks:
        values: list[int | None] = [None] * chosen.buckets
        for at, ready in series.get(task, []):
            index = min(max((at - since) // step, 0), chosen.buckets - 1)
            values[index] = max(values[index] or 0, ready)
        depths[task] = values
    return depths


@dataclass(frozen=True)
class WorkersView:
    """The workers page: every process of the namespace with a heartbeat."""

    processes: list[ProcessView]
    taken_at: datetime

    @property
    def counts(self) -> list[tuple[tuple[str, str], int]]:
        return sorted(liveness_counts(self.processes).items())

    @property
    def running(self) -> list[tuple[str, RunningJob]]:
        """The jobs the live workers run, by worker id, the longest-running first."""
        found = [
            (view.record.id, job)
            for view in self.processes
            if view.present
            for job in view.record.running
        ]
        return sorted(found, key=lambda pair: pair[1].started_at)

    def document(self) -> dict[str, Any]:
        return {
            "taken_at": iso(self.taken_at),
            "counts": [
                {"kind": kind, "state": state, "count": count}
                for (kind, state), count in self.counts
            ],
            "processes": [view.document() for view in self.processes],
        }


def workers(settings: DashboardSettings) -> WorkersView:
    """The namespace's workers, beats and exporters from their heartbeats."""
    now = utc(None)
    found = process_views(settings.store, settings.names.namespace, now=now)
    return WorkersView(found, now)


def schedules(settings: DashboardSettings) -> dict[str, Any]:
    """``beat status --json``'s document, with the next few fires of each schedule."""
    if settings.app is None:
        return {
            "namespace": settings.names.namespace,
            "leader": None,
            "mismatch": None,
            "schedules": [],
        }
    now = utc(None)
    document = status_document(settings.app, settings.schedules, settings.store, now)
    entries: list[dict[str, Any]] = document["schedules"]  # type: ignore[assignment]
    for entry, schedule in zip(entries, settings.schedules, strict=True):
        upcoming: list[str | None] = []
        moment: datetime | None = now
        while moment is not None and len(upcoming) < NEXT_FIRES:
            moment = schedule.timing.next_fire(moment)
            if moment is not None:
                upcoming.append(iso(moment))
        entry["next_fires"] = upcoming
    return document
