"""The dead-letter queues of a namespace: read, replay and purge dead letters.

A task's dead letters wait in its queue ``<ns>.dead.<task>`` (``docs/wire-format.md``,
"dead letters"). :class:`DeadLetterQueues` reads them as :class:`DeadLetter` objects,
replays them (publishes each job again to the work exchange) and purges them. The
command line is ``broker-jobs dlq`` (:mod:`broker_jobs.cli.dlq`).

**Reading loses nothing and keeps the order.** A pass over a queue takes its
depth, then gets that many messages one by one (``basic.get``). A message the
operation takes (a replayed or purged one) is acked; every other one is *moved to
the back*: a copy is published to the queue (through the default exchange, so to
that queue alone) and, once the broker confirmed the copy, the original is acked.
After the whole pass the queue holds the kept dead letters in the order they were
(a dead letter arriving meanwhile lands among them, in its arrival order).

Giving the messages back instead (a reject with requeue, or closing the channel)
does not keep the order of a quorum queue: measured on RabbitMQ 3.10.8, 40
messages read unacked came back in a scrambled order after a channel close, and
rotated after rejects in order (a classic queue kept the order both ways). Each
giving back also counts as a delivery (``x-delivery-count``), and a quorum queue of
RabbitMQ 4.0 to 4.2 has a default delivery limit of 20 that would drop a dead letter
(a dead-letter queue has no dead-letter exchange) after as many reads. A moved copy
starts with no count. The cost: a pass writes every message once, and an operation
killed midway leaves at most one dead letter twice in the queue (its copy
confirmed, the original not acked yet: the connection's end returns the original,
out of its place). Nothing is lost, and a dead letter in the queue twice is
harmless: a replay of both runs the job once (below).

**Replay: the order that makes an interruption harmless.** For each matching dead
letter, one at a time:

1. ``store.reset_for_replay(key)``: a DEAD or FAILED record becomes QUEUED with
   attempts 0, so that the job published again is claimed as new;
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
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import TracebackType
from typing import Any

import pika
import pika.adapters.blocking_connection
import pika.exceptions
import pika.spec

from broker_jobs.amqp.connecting import connect_first_blocking
from broker_jobs.envelope import PERSISTENT, Job, WireMessage, decode
from broker_jobs.errors import (
    BrokerConnectionError,
    BrokerJobsError,
    ConfirmTimeoutError,
    DecodeError,
    NackedError,
    TopologyMissingError,
    UnroutableError,
)
from broker_jobs.publish.pika_link import PikaLink
from broker_jobs.store.base import Status, Store
from broker_jobs.urls import AnyBrokerURLs, BrokerURL, BrokerURLs, mask_text
from topology import names as n

__all__ = [
    "BROKER_DELIVERY_LIMIT",
    "DeadLetter",
    "DeadLetterFilter",
    "DeadLetterQueues",
    "LedgerAction",
    "PurgeProgress",
    "ReplayProgress",
    "ReplaySummary",
    "Replayed",
    "Skipped",
]

#: Seconds for the TCP and AMQP handshake, and for each replayed job's confirm.
CONNECT_TIMEOUT = 10.0
CONFIRM_TIMEOUT = 10.0
#: The headers a dead letter adds to the job (stripped from a replayed job).
DEAD_HEADERS = frozenset(
    {
        n.HEADER_DEAD_REASON,
        n.HEADER_DEAD_ERROR,
        n.HEADER_DEAD_TRACEBACK,
        n.HEADER_DEAD_ATTEMPTS,
        n.HEADER_DEAD_WORKER,
        n.HEADER_DEAD_AT,
    }
)
#: RabbitMQ reserves this prefix for its own headers (x-death, x-delivery-count):
#: never part of a job, and an x-death copied into a new message can trip the
#: broker's dead-letter cycle detection.
BROKER_HEADER_PREFIX = "x-"
#: RabbitMQ's own header naming the dead-letterings of a message, newest first.
HEADER_X_DEATH = "x-death"
#: The reason of a dead letter that RabbitMQ dead-lettered itself (a quorum task
#: queue's delivery limit: ``docs/wire-format.md``); it has no ``bj-dead-`` headers.
BROKER_DELIVERY_LIMIT = "delivery_limit"
#: AMQP reply code for a queue or exchange that does not exist.
NOT_FOUND = 404


@dataclass(frozen=True)
class DeadLetter:
    """One message of a dead-letter queue, as read (nothing is decoded strictly: a
    dead letter may be a message that was never a valid job)."""

    task: str  #: the task of the dead-letter queue it is in
    job_id: str | None  #: ``message_id``
    idempotency_key: str | None  #: ``bj-idempotency-key``, else the job id
    attempts: int | None  #: ``bj-dead-attempts``: how many attempts ran (None: never ran)
    reason: str | None  #: ``bj-dead-reason``, or ``delivery_limit`` (RabbitMQ's own)
    error: str | None
    traceback: str | None
    dead_at: datetime | None  #: aware UTC
    worker: str | None  #: the worker that dead-lettered it
    payload: Any  #: the body as JSON; None when it is not JSON
    body: bytes
    headers: Mapping[str, Any]  #: every header as the broker sent it
    properties: Mapping[str, Any]  #: content_type, type, message_id, timestamp...

    @property
    def from_broker(self) -> bool:
        """Dead-lettered by RabbitMQ (a delivery limit), not by a worker."""
        return n.HEADER_DEAD_REASON not in self.headers

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``docs/operations.md``, "what --json prints")."""
        return {
            "task": self.task,
            "job_id": self.job_id,
            "idempotency_key": self.idempotency_key,
            "reason": self.reason,
            "error": self.error,
            "attempts": self.attempts,
            "dead_at": _iso(self.dead_at),
            "worker": self.worker,
            "from_broker": self.from_broker,
            "payload": self.payload,
            "body": None if self.payload is not None else self.body.decode("utf-8", "replace"),
            "traceback": self.traceback,
            "properties": jsonable(self.properties),
            "headers": jsonable(self.headers),
        }


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters an operation takes: each given criterion must hold."""

    reasons: frozenset[str] = frozenset()  #: any of these reasons
    error: str | None = None  #: a substring of the error (any case)
    since: datetime | None = None  #: dead at or after (aware)
    until: datetime | None = None  #: dead before (aware)
    ref: str | None = None  #: the job id or the idempotency key

    def __post_init__(self) -> None:
        for moment in (self.since, self.until):
            if moment is not None and moment.tzinfo is None:
                raise BrokerJobsError(
                    "a dead-at bound must have a time zone (for example datetime.now(UTC))"
                )

    @property
    def is_empty(self) -> bool:
        """True when it takes every dead letter."""
        return self == DeadLetterFilter()

    def matches(self, letter: DeadLetter) -> bool:
        if self.reasons and letter.reason not in self.reasons:
            return False
        if self.error is not None and self.error.lower() not in (letter.error or "").lower():
            return False
        if self.ref is not None and self.ref not in (letter.job_id, letter.idempotency_key):
            return False
        return self._in_range(letter.dead_at)

    def _in_range(self, moment: datetime | None) -> bool:
        if self.since is None and self.until is None:
            return True
        if moment is None:  # a time range never takes a dead letter of unknown time
            return False
        return (self.since is None or moment >= self.since) and (
            self.until is None or moment < self.until
        )


class LedgerAction(StrEnum):
    """What a replay did to the job's record before publishing it again."""

    RESET = "reset"  #: DEAD or FAILED -> QUEUED: the job runs again
    #: Left as it was (QUEUED after an interrupted replay, or already claimed or
    #: finished by a copy published before: the publish is then a duplicate).
    UNCHANGED = "unchanged"
    #: This store has no record of the key: is it the store the workers use?
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Replayed:
    """A dead letter published again (confirmed) and acked."""

    letter: DeadLetter
    ledger: LedgerAction
    status: Status | None  #: the record's status once reset, or as found (UNCHANGED)


