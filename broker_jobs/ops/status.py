"""What each task's jobs are doing now: the broker's queues and the ledger, in one report.

``broker-jobs status`` prints it; a dashboard can call :func:`collect` (or
:func:`gather` on a connection of its own) and show :meth:`StatusReport.document`.

From the broker, over plain AMQP (passive declares: nothing is created, no
permission is needed): each task queue's ready messages and consumers, its
dead-letter queue's depth, the jobs waiting in the namespace's delay ladder (the
sum of its level queues) and in ``<ns>.unroutable``. AMQP cannot tell how many
messages are delivered but not acked (only the management plugin can, and
broker-jobs does not require it), so the jobs running now come from the ledger:
its RUNNING records.

From the ledger (:meth:`Store.task_summaries`): counts by state, executions that
ended in the last minute and hour, the oldest waiting job, p50/p99 durations. The
ledger has no namespace: two namespaces whose tasks share names and a store are
counted together.

A queue that does not exist is reported as missing (see :func:`missing_hint`), not
raised: a status is most wanted when something is wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from broker_jobs.amqp.connecting import connect_first_blocking
from broker_jobs.errors import BrokerConnectionError, BrokerJobsError
from broker_jobs.ops.publishing_check import Publishing, check_publishing
from broker_jobs.store.base import Status, Store, TaskSummary, utc
from broker_jobs.store.controls import TaskPause
from broker_jobs.urls import AnyBrokerURLs, BrokerURLs, mask_text
from topology.delay import DELAY_LEVELS
from topology.lanes import MAX_SHARDS, Lane
from topology.names import Names
from topology.priority import Priority

__all__ = [
    "CONNECT_TIMEOUT",
    "LadderState",
    "QueueState",
    "StatusError",
    "StatusReport",
    "TaskStatus",
    "collect",
    "empty_summary",
    "gather",
    "missing_hint",
]

#: Seconds for the TCP and AMQP handshake of :func:`collect`.
CONNECT_TIMEOUT = 10.0
_NOT_FOUND = 404


class StatusError(BrokerJobsError):
    """The broker refused to show a queue for another reason than its absence."""


@dataclass(frozen=True)
class QueueState:
    """One queue as a passive declare sees it; counts are None when it is missing."""

    name: str
    exists: bool
    messages: int | None  # ready: waiting for a consumer (delivered, unacked ones excluded)
    consumers: int | None

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "exists": self.exists,
            "messages": self.messages,
            "consumers": self.consumers,
        }


@dataclass(frozen=True)
class LadderState:
    """The namespace's delay ladder: jobs waiting in its level queues, in total."""

    messages: int  # summed over the levels that exist
    levels: int  # how many level queues there are meant to be (DELAY_LEVELS)
    missing: tuple[str, ...]  # level queues that do not exist

    def document(self) -> dict[str, Any]:
        return {"messages": self.messages, "levels": self.levels, "missing": list(self.missing)}


