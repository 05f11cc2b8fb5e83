"""The messages made from a dead letter again: the replayed job, the copy that
moves it to the back of its queue, and a job of ``<ns>.unroutable`` sent on to its
task queue (read as a dead letter too: :mod:`broker_jobs.ops.unroutable`). A dead
letter as read (:class:`DeadLetter`, :func:`read_dead_letter`) is the core's
(:mod:`broker_jobs.dead_letter`: the worker and the ledger's index read it too); its
names are given out here as before. Which dead letters can run again is decided by
:func:`replayable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker_jobs.dead_letter import (
    BROKER_DELIVERY_LIMIT,
    BROKER_HEADER_PREFIX,
    HEADER_X_DEATH,
    DeadLetter,
    dead_letter_from,
    jsonable,
    read_dead_letter,
)
from broker_jobs.envelope import PERSISTENT, Job, WireMessage, decode
from broker_jobs.errors import DecodeError
from topology import names as n

__all__ = [
    "BROKER_DELIVERY_LIMIT",
    "BROKER_HEADER_PREFIX",
    "DEAD_HEADERS",
    "FILED_BY_MESSAGE_ID",
    "HEADER_X_DEATH",
    "DeadLetter",
    "dead_letter_from",
    "jsonable",
    "moved_message",
    "read_dead_letter",
    "replay_message",
    "rerouted_message",
    "replayable",
]

#: The reasons of a message a worker could not take as a job (it failed to decode, or
#: its payload failed the task's model): the worker records it dead under its message
#: id, never its idempotency key (``broker_jobs.worker.protocol``: a bad message must
#: not settle the key's job), so its replay finds the record there.
FILED_BY_MESSAGE_ID = frozenset(
    {
        "content-type",
        "content-encoding",
        "encoding",
        "json",
        "wire-version",
        "type",
        "header",
        "envelope",
        "schema",
    }
)

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


def rerouted_message(letter: DeadLetter) -> WireMessage:
    """A job of ``<ns>.unroutable`` sent on to its task queue: as it is (its attempt,
    ``bj-due-at`` and the rest), without RabbitMQ's ``x-*`` headers (the ladder's
    ``x-death`` would trip the broker's cycle detection on a later delay)."""
    headers = {
        key: value
        for key, value in letter.headers.items()
        if not key.startswith(BROKER_HEADER_PREFIX)
    }
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