@dataclass(frozen=True)
class Skipped:
    """A matching dead letter that is not replayable; it stays in its queue."""

    letter: DeadLetter
    why: str


@dataclass(frozen=True)
class ReplayProgress:
    """Passed to a replay's ``on_progress`` after each message it looked at."""

    scanned: int  #: messages looked at so far
    total: int  #: messages the replay looks at, at most (the queues' depth at the start)
    replayed: int
    skipped: int


@dataclass(frozen=True)
class PurgeProgress:
    """Passed to a purge's ``on_progress`` after each message it looked at (once,
    after the whole queues, for a purge without a filter or a limit: the broker
    empties those in one step)."""

    scanned: int  #: messages looked at so far
    total: int  #: messages the purge looks at, at most (the queues' depth at the start)
    deleted: int


@dataclass
class ReplaySummary:
    """What a replay did."""

    scanned: int = 0
    replayed: list[Replayed] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def count(self, action: LedgerAction) -> int:
        return sum(item.ledger is action for item in self.replayed)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``docs/operations.md``, "what --json prints")."""
        return {
            "scanned": self.scanned,
            "replayed": len(self.replayed),
            "skipped": len(self.skipped),
            "ledger": {action.value: self.count(action) for action in LedgerAction},
            "jobs": [
                {
                    "task": item.letter.task,
                    "job_id": item.letter.job_id,
                    "idempotency_key": item.letter.idempotency_key,
                    "ledger": item.ledger.value,
                    "status": item.status.value if item.status else None,
                }
                for item in self.replayed
            ],
            "skipped_jobs": [
                {"task": item.letter.task, "job_id": item.letter.job_id, "why": item.why}
                for item in self.skipped
            ],
        }


class DeadLetterQueues:
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
    ) -> None:
        if not tasks:
            raise BrokerJobsError("no task given: name at least one task's dead-letter queue")
        self.names = names
        self.tasks = tuple(n.check_task_name(task) for task in tasks)
        self._urls = BrokerURLs.parse(urls)
        self._connect_timeout = connect_timeout
        self._confirm_timeout = confirm_timeout
        self._connection_name = connection_name
        self._connection: pika.BlockingConnection | None = None
        self._node: BrokerURL | None = None

    # -- the operations ---------------------------------------------------------------

    def depths(self) -> dict[str, int]:
        """How many dead letters each task's queue holds (a passive declare)."""
        with _translated():
            return {task: self._depth(task) for task in self.tasks}

    def list(
        self, where: DeadLetterFilter | None = None, *, limit: int | None = None
    ) -> builtins.list[DeadLetter]:
        """The matching dead letters, task by task in queue order, at most ``limit``;
        every one stays in its queue, in its place (the module docstring says how)."""
        where = where or DeadLetterFilter()
        found: builtins.list[DeadLetter] = []

        def visit(letter: DeadLetter, _link: PikaLink) -> bool:
            if not _reached(len(found), limit) and where.matches(letter):
                found.append(letter)
            return False

        self._passes(visit)
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
        """Publish the matching dead letters' jobs again, at most ``limit``, one at a
        time in the order of the module docstring: reset the ledger, publish and
        wait for the confirm, ack. ``store`` must be the store the workers use."""
        where = where or DeadLetterFilter()
        summary = ReplaySummary()
        total = sum(self.depths().values())

        def visit(letter: DeadLetter, link: PikaLink) -> bool:
            summary.scanned += 1
            taken = (
                not _reached(len(summary.replayed), limit)
                and where.matches(letter)
                and self._replay_one(link, letter, store, summary)
            )
            if on_progress is not None:
                on_progress(_progress(summary, total))
            return taken

        self._passes(visit)
        return summary

    def purge(
        self,
        where: DeadLetterFilter | None = None,
        *,
        limit: int | None = None,
        on_progress: Callable[[PurgeProgress], None] | None = None,
    ) -> int:
        """Delete the matching dead letters (at most ``limit``); every dead letter of
        the queues without a filter or a limit. Returns how many were deleted."""
        where = where or DeadLetterFilter()
        if where.is_empty and limit is None:
            with _translated():
                purged = sum(self._purge_queue(task) for task in self.tasks)
            if on_progress is not None:
                on_progress(PurgeProgress(purged, purged, purged))
            return purged
        # The depths only for a caller that shows progress: a purge needs none.
        total = sum(self.depths().values()) if on_progress is not None else 0
        scanned = deleted = 0

        def visit(letter: DeadLetter, _link: PikaLink) -> bool:
            nonlocal scanned, deleted
            scanned += 1
            taken = not _reached(deleted, limit) and where.matches(letter)
            if taken:
                deleted += 1
            if on_progress is not None:
                on_progress(PurgeProgress(scanned, max(total, scanned), deleted))
            return taken

        self._passes(visit)
        return deleted

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()

    def __enter__(self) -> DeadLetterQueues:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()

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

    def _depth(self, task: str) -> int:
        channel = self._connected().channel()
        try:
            queue = self.names.dead_letter_queue(task)
            return _depth_of(channel, queue)
        finally:
            _close(channel)

    def _passes(self, visit: Callable[[DeadLetter, PikaLink], bool]) -> None:
        """One pass over each task's dead-letter queue (see :meth:`_pass`)."""
        with _translated():
            link = self._publishing_link()
            try:
                for task in self.tasks:
                    self._pass(task, link, visit)
            finally:
                link.close()

    def _pass(
        self, task: str, link: PikaLink, visit: Callable[[DeadLetter, PikaLink], bool]
    ) -> None:
        """Every message of ``task``'s dead-letter queue, as deep as it was at the start:
        ``visit`` True acks it (taken); False moves it to the back (kept), so after the
        whole pass the kept ones are in the order they were."""
        channel = self._connected().channel()
        queue = self.names.dead_letter_queue(task)
        mover = _Mover(link, channel, queue, self._confirm_timeout)
        try:
            # Only the depth at the start: what arrives meanwhile (the copies among
            # it) waits for the next pass.
            for _ in range(_depth_of(channel, queue)):
                method, properties, body = channel.basic_get(queue, auto_ack=False)
                if method is None or method.delivery_tag is None or properties is None:
                    break  # emptied meanwhile (another client took some)
                letter = read_dead_letter(task, properties, _bytes(body))
                if visit(letter, link):
                    channel.basic_ack(method.delivery_tag)
                else:
                    mover.keep(method.delivery_tag, letter)
        finally:
            _close(channel)  # what is still unacked goes back to the queue

    def _purge_queue(self, task: str) -> int:
        channel = self._connected().channel()
        try:
            purged = channel.queue_purge(self.names.dead_letter_queue(task)).method.message_count
            return purged or 0
        finally:
            _close(channel)

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
        reset = store.reset_for_replay(job.idempotency_key)
        status: Status | None
        if reset is not None:
            action, status = LedgerAction.RESET, reset.status
        else:
            found = store.get(job.idempotency_key)
            action = LedgerAction.UNCHANGED if found else LedgerAction.UNKNOWN
            status = found.status if found else None
        # 2. publish and wait for the confirm.
        self._publish(link, job, replay_message(letter))
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
                job.task, self.names.work_exchange, self.names.task_queue(job.task)
            )