@dataclass(frozen=True)
class TaskStatus:
    """One task: its queues on the broker and its jobs in the ledger."""

    task: str
    queue: QueueState
    dead_letters: QueueState
    ledger: TaskSummary
    #: Dead letters in the ledger's index (None: the store keeps none).
    indexed_dead_letters: int | None = None
    #: Its pause, when an operator paused it (``broker-jobs pause``).
    paused: TaskPause | None = None

    @property
    def unindexed_dead_letters(self) -> int:
        """How many more dead letters the queue holds than the index: those being
        dead-lettered right now (indexed just after their confirm), or, when the gap
        stays, those RabbitMQ dead-lettered itself, or an older broker-jobs
        (``broker-jobs dlq reindex``)."""
        if self.indexed_dead_letters is None or not self.dead_letters.messages:
            return 0
        return max(0, self.dead_letters.messages - self.indexed_dead_letters)

    @property
    def running(self) -> int:
        """Jobs a worker holds in the ledger (AMQP cannot count unacked deliveries);
        released ones count as queued."""
        return self.ledger.counts[Status.RUNNING]

    def oldest_waiting_age(self, now: datetime) -> timedelta | None:
        """How long the oldest waiting job has waited at ``now`` (None: none waits)."""
        oldest = self.ledger.oldest_waiting
        return None if oldest is None else max(now - oldest, timedelta(0))

    def document(self, now: datetime) -> dict[str, Any]:
        summary = self.ledger
        age = self.oldest_waiting_age(now)
        return {
            "task": self.task,
            "paused": None
            if self.paused is None
            else {"since": _iso(self.paused.since), "by": self.paused.by},
            "queue": self.queue.document(),
            "dead_letters": {
                **self.dead_letters.document(),
                "indexed": self.indexed_dead_letters,
            },
            "ledger": {
                "counts": {status.value: summary.counts[status] for status in Status},
                "succeeded_last_minute": summary.succeeded_last_minute,
                "failed_last_minute": summary.failed_last_minute,
                "succeeded_last_hour": summary.succeeded_last_hour,
                "failed_last_hour": summary.failed_last_hour,
                "oldest_waiting": _iso(summary.oldest_waiting),
                "oldest_waiting_seconds": _seconds(age),
                "p50_seconds": _seconds(summary.p50),
                "p99_seconds": _seconds(summary.p99),
            },
        }


@dataclass(frozen=True)
class StatusReport:
    """Every task of a namespace, the ladder and the unroutable queue, at ``taken_at``."""

    namespace: str
    node: str  # the broker node asked, password masked ("" when unknown)
    taken_at: datetime
    tasks: tuple[TaskStatus, ...]
    ladder: LadderState
    unroutable: QueueState
    #: Why the broker's figures are unknown (:func:`ledger_only`); None: they are read.
    broker_down: str | None = None
    #: Whether the broker takes publishes now (``collect(..., ask_publishing=True)``);
    #: None: not asked.
    publishing: Publishing | None = None

    @property
    def missing(self) -> tuple[str, ...]:
        """Every queue of the report that does not exist, in the report's order."""
        queues = [queue for task in self.tasks for queue in (task.queue, task.dead_letters)]
        names = [queue.name for queue in queues if not queue.exists]
        names += self.ladder.missing
        if not self.unroutable.exists:
            names.append(self.unroutable.name)
        return tuple(names)

    def document(self) -> dict[str, Any]:
        """The report as JSON-ready data (``broker-jobs status --json``; the shape is
        in docs/operations.md). Times are ISO 8601 UTC, durations seconds."""
        return {
            "namespace": self.namespace,
            "node": self.node,
            "taken_at": _iso(self.taken_at),
            "tasks": [task.document(self.taken_at) for task in self.tasks],
            "ladder": self.ladder.document(),
            "unroutable": self.unroutable.document(),
            "missing": list(self.missing),
            "broker_unreachable": self.broker_down,
            "publishing": None if self.publishing is None else self.publishing.document(),
        }


def collect(
    urls: AnyBrokerURLs,
    names: Names,
    tasks: Sequence[str],
    store: Store,
    *,
    timeout: float = CONNECT_TIMEOUT,
    connection_name: str = "broker-jobs status",
    now: datetime | None = None,
    summaries: Mapping[str, TaskSummary] | None = None,
    lanes: Mapping[str, Sequence[str]] | FoundLanes | None = None,
    ask_publishing: bool = False,
) -> StatusReport:
    """Connect to the first node of ``urls`` that answers, :func:`gather`, disconnect;
    with ``ask_publishing``, then ask that node whether it takes publishes
    (:func:`~broker_jobs.ops.publishing_check.check_publishing`: ~2 s more while
    it does not).

    Raises :class:`~broker_jobs.errors.BrokerUnreachableError` when no node answers,
    :class:`~broker_jobs.store.StoreError` when the ledger cannot be read."""
    connection, node = connect_first_blocking(
        urls, timeout=timeout, connection_name=connection_name
    )
    try:
        report = gather(
            connection,
            names,
            tasks,
            store,
            node=node.masked,
            now=now,
            summaries=summaries,
            lanes=lanes,
        )
    finally:
        if connection.is_open:
            connection.close()
    if not ask_publishing:
        return report
    # A node lost since the report: the report stands, and this is "not known".
    publishing = check_publishing(BrokerURLs.parse(urls).starting_at(node), connect_timeout=timeout)
    return dataclasses.replace(report, publishing=publishing)


