"""Every name that crosses the wire: exchanges, queues, routing keys and headers.

Publishers, workers, beat and the topology command all take their names from this
module, so that a rename happens in one place and `docs/wire-format.md` has one
source to describe. Services in other languages follow that document, so a change
here is a change of the wire contract: bump :data:`WIRE_VERSION` when it breaks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Version of the message format, sent in :data:`HEADER_WIRE_VERSION`.
WIRE_VERSION = 1

#: The namespace used when none is given. A namespace prefixes every broker object,
#: so several independent systems (or test runs) can share one vhost.
DEFAULT_NAMESPACE = "jobs"

#: Content type of every job body: UTF-8 JSON. Nothing else is accepted (no pickle).
CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"

# Headers of a job message. RabbitMQ reserves the ``x-`` prefix for its own headers
# (x-death, x-delivery-count), so ours carry a ``bj-`` prefix instead.
#: The idempotency key: two jobs with one key run once.
HEADER_IDEMPOTENCY_KEY = "bj-idempotency-key"
#: Attempt number, 1 for the first execution; retries publish attempt + 1.
HEADER_ATTEMPT = "bj-attempt"
#: Creation time, ISO 8601 UTC with microseconds (the AMQP timestamp has seconds only).
HEADER_CREATED_AT = "bj-created-at"
#: Due time of a delayed job, ISO 8601 UTC; absent for immediate jobs.
HEADER_DUE_AT = "bj-due-at"
#: Version of this message format.
HEADER_WIRE_VERSION = "bj-wire-version"
#: W3C trace context, passed through unchanged.
HEADER_TRACEPARENT = "traceparent"
HEADER_TRACESTATE = "tracestate"

#: Set by RabbitMQ on a quorum queue's redeliveries (read only): how many times the
#: message was delivered and returned; the queue dead-letters it past its limit.
HEADER_DELIVERY_COUNT = "x-delivery-count"

# Queue arguments, named once so that declare, plan and verify agree.
ARG_QUEUE_TYPE = "x-queue-type"
ARG_DEAD_LETTER_EXCHANGE = "x-dead-letter-exchange"
ARG_DEAD_LETTER_ROUTING_KEY = "x-dead-letter-routing-key"
ARG_DEAD_LETTER_STRATEGY = "x-dead-letter-strategy"
ARG_DELIVERY_LIMIT = "x-delivery-limit"
ARG_OVERFLOW = "x-overflow"
ARG_MESSAGE_TTL = "x-message-ttl"

#: Task names become routing keys and parts of queue names: dotted words of letters,
#: digits, ``_`` and ``-``. The topic wildcards ``*`` and ``#`` are excluded so that
#: a task name binds to exactly one queue.
TASK_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
#: AMQP short strings hold 255 bytes; the longest prefix we add is the namespace plus
#: ``.dead.``, so task names stay well below.
MAX_TASK_NAME_LENGTH = 200
NAMESPACE_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


class InvalidNameError(ValueError):
    """A task name or namespace that cannot be used on the wire."""


def check_task_name(name: str) -> str:
    """Return ``name`` if it can be a task name, else raise :class:`InvalidNameError`."""
    if len(name) > MAX_TASK_NAME_LENGTH or not TASK_NAME_PATTERN.match(name):
        raise InvalidNameError(
            f"invalid task name {name!r}: use dotted words of letters, digits, '_' and '-'"
            f" (for example 'image.resize'), at most {MAX_TASK_NAME_LENGTH} characters"
        )
    return name


def check_namespace(namespace: str) -> str:
    """Return ``namespace`` if usable as a prefix, else raise :class:`InvalidNameError`."""
    if not NAMESPACE_PATTERN.match(namespace):
        raise InvalidNameError(
            f"invalid namespace {namespace!r}: use 1-40 letters, digits, '_' or '-'"
            f" (the default is {DEFAULT_NAMESPACE!r})"
        )
    return namespace


@dataclass(frozen=True)
class Names:
    """The broker object names of one namespace.

    ``Names("jobs")`` gives the work exchange ``jobs.work`` (topic, routing key = task
    name), the task queue ``jobs.task.<task>``, the dead-letter exchange ``jobs.dead``
    (direct, routing key = task name), the dead-letter queue ``jobs.dead.<task>``,
    and the delay ladder ``jobs.delay.00`` ... ``jobs.delay.24`` and ``jobs.delay.out``.
    """

    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        check_namespace(self.namespace)

    @property
    def work_exchange(self) -> str:
        return f"{self.namespace}.work"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.namespace}.dead"

    @property
    def task_queue_prefix(self) -> str:
        """What every task queue's name starts with (for permission patterns)."""
        return f"{self.namespace}.task."

    def task_queue(self, task: str) -> str:
        return f"{self.namespace}.task.{check_task_name(task)}"

    def dead_letter_queue(self, task: str) -> str:
        return f"{self.namespace}.dead.{check_task_name(task)}"

    def delay_exchange(self, level: int) -> str:
        """Level ``level`` of the delay ladder (see :mod:`topology.delay`)."""
        return f"{self.namespace}.delay.{level:02d}"

    def delay_queue(self, level: int) -> str:
        return f"{self.namespace}.delay.{level:02d}"

    @property
    def delay_exchange_pattern(self) -> str:
        """A regex matching every level's exchange (for permissions)."""
        return self.namespace + r"\.delay\.[0-9]{2}"  # namespaces hold no dots

    @property
    def delay_out_exchange(self) -> str:
        """Where the ladder releases jobs; each task queue is bound to it."""
        return f"{self.namespace}.delay.out"

    def routing_key(self, task: str) -> str:
        """Routing key of a job for ``task`` on the work exchange."""
        return check_task_name(task)