@dataclass
class _Mover:
    """Moves kept dead letters to the back of their queue: a copy is published and
    confirmed, then the original is acked at once. Returning a message instead (a
    reject, a channel close) does not keep the order of a quorum queue, and neither
    did acking many ``basic.get`` deliveries late: on RabbitMQ 3.10.8, 40 gets acked
    after the pass left 7 unacked (back in the queue, twice); acked one by one, none."""

    link: PikaLink
    channel: pika.adapters.blocking_connection.BlockingChannel
    queue: str
    timeout: float

    def keep(self, tag: int, letter: DeadLetter) -> None:
        # The default exchange routes to this queue alone, whatever else the
        # dead-letter exchange may be bound to.
        delivery = self.link.publish("", self.queue, moved_message(letter))
        settled = self.link.wait(lambda: delivery.settled, self.timeout)
        self.link.forget_settled()
        if not settled:
            why = self.link.describe_closed() if not self.link.is_open else "no confirm in time"
            raise BrokerConnectionError(
                f"moving a dead letter to the back of {self.queue}: {why}; none is lost,"
                " but one may now be in the queue twice, and the unacked ones out of order"
            )
        if not delivery.acked or delivery.returned:
            raise BrokerJobsError(
                f"the broker refused to put a dead letter back at the end of {self.queue}"
                " (basic.nack or basic.return): it stays where it was; check that the"
                " queue exists and is not full, and try again"
            )
        self.channel.basic_ack(tag)