def gather(
    connection: pika.BlockingConnection,
    names: Names,
    tasks: Sequence[str],
    store: Store,
    *,
    node: str = "",
    now: datetime | None = None,
    summaries: Mapping[str, TaskSummary] | None = None,
    lanes: Mapping[str, Sequence[str]] | FoundLanes | None = None,
) -> StatusReport:
    """The report of ``tasks`` in ``names``' namespace, on an open connection (left
    open). ``now`` is when ages are measured from (default: now); ``summaries``: the
    ledger's, if the caller has them already (the dashboard keeps them for a few
    seconds on a large ledger), else read from ``store``. ``lanes``: the queues of
    each task that has several (priority levels, shards: ``App.lanes_by_task``),
    read and added up; not known (no app): found on the broker, by ``lanes`` if it
    is a :class:`FoundLanes` that a long-running caller keeps, else afresh."""
    moment = utc(now)
    if summaries is None:
        summaries = store.task_summaries(now=moment)
    pauses = store.pauses(names.namespace)
    probe = QueueProbe(connection)
    try:
        if not isinstance(lanes, Mapping):
            lanes = (lanes or FoundLanes()).of(probe, names, tasks)
        queues = [
            (
                _task_queue_state(probe, names.task_queue(task), lanes.get(task)),
                probe.queue(names.dead_letter_queue(task)),
            )
            for task in tasks
        ]
        ladder = _ladder(probe, names)
        unroutable = probe.queue(names.unroutable_queue)
    finally:
        probe.close()
    # The index counted after the dead-letter queues' depths: a dead letter a worker
    # confirmed before its depth was read and has indexed since is not counted as
    # missing (counted before, every one dead-lettered meanwhile was).
    indexed = store.dead_letter_counts(tasks) if store.indexes_dead_letters else {}
    statuses = tuple(
        TaskStatus(
            task,
            queue,
            dead_letters,
            summaries.get(task) or empty_summary(task),
            indexed.get(task),
            pauses.get(task),
        )
        for task, (queue, dead_letters) in zip(tasks, queues, strict=True)
    )
    return StatusReport(names.namespace, node, moment, statuses, ladder, unroutable)


def ledger_only(
    names: Names,
    tasks: Sequence[str],
    store: Store,
    why: str,
    *,
    now: datetime | None = None,
    summaries: Mapping[str, TaskSummary] | None = None,
) -> StatusReport:
    """The report of what the ledger knows while the broker cannot be asked
    (``why``): every queue's figures unknown (None), none called missing."""
    moment = utc(now)
    if summaries is None:
        summaries = store.task_summaries(now=moment)
    indexed = store.dead_letter_counts(tasks) if store.indexes_dead_letters else {}
    pauses = store.pauses(names.namespace)

    def unknown(queue: str) -> QueueState:
        return QueueState(queue, exists=True, messages=None, consumers=None)

    statuses = tuple(
        TaskStatus(
            task,
            unknown(names.task_queue(task)),
            unknown(names.dead_letter_queue(task)),
            summaries.get(task) or empty_summary(task),
            indexed.get(task),
            pauses.get(task),
        )
        for task in tasks
    )
    ladder = LadderState(0, DELAY_LEVELS, ())
    return StatusReport(
        names.namespace, "", moment, statuses, ladder, unknown(names.unroutable_queue), why
    )


