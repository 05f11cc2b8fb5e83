"""One dead letter, as read from its message (:class:`DeadLetter`), and which dead
letters an operation takes (:class:`DeadLetterFilter`).

A dead letter is read leniently: it may be a message that was never a valid job, and
an operator must still see it. The headers are ``docs/wire-format.md``'s ("dead
letters"); a dead letter that RabbitMQ dead-lettered itself has none of the
``bj-dead-*`` ones, and its reason and time come from RabbitMQ's ``x-death``.

It is the core's because three layers read one: the worker indexes each dead letter
it makes in the ledger, the store keeps and filters them, and the operator's
commands (:mod:`broker_jobs.ops.dead_letters`) read, replay and purge them.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pika.spec

from broker_jobs.envelope import strict_json
from broker_jobs.errors import BrokerJobsError
from topology import names as n

BROKER_HEADER_PREFIX = n.BROKER_HEADER_PREFIX
#: RabbitMQ's own header naming the dead-letterings of a message, newest first.
HEADER_X_DEATH = "x-death"
#: The reason of a dead letter that RabbitMQ dead-lettered itself (a quorum task
#: queue's delivery limit: ``docs/wire-format.md``); it has no ``bj-dead-`` headers.
BROKER_DELIVERY_LIMIT = "delivery_limit"


#: The message properties a dead letter keeps.
PROPERTIES = (
    "content_type",
    "content_encoding",
    "message_id",
    "type",
    "timestamp",
    "delivery_mode",
)


@dataclass(frozen=True)
class DeadLetter:
    """One message of a dead-letter queue, as read (nothing is decoded strictly: a
    dead letter may be a message that was never a valid job)."""

    task: str  #: the task of the dead-letter queue it is in
    job_id: str | None  #: ``message_id``
    idempotency_key: str | None  #: ``bj-idempotency-key``, else the job id
    attempts: int | None  #: ``bj-dead-attempts``: the attempt that failed last (None: never ran)
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
    def letter_id(self) -> str:
        """What tells this dead letter from the others of its queue: its job id, else
        (a message that never had one) a digest of its body."""
        return self.job_id or "sha256:" + hashlib.sha256(self.body).hexdigest()[:24]

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
            "properties": _properties_json(self.properties),
            "headers": jsonable(self.headers),
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any], body: bytes) -> DeadLetter:
        """A dead letter again from :meth:`to_json`'s document and its ``body`` (as
        the ledger's index keeps it: the headers and properties as JSON values)."""
        return cls(
            task=document["task"],
            job_id=document.get("job_id"),
            idempotency_key=document.get("idempotency_key"),
            attempts=document.get("attempts"),
            reason=document.get("reason"),
            error=document.get("error"),
            traceback=document.get("traceback"),
            dead_at=_time(document.get("dead_at")),
            worker=document.get("worker"),
            payload=_json(body),
            body=body,
            headers=dict(document.get("headers") or {}),
            properties=dict(document.get("properties") or {}),
        )


# -- reading ----------------------------------------------------------------------------


def read_dead_letter(task: str, properties: pika.spec.BasicProperties, body: bytes) -> DeadLetter:
    """A :class:`DeadLetter` from a message of ``task``'s dead-letter queue."""
    return dead_letter_from(
        task,
        properties.headers or {},
        {
            "content_type": properties.content_type,
            "content_encoding": properties.content_encoding,
            "message_id": properties.message_id,
            "type": properties.type,
            "timestamp": properties.timestamp,
            "delivery_mode": properties.delivery_mode,
        },
        body,
    )


def dead_letter_from(
    task: str, headers: Mapping[str, Any], properties: Mapping[str, Any], body: bytes
) -> DeadLetter:
    """A :class:`DeadLetter` from a message's headers, properties (``content_type``,
    ``content_encoding``, ``message_id``, ``type``, ``timestamp``, ``delivery_mode``)
    and body: as read from its queue, or as a worker publishes it there."""
    headers = dict(headers)
    death = _broker_death(headers)
    job_id = _text(properties.get("message_id"))
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
        properties={name: properties.get(name) for name in PROPERTIES},
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
    try:
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except OverflowError:  # before year 1 in UTC
        return None


def _json(body: bytes) -> Any:
    """The body's JSON, as a job's is read (no NaN, which no strict reader of a
    ``--json`` or an API document takes); None when it is none, or too deep."""
    try:
        return strict_json(body.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


# -- as JSON ----------------------------------------------------------------------------


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z") if moment else None


def _properties_json(properties: Mapping[str, Any]) -> dict[str, Any]:
    """The properties as JSON values, the timestamp as a UTC time however it was read
    (pika gives seconds, aio-pika a datetime): read from the queue or from the
    ledger's index, a dead letter's JSON has one shape."""
    document: dict[str, Any] = jsonable(properties)
    stamp = properties.get("timestamp")
    if isinstance(stamp, int) and not isinstance(stamp, bool):
        # Out of datetime's range: left as it came.
        with contextlib.suppress(OverflowError, OSError, ValueError):
            document["timestamp"] = _iso(datetime.fromtimestamp(stamp, UTC))
    return document


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


# -- which ones an operation takes -----------------------------------------------------


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