# -- reading and writing one dead letter ------------------------------------------------


def read_dead_letter(task: str, properties: pika.spec.BasicProperties, body: bytes) -> DeadLetter:
    """A :class:`DeadLetter` from a message of ``task``'s dead-letter queue."""
    headers: dict[str, Any] = dict(properties.headers or {})
    death = _broker_death(headers)
    job_id = properties.message_id
    reason = _text(headers.get(n.HEADER_DEAD_REASON))
    dead_at = _time(headers.get(n.HEADER_DEAD_AT))
    if n.HEADER_DEAD_REASON not in headers and death is not None:
        reason = _text(death.get("reason"))
        dead_at = _time(death.get("time"))
    return DeadLetter(
        task=task,
        job_id=job_id,
        idempotency_key=_text(headers.get(n.HEADER_IDEMPOTENCY_KEY)) or job_id,
        attempts=_integer(headers.get(n.HEADER_DEAD_ATTEMPTS)),
        reason=reason,
        error=_text(headers.get(n.HEADER_DEAD_ERROR)),
        traceback=_text(headers.get(n.HEADER_DEAD_TRACEBACK)),
        dead_at=dead_at,
        worker=_text(headers.get(n.HEADER_DEAD_WORKER)),
        payload=_json(body),
        body=body,
        headers=headers,
        properties={
            "content_type": properties.content_type,
            "content_encoding": properties.content_encoding,
            "message_id": properties.message_id,
            "type": properties.type,
            "timestamp": properties.timestamp,
            "delivery_mode": properties.delivery_mode,
        },
    )


