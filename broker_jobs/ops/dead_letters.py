"""The dead-letter queues of a namespace: read, replay and purge dead letters.

A task's dead letters wait in its queue ``<ns>.dead.<task>`` (``docs/wire-format.md``,
"dead letters"). :class:`DeadLetterQueues` reads them as :class:`DeadLetter` objects,
replays them (publishes each job again to the work exchange) and purges them. The
command line is ``broker-jobs dlq`` (:mod:`broker_jobs.cli.dlq`).

The pieces live in modules of their own, and this one gives out their public names
too (``broker_jobs.ops.dead_letters`` is the path the library's users know):
:mod:`~broker_jobs.ops.dead_letter_message` (a dead letter as read, and the messages
made from it again), :mod:`~broker_jobs.ops.dead_letter_filter` (which ones an
operation takes), :mod:`~broker_jobs.ops.dead_letter_outcomes` (what a replay or a
purge reports) and :mod:`~broker_jobs.ops.dead_letter_pass` (a pass over a queue:
**reading loses nothing and keeps the order**, it says how and why).

**Replay: the order that makes an interruption harmless.** For each matching dead
letter, one at a time:

1. ``store.reset_for_replay(key)``: a DEAD or FAILED record becomes QUEUED with
   attempts 0, so that the job published again is claimed as new (for a message a
   worker could not take as a job, the record it made under the message id);
2. publish the job again to the work exchange: attempt 1, the same job id,
   idempotency key, payload and headers, without the ``bj-dead-*`` headers and
   RabbitMQ's ``x-*`` ones, ``mandatory``, and wait for the publisher confirm;
3. ack the dead letter, only after the confirm.

Killed anywhere, nothing is lost and nothing runs twice:

- before step 2 (after the reset, or during it): the dead letter is still in its
  queue (unacked messages go back when the connection dies) and the record is
  QUEUED. A second replay publishes it: the reset changes nothing then (None), but
  the publish is still right, and the job runs once.
- after the confirm, before the ack: the dead letter stays *and* the job is in the
  task queue. A second replay publishes a second copy with the same key, which the
  ledger answers as a duplicate (the first copy claimed the key, or finished it),
  so the job runs once, and the dead letter is acked.
- a job not confirmed (a return, a nack, no confirm in time, a lost connection)
  stops the replay with an error; its dead letter stays.

A replay must use the store the workers use: against another one the reset does
nothing (the record is :attr:`LedgerAction.UNKNOWN` there) while the workers'
ledger still says DEAD and skips the replayed job as a duplicate.

Only dead letters that are valid jobs of their queue's task are replayed; the
others (a body that is not JSON, a message of another task: ``wrong-queue``) are
skipped and stay: publishing them again would only dead-letter them again, or run
another task's job from this task's queue.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Callable, Iterator, Sequence

import pika
import pika.exceptions

from broker_jobs.amqp.connecting import connect_first_blocking
from broker_jobs.closing import Closing
from broker_jobs.envelope import Job, WireMessage
from broker_jobs.errors import (
    BrokerConnectionError,
    BrokerJobsError,
    ConfirmTimeoutError,
    NackedError,
    UnroutableError,
)
from broker_jobs.ops.dead_letter_filter import DeadLetterFilter
from broker_jobs.ops.dead_letter_ledger import IndexKeeper
from broker_jobs.ops.dead_letter_message import (
    BROKER_DELIVERY_LIMIT,
    FILED_BY_MESSAGE_ID,
    DeadLetter,
    jsonable,
    moved_message,
    read_dead_letter,
    replay_message,
    replayable,
)
from broker_jobs.ops.dead_letter_outcomes import (
    LedgerAction,
    PurgeProgress,
    Reindexed,
    Replayed,
    ReplayProgress,
    ReplaySummary,
    Skipped,
)
from broker_jobs.ops.dead_letter_pass import (
    Channel,
    Visit,
    close_channel,
    depth_of,
    one_pass,
    translated,
)
from broker_jobs.publish.pika_link import PikaLink
from broker_jobs.store.base import Status, Store
from broker_jobs.urls import AnyBrokerURLs, BrokerURL, BrokerURLs
from topology import names as n

__all__ = [
    "BROKER_DELIVERY_LIMIT",
    "DeadLetter",
    "DeadLetterFilter",
    "DeadLetterQueues",
    "LedgerAction",
    "PurgeProgress",
    "Reindexed",
    "ReplayProgress",
    "ReplaySummary",
    "Replayed",
    "Skipped",
    "jsonable",
    "moved_message",
    "read_dead_letter",
    "replay_message",
    "replayable",
]

#: Seconds for the TCP and AMQP handshake, and for each replayed job's confirm.
CONNECT_TIMEOUT = 10.0
CONFIRM_TIMEOUT = 10.0


class DeadLetterQueues(Closing):
    """The dead-letter queues of ``tasks`` in the namespace of ``names``.

    Connects on first use to the first of ``urls`` that answers; :meth:`close` (or
    ``with``) ends the connection. Not thread-safe. Errors are the library's:
    :class:`TopologyMissingError` for a queue that does not exist,
    :class:`BrokerConnectionError` for a lost broker, a :class:`PublishError` for a
    replayed job that was not confirmed.

    >>> with DeadLetterQueues("amqp://guest:guest@localhost/", app.names, ["mail.send"]) as dlq:
    ...     for letter in dlq.list(DeadLetterFilter(reasons=frozenset({"exhausted"}))):
    ...         print(letter.job_id, letter.error)
    """

    def __init__(
        self,
        urls: AnyBrokerURLs,
        names: n.Names,
        tasks: Sequence[str],
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        confirm_timeout: float = CONFIRM_TIMEOUT,
        connection_name: str = "broker-jobs dlq",
        ledger: Store | None = None,
    ) -> None:
        if not tasks:
            raise BrokerJobsError("no task given: name at least one task's dead-letter queue")
        self.names = names
        self.tasks = tuple(n.check_task_name(task) for task in tasks)
        self._urls = BrokerURLs.parse(urls)
        self._connect_timeout = connect_timeout
        self._confirm_timeout = confirm_timeout
        self._connection_name = connection_name
        #: The workers' ledger, whose index of dead letters each pass keeps in step
        #: (a replay's store, if none is given here).
        self._ledger = ledger
        self._connection: pika.BlockingConnection | None = None
        self._node: BrokerURL | None = None

    # -- the operations ---------------------------------------------------------------

    def depths(self) -> dict[str, int]:
        """How many dead letters each task's queue holds (a passive declare)."""
        with translated():
            return {task: self._depth(task) for task in self.tasks}

    def list(
        self, where: DeadLetterFilter | None = None, *, limit: int | None = None
    ) -> builtins.list[DeadLetter]:
        """The matching dead letters, task by task in queue order, at most ``limit``;
        every one stays in its queue, in its place
        (:mod:`~broker_jobs.ops.dead_letter_pass` says how)."""
        where = where or DeadLetterFilter()
        found: builtins.list[DeadLetter] = []

        def visit(letter: DeadLetter, _link: PikaLink) -> bool:
            if not _reached(len(found), limit) and where.matches(letter):
                found.append(letter)
            return False

        self._passes(visit, self._ledger)
        return found

    def find(self, ref: str) -> builtins.list[DeadLetter]:
        """The dead letters whose job id or idempotency key is ``ref`` (usually one)."""
        return self.list(DeadLetterFilter(ref=ref))

    def replay(
        self,
        store: Store,
        where: DeadLetterFilter | None = None,
        *,
        limit: int | None = None,
        on_progress: Callable[[ReplayProgress], None] | None = None,
    ) -> ReplaySummary:
        """Publish the matching dead letters' jobs again, at most ``limit`` (the first
        ``limit`` as :meth:`_pick` says), one at a time in the order of the module
        docstring: reset the ledger, publish and wait for the confirm, ack. ``store``
        must be the store the workers use."""
        ledger = self._ledger or store
        pick = self._pick(ledger, where, limit)
        summary = ReplaySummary()
        total = sum(self.depths().values())

        def visit(letter: DeadLetter, link: PikaLink) -> bool:
            summary.scanned += 1
            taken = pick.wants(letter) and self._replay_one(link, letter, store, summary)
            if taken:
                pick.took(letter)
            if on_progress is not None:
                on_progress(summary.progress(total))
            return taken

        self._passes(visit, ledger)
        return summary

    def purge(
        self,
        where: DeadLetterFilter | None = None,
        *,
        limit: int | None = None,
        on_progress: Callable[[PurgeProgress], None] | None = None,
    ) -> int:
        """Delete the matching dead letters (at most ``limit``: the first ``limit`` as
        :meth:`_pick` says); every dead letter of the queues without a filter or a
        limit. Returns how many were deleted."""
        where = where or DeadLetterFilter()
        if where.is_empty and limit is None:
            with translated():
                purged = sum(self._purge_queue(task) for task in self.tasks)
            if on_progress is not None:
                on_progress(PurgeProgress(purged, purged, purged))
            return purged
        # The depths only for a caller that shows progress: a purge needs none.
        total = sum(self.depths().values()) if on_progress is not None else 0
        pick = self._pick(self._ledger, where, limit)
        scanned = deleted = 0

        def visit(letter: DeadLetter, _link: PikaLink) -> bool:
            nonlocal scanned, deleted
            scanned += 1
            taken = pick.wants(letter)
            if taken:
                pick.took(letter)
                deleted += 1
            if on_progress is not None:
                on_progress(PurgeProgress(scanned, max(total, scanned), deleted))
            return taken

        self._passes(visit, self._ledger)
        return deleted

    def reindex(
        self, on_progress: Callable[[int, int], None] | None = None
    ) -> builtins.list[Reindexed]:
        """Index every dead letter of the queues in the ledger given as ``ledger``,
        and drop the entries of those no longer there: one pass over each queue
        (every message moved to its back, in order). ``on_progress``: (looked at,
        total) after each message."""
        if self._ledger is None:
            raise BrokerJobsError("reindex needs the ledger: give DeadLetterQueues a ledger")
        total = sum(self.depths().values()) if on_progress is not None else 0
        scanned = 0

        def visit(_letter: DeadLetter, _link: PikaLink) -> bool:
            nonlocal scanned
            scanned += 1
            if on_progress is not None:
                on_progress(scanned, max(total, scanned))
            return False

        return self._passes(visit, self._ledger)

    def indexed_whole(self, ledger: Store | None) -> bool:
        """Whether ``ledger``'s index holds at least as many dead letters of each task
        as its queue (a passive declare each): then a replay or a purge with a limit
        takes the first as listed. Not while some came another way (RabbitMQ's
        delivery limit, another store's workers), nor, for a moment, while a worker
        indexes the dead letter it just made."""
        if ledger is None or not ledger.indexes_dead_letters:
            return False
        indexed = ledger.dead_letter_counts(self.tasks)
        depths = self.depths()
        return all(depths[task] <= indexed.get(task, 0) for task in self.tasks)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()

    # -- helpers ----------------------------------------------------------------------

    def _connected(self) -> pika.BlockingConnection:
        if self._connection is None or not self._connection.is_open:
            self._connection, self._node = connect_first_blocking(
                self._urls.starting_at(self._node),
                timeout=self._connect_timeout,
                connection_name=self._connection_name,
            )
        return self._connection

    def _publishing_link(self) -> PikaLink:
        """A confirm-mode link for the replayed jobs, on the node we read from."""
        self._connected()
        return PikaLink.connect_first(
            self._urls.starting_at(self._node),
            connect_timeout=self._connect_timeout,
            connection_name=f"{self._connection_name} (replay)",
        )

    @contextlib.contextmanager
    def _channel(self) -> Iterator[Channel]:
        """A channel of its own for one step, closed after it."""
        channel = self._connected().channel()
        try:
            yield channel
        finally:
            close_channel(channel)

    def _depth(self, task: str) -> int:
        with self._channel() as channel:
            return depth_of(channel, self.names.dead_letter_queue(task))

    def _passes(self, visit: Visit, ledger: Store | None) -> builtins.list[Reindexed]:
        """One pass over each task's dead-letter queue (see :meth:`_pass`), keeping
        ``ledger``'s index in step (:class:`IndexKeeper`); what each did to it."""
        done: builtins.list[Reindexed] = []
        with translated():
            link = self._publishing_link()
            try:
                for task in self.tasks:
                    keeper = self._keeper(task, ledger)
                    self._pass(task, link, visit if keeper is None else _kept(visit, keeper))
                    if keeper is not None:
                        keeper.finish()  # only after a complete pass
                        done.append(Reindexed(task, keeper.indexed, keeper.dropped))
            finally:
                link.close()
        return done

    def _pick(
        self, ledger: Store | None, where: DeadLetterFilter | None, limit: int | None
    ) -> _Selection:
        """Which dead letters a replay or a purge takes: those ``where`` matches, at
        most ``limit``. With a limit and a complete index (:meth:`indexed_whole`), the
        first ``limit`` in the index's order, the ones ``broker-jobs dlq list --limit``
        shows with the same filters (the oldest first, over all the tasks), so an
        operator acts on what was listed; else the first in queue order, task by task
        (the order of ``list --from-queue``)."""
        where = where or DeadLetterFilter()
        if limit is None or not self.indexed_whole(ledger):
            return _Selection(where, limit)
        assert ledger is not None  # indexed_whole says so
        listed = ledger.dead_letters(self.tasks, where, limit=limit)
        return _Selection(where, limit, frozenset(_listed_as(entry.letter) for entry in listed))

    @staticmethod
    def _keeper(task: str, ledger: Store | None) -> IndexKeeper | None:
        if ledger is None or not ledger.indexes_dead_letters:
            return None
        return IndexKeeper.start(ledger, task)

    def _pass(self, task: str, link: PikaLink, visit: Visit) -> None:
        """One pass over ``task``'s dead-letter queue (:func:`one_pass`)."""
        one_pass(
            self._connected().channel(),
            task=task,
            queue=self.names.dead_letter_queue(task),
            link=link,
            timeout=self._confirm_timeout,
            visit=visit,
        )

    def _purge_queue(self, task: str) -> int:
        """Empty ``task``'s queue, and the index of what it held (what is indexed after
        the mark taken before the purge came after it, and stays)."""
        keeper = self._keeper(task, self._ledger)
        with self._channel() as channel:
            purged = channel.queue_purge(self.names.dead_letter_queue(task)).method.message_count
        if keeper is not None:
            keeper.finish()
        return purged or 0

    def _replay_one(
        self, link: PikaLink, letter: DeadLetter, store: Store, summary: ReplaySummary
    ) -> bool:
        """Steps 1 and 2 of the module docstring; True once the job is confirmed, and
        the caller acks the dead letter (step 3). False: skipped, kept."""
        job, why = replayable(letter)
        if job is None:
            summary.skipped.append(Skipped(letter, why))
            return False
        # 1. the ledger first: a kill from here on leaves the dead letter in place.
        key = _record_key(store, letter, job)
        reset = store.reset_for_replay(key)
        status: Status | None
        if reset is not None:
            action, status = LedgerAction.RESET, reset.status
        else:
            found = store.get(key)
            action = LedgerAction.UNCHANGED if found else LedgerAction.UNKNOWN
            status = found.status if found else None
        # 2. publish and wait for the confirm.
        try:
            self._publish(link, job, replay_message(letter))
        except (UnroutableError, NackedError):
            if reset is not None:  # surely not stored: the ledger says dead again
                why = reset.last_error or "not replayed"
                if key == job.idempotency_key:
                    store.dead(key, None, why, job=job)
                else:  # as the worker recorded it
                    store.dead(key, None, why, job_id=job.id, task=job.task)
            raise
        summary.replayed.append(Replayed(letter, action, status))
        return True

    def _publish(self, link: PikaLink, job: Job, message: WireMessage) -> None:
        # To the queue of its level (its bj-priority header; normal without one).
        key = self.names.routing_key(job.task, job.priority)
        delivery = link.publish(self.names.work_exchange, key, message)
        if not link.wait(lambda: delivery.settled, self._confirm_timeout):
            if not link.is_open:
                raise BrokerConnectionError(
                    f"{link.describe_closed()} before replayed job {job.id} was confirmed:"
                    " its dead letter stays; run the replay again (a copy that did arrive"
                    " runs once)"
                )
            raise ConfirmTimeoutError(job.task, job.id, self._confirm_timeout)
        if delivery.nacked:
            raise NackedError(job.task, job.id)
        if delivery.returned:
            raise UnroutableError(
                job.task,
                self.names.work_exchange,
                self.names.task_queue(job.task, job.priority),
                level=job.priority,
            )


