"""Publishing a job to its task's dead-letter queue, with the reason.

The worker dead-letters by publishing (confirmed) rather than by rejecting the
delivery: a reject carries no reason, and a quorum queue's own dead-lettering is
kept for the crash loops that the worker never gets to see (the delivery limit).
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aio_pika
import aio_pika.abc

from broker_jobs.clock import utc_now
from broker_jobs.envelope import encodable
from topology import names as n

#: Header names added to a dead letter (wire names: topology/names.py).
HEADER_REASON = n.HEADER_DEAD_REASON
HEADER_ERROR = n.HEADER_DEAD_ERROR
HEADER_TRACEBACK = n.HEADER_DEAD_TRACEBACK
HEADER_ATTEMPTS = n.HEADER_DEAD_ATTEMPTS
HEADER_WORKER = n.HEADER_DEAD_WORKER
HEADER_AT = n.HEADER_DEAD_AT

#: Characters of an error message and of a traceback kept in a dead letter.
MAX_ERROR = 2000
MAX_TRACEBACK = 4000


@dataclass(frozen=True)
class DeathCause:
    """Why a job is dead: a short reason (``exhausted``, ``permanent``, ``json``,
    ``wrong-queue``, ``schema``...: ``DEAD_REASONS`` of topology/names.py) and the
    error behind it."""

    reason: str
    error: str
    attempts: int | None = None
    traceback: str | None = None

    def __post_init__(self) -> None:
        if self.reason not in n.DEAD_REASONS:  # the wire contract lists every reason
            raise ValueError(f"no such dead-letter reason {self.reason!r}: add it to DEAD_REASONS")

    @classmethod
    def from_exception(cls, reason: str, error: BaseException, attempts: int) -> DeathCause:
        trace = "".join(traceback.format_exception(error))
        return cls(reason, f"{type(error).__name__}: {error}", attempts, trace[-MAX_TRACEBACK:])


def dead_letter_message(
    body: bytes, properties: Mapping[str, Any], cause: DeathCause, worker: str
) -> aio_pika.Message:
    """The original message with the cause in its headers; RabbitMQ's own ``x-``
    headers are dropped (``x-death`` would trip cycle detection on a replay)."""
    # A message's own bj-dead-* headers are dropped too: what a dead letter says of
    # its death is the worker's, never a publisher's (a forged traceback, say).
    headers = {
        key: encodable(value)
        for key, value in dict(properties.get("headers") or {}).items()
        if not key.startswith((n.BROKER_HEADER_PREFIX, n.DEAD_HEADER_PREFIX))
    }
    headers[HEADER_REASON] = cause.reason
    headers[HEADER_ERROR] = cause.error[:MAX_ERROR]
    headers[HEADER_WORKER] = worker
    headers[HEADER_AT] = utc_now().isoformat(timespec="milliseconds")
    if cause.attempts is not None:
        headers[HEADER_ATTEMPTS] = cause.attempts
    if cause.traceback:
        headers[HEADER_TRACEBACK] = cause.traceback
    return aio_pika.Message(
        body,
        headers=headers,
        content_type=properties.get("content_type"),
        content_encoding=properties.get("content_encoding"),
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=properties.get("message_id"),
        type=properties.get("type"),
        timestamp=properties.get("timestamp"),
    )


async def publish_dead_letter(
    channel: aio_pika.abc.AbstractChannel,
    names: n.Names,
    task: str,
    message: aio_pika.Message,
    timeout: float,
) -> None:
    """Publish to ``task``'s dead-letter queue and wait for the confirm."""
    exchange = await channel.get_exchange(names.dead_letter_exchange, ensure=False)
    await exchange.publish(message, names.routing_key(task), mandatory=True, timeout=timeout)