def replayable(letter: DeadLetter) -> tuple[Job | None, str]:
    """The job a dead letter holds, or None and why it cannot be replayed."""
    try:
        job = decode(_wire(letter, letter.headers))
    except DecodeError as error:
        return None, str(error)
    if job.task != letter.task:
        return None, (
            f"its type names task {job.task!r}, not {letter.task!r}: a queue's messages"
            " only ever run that queue's task"
        )
    return job, ""


def replay_message(letter: DeadLetter) -> WireMessage:
    """The job again: the same body, properties and headers, attempt 1, without the
    ``bj-dead-*`` headers and RabbitMQ's ``x-*`` ones."""
    headers = {
        key: value
        for key, value in letter.headers.items()
        if key not in DEAD_HEADERS and not key.startswith(BROKER_HEADER_PREFIX)
    }
    headers[n.HEADER_ATTEMPT] = 1
    return _wire(letter, headers)


def moved_message(letter: DeadLetter) -> WireMessage:
    """A dead letter as it is, to put at the back of its queue (without the delivery
    count, which the broker sets on a redelivery)."""
    headers = {k: v for k, v in letter.headers.items() if k != n.HEADER_DELIVERY_COUNT}
    return _wire(letter, headers)


def _wire(letter: DeadLetter, headers: Mapping[str, Any]) -> WireMessage:
    properties = letter.properties
    return WireMessage(
        body=letter.body,
        message_id=properties.get("message_id"),
        type=properties.get("type"),
        content_type=properties.get("content_type"),
        content_encoding=properties.get("content_encoding"),
        timestamp=properties.get("timestamp"),
        delivery_mode=PERSISTENT,
        headers=headers,
    )


def _broker_death(headers: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The newest ``x-death`` entry (RabbitMQ lists them newest first)."""
    deaths = headers.get(HEADER_X_DEATH)
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], Mapping):
        return deaths[0]
    return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _bytes(body: bytes | str | None) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else body or b""


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(value: Any) -> datetime | None:
    """An ISO 8601 header, or an AMQP timestamp (pika gives a naive UTC datetime)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = _text(value)
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return None


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z") if moment else None


def jsonable(value: Any) -> Any:
    """AMQP values (bytes, datetimes, decimals, nested tables) as JSON values."""
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime):
        return _iso(value if value.tzinfo else value.replace(tzinfo=UTC))
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _reached(count: int, limit: int | None) -> bool:
    return limit is not None and count >= limit


def _progress(summary: ReplaySummary, total: int) -> ReplayProgress:
    return ReplayProgress(
        summary.scanned, max(total, summary.scanned), len(summary.replayed), len(summary.skipped)
    )


def _depth_of(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    """The queue's depth (a passive declare: 404 when it does not exist)."""
    return channel.queue_declare(queue, passive=True).method.message_count or 0


def _close(channel: pika.adapters.blocking_connection.BlockingChannel) -> None:
    """Close a channel: its unacked messages go back to the front of their queue."""
    if channel.is_open:
        with contextlib.suppress(pika.exceptions.AMQPError):
            channel.close()


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """pika's errors as the library's, with passwords masked."""
    try:
        yield
    except pika.exceptions.ChannelClosedByBroker as error:
        if error.reply_code == NOT_FOUND:
            raise TopologyMissingError(error.reply_text) from None
        raise BrokerJobsError(
            f"the broker refused: {error.reply_code} {mask_text(error.reply_text)}. Reading"
            " dead letters needs read permission on the dead-letter queues, replaying them"
            " write permission on the work exchange too (broker-jobs topology permissions)"
        ) from None
    except pika.exceptions.AMQPError as error:
        raise BrokerConnectionError(
            f"the connection to the broker broke: {type(error).__name__}:"
            f" {mask_text(str(error))}; unacked dead letters went back to their queue"
        ) from None