def _task_queue_state(probe: QueueProbe, queue: str, lanes: Sequence[str] | None) -> QueueState:
    """The task's queue; for a task of several lanes, their queues as one: ready
    messages added up, consumers the fewest of any lane (a lane nobody consumes shows
    0), missing if any lane is."""
    if not lanes:
        return probe.queue(queue)
    states = [probe.queue(lane) for lane in lanes]
    if not all(state.exists for state in states):
        return next(state for state in states if not state.exists)
    return QueueState(
        queue,
        exists=True,
        messages=sum(state.messages or 0 for state in states),
        consumers=min(state.consumers or 0 for state in states),
    )


def empty_summary(task: str) -> TaskSummary:
    """The summary of a task the ledger has no record of."""
    return TaskSummary(
        task=task,
        counts=dict.fromkeys(Status, 0),
        oldest_waiting=None,
        succeeded_last_minute=0,
        failed_last_minute=0,
        succeeded_last_hour=0,
        failed_last_hour=0,
        p50=None,
        p99=None,
    )


def missing_hint(app_path: str | None = None) -> str:
    """What to do about missing queues: declare the topology as an operator."""
    source = f"--app {app_path}" if app_path else "--app MODULE:APP (or --file topology.toml)"
    return f"create them with: broker-jobs topology apply {source}"


def _ladder(probe: QueueProbe, names: Names) -> LadderState:
    levels = [probe.queue(names.delay_queue(level)) for level in range(DELAY_LEVELS)]
    return LadderState(
        messages=sum(level.messages or 0 for level in levels),
        levels=DELAY_LEVELS,
        missing=tuple(level.name for level in levels if not level.exists),
    )


def lanes_found(probe: QueueProbe, names: Names, task: str) -> tuple[str, ...]:
    """The queues of ``task`` on the broker, high level first: for an operator
    without the app, who cannot know whether the task was declared with priorities or
    shards. Each level's shards are numbered from 0 without gaps, so the first shard
    missing ends a level. None at all: the task has no queue (yet)."""
    found = []
    for level in Priority:
        for shard in range(MAX_SHARDS):
            queue = names.lane_queue(task, Lane(level, shard))
            if not probe.queue(queue).exists:
                break
            found.append(queue)
    return tuple(found)


class FoundLanes:
    """The queues of tasks named without the app, found on the broker once per task
    and kept: each passive declare of a missing queue is a channel error that the
    broker logs, which a dashboard or an exporter would repeat at every refresh. A
    task whose queue is not there yet is looked for again at the next call."""

    def __init__(self) -> None:
        self._found: dict[str, tuple[str, ...]] = {}

    def of(
        self, probe: QueueProbe, names: Names, tasks: Sequence[str]
    ) -> dict[str, tuple[str, ...]]:
        for task in tasks:
            if task not in self._found and (found := lanes_found(probe, names, task)):
                self._found[task] = found
        return {task: self._found.get(task, (names.task_queue(task),)) for task in tasks}


class QueueProbe:
    """Passive queue declares on one channel, replaced after each 404 (the broker
    closes a channel on every error)."""

    def __init__(self, connection: pika.BlockingConnection) -> None:
        self._connection = connection
        self._channel: BlockingChannel | None = None

    def queue(self, name: str) -> QueueState:
        try:
            if self._channel is None or not self._channel.is_open:
                self._channel = self._connection.channel()
            ok = self._channel.queue_declare(name, passive=True).method
        except pika.exceptions.ChannelClosedByBroker as error:
            if error.reply_code == _NOT_FOUND:
                return QueueState(name, exists=False, messages=None, consumers=None)
            raise StatusError(
                f"the broker refused to show queue {name!r}: {error.reply_code} {error.reply_text}"
            ) from None
        except pika.exceptions.AMQPError as error:
            raise BrokerConnectionError(
                f"the connection to the broker broke while reading queue {name!r}:"
                f" {type(error).__name__}: {mask_text(str(error))}"
            ) from None
        return QueueState(name, exists=True, messages=ok.message_count, consumers=ok.consumer_count)

    def close(self) -> None:
        if self._channel is not None and self._channel.is_open:
            self._channel.close()


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


def _seconds(duration: timedelta | None) -> float | None:
    return None if duration is None else duration.total_seconds()
