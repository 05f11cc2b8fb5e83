"""One dead letter: read from its message, shown as JSON, and the messages made from
it again (the replayed job, and the copy that moves it to the back of its queue).

A dead letter is read leniently (:func:`read_dead_letter`): it may be a message that
was never a valid job, and an operator must still see it. Which of them can run again
is decided apart, by :func:`replayable`. The headers are ``docs/wire-format.md``'s
("dead letters"); a dead letter that RabbitMQ dead-lettered itself has none of the
``bj-dead-*`` ones, and its reason and time come from RabbitMQ's ``x-death``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pika.spec

from broker_jobs.envelope import PERSISTENT, Job, WireMessage, decode
from broker_jobs.errors import DecodeError
from topology import names as n

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


# -- reading ----------------------------------------------------------------------------


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
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return None


# -- as JSON ----------------------------------------------------------------------------


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


# -- the messages made from it ----------------------------------------------------------


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