def _record_key(store: Store, letter: DeadLetter, job: Job) -> str:
    """The key of the ledger record the workers keep for ``letter``: its job's key;
    for a message a worker could not take as a job (:data:`FILED_BY_MESSAGE_ID`),
    whose key has no record, its message id when the store holds a record of this
    task there (the worker recorded it dead under that id)."""
    key = job.idempotency_key
    if letter.reason not in FILED_BY_MESSAGE_ID or key == job.id or store.get(key) is not None:
        return key
    filed = store.get(job.id)
    return job.id if filed is not None and filed.task == job.task else key


def _kept(visit: Visit, keeper: IndexKeeper) -> Visit:
    """``visit``, telling ``keeper`` what it decided."""

    def visit_and_keep(letter: DeadLetter, link: PikaLink) -> bool:
        taken = visit(letter, link)
        keeper.saw(letter, taken=taken)
        return taken

    return visit_and_keep


class _Selection:
    """The dead letters an operation takes: those ``where`` matches, at most
    ``limit``; with ``chosen``, only those (each once: a second copy in its queue is
    kept)."""

    def __init__(
        self,
        where: DeadLetterFilter,
        limit: int | None,
        chosen: frozenset[tuple[str, str, str | None]] | None = None,
    ) -> None:
        self._where = where
        self._limit = limit
        self._left = None if chosen is None else set(chosen)
        self._taken = 0

    def wants(self, letter: DeadLetter) -> bool:
        """Whether to take ``letter`` (call :meth:`took` once it was)."""
        if _reached(self._taken, self._limit) or not self._where.matches(letter):
            return False
        return self._left is None or _listed_as(letter) in self._left

    def took(self, letter: DeadLetter) -> None:
        self._taken += 1
        if self._left is not None:
            self._left.discard(_listed_as(letter))


def _listed_as(letter: DeadLetter) -> tuple[str, str, str | None]:
    """What tells one dead letter from the others of its task, in the queue as in the
    index: its letter id and its dead at, as the index's document keeps it (to the
    millisecond)."""
    dead_at = letter.dead_at.isoformat(timespec="milliseconds") if letter.dead_at else None
    return letter.task, letter.letter_id, dead_at


def _reached(count: int, limit: int | None) -> bool:
    return limit is not None and count >= limit
