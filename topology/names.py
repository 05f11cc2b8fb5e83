"""Every name that crosses the wire: exchanges, queues, routing keys and headers.

Publishers, workers, beat and the topology command all take their names from this
module, so that a rename happens in one place and `docs/wire-format.md` has one
source to describe. Services in other languages follow that document, so a change
here is a change of the wire contract: bump :data:`WIRE_VERSION` when it breaks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topology.lanes import Lane
from topology.priority import Priority

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
#: Priority level of a job of a task with priorities: ``high`` or ``low`` (absent or
#: ``normal``: normal). The routing key chose its queue; the header keeps the level
#: for its retries and a replay from the dead-letter queue (topology/priority.py).
HEADER_PRIORITY = "bj-priority"
#: W3C trace context, passed through unchanged.
HEADER_TRACEPARENT = "traceparent"
HEADER_TRACESTATE = "tracestate"

#: The type of each job header (``docs/wire-format.md``, "one rule for types"):
#: strings arrive as AMQP long strings or byte arrays of UTF-8; integers as any AMQP
#: integer type, never as a string, a float or a boolean.
STRING_HEADERS = (
    HEADER_IDEMPOTENCY_KEY,
    HEADER_CREATED_AT,
    HEADER_DUE_AT,
    HEADER_PRIORITY,
    HEADER_TRACEPARENT,
    HEADER_TRACESTATE,
)
INTEGER_HEADERS = (HEADER_WIRE_VERSION, HEADER_ATTEMPT)

# Headers the worker adds to a dead letter (a new message: RabbitMQ's ``x-`` headers
# of the original are dropped, so a dead letter carries no ``x-death``).
#: Why the job is dead: one of :data:`DEAD_REASONS`.
#: What every header of a dead letter's cause starts with.
DEAD_HEADER_PREFIX = "bj-dead-"
HEADER_DEAD_REASON = "bj-dead-reason"
#: The error, ``Type: message``, at most 2,000 characters.
HEADER_DEAD_ERROR = "bj-dead-error"
#: A traceback excerpt (the last 4,000 characters), when a handler raised.
HEADER_DEAD_TRACEBACK = "bj-dead-traceback"
#: How many attempts ran, when the job was run at all.
HEADER_DEAD_ATTEMPTS = "bj-dead-attempts"
#: The worker that dead-lettered it (``host:pid:random``).
HEADER_DEAD_WORKER = "bj-dead-worker"
#: When, ISO 8601 UTC with milliseconds.
HEADER_DEAD_AT = "bj-dead-at"

#: Every reason a dead letter can carry in :data:`HEADER_DEAD_REASON`, and what it
#: means. docs/wire-format.md lists the same (a test compares them).
DEAD_REASONS: dict[str, str] = {
    "content-type": "content_type is not application/json",
    "content-encoding": "content_encoding is neither absent nor utf-8",
    "encoding": "the body is not UTF-8",
    "json": (
        "the body is not JSON (NaN and Infinity are not), not a JSON object, or nested"
        " too deeply"
    ),
    "wire-version": "bj-wire-version is not 1",
    "message-id": "message_id is missing",
    "type": "the type property (the task name) is missing",
    "header": (
        "a bj- or trace header has the wrong type or is not UTF-8, or the message's"
        " properties cannot be read at all (a property not UTF-8, headers nested too deeply)"
    ),
    "envelope": "a property or header value is invalid (a bad task name, a bad time,"
    " an attempt below 1, an id or key too long, a bj-priority other than high, normal"
    " or low, a bj-due-at further than the delay ladder reaches)",
    "wrong-queue": "the type property names another task than the queue's: never run",
    "schema": "the payload fails the task's model",
    "no-handler": "the worker's app has no handler for the task",
    "exhausted": "the handler failed on every attempt its retry policy allows",
    "permanent": (
        "the handler raised a permanent error: PermanentError, one of its retry policy's"
        " `permanent`, or an exception its `retry_on` leaves out"
    ),
    "crash-loop": "the job killed its worker on each delivery up to the queue's limit",
    "worker-error": (
        "processing the message failed twice in one worker with an error no rule"
        " expected (the error and traceback say which): replay it once that is fixed"
    ),
}

#: Set by RabbitMQ on a quorum queue's redeliveries (read only): how many times the
#: message was delivered and returned; the queue dead-letters it past its limit.
HEADER_DELIVERY_COUNT = "x-delivery-count"
#: RabbitMQ reserves this prefix for its own headers (x-death, x-delivery-count):
#: never part of a job, and an x-death copied into a new message can trip the
#: broker's dead-letter cycle detection.
BROKER_HEADER_PREFIX = "x-"

# Queue arguments, named once so that declare, plan and verify agree.
ARG_QUEUE_TYPE = "x-queue-type"
ARG_DEAD_LETTER_EXCHANGE = "x-dead-letter-exchange"
ARG_DEAD_LETTER_ROUTING_KEY = "x-dead-letter-routing-key"
ARG_DEAD_LETTER_STRATEGY = "x-dead-letter-strategy"
ARG_DELIVERY_LIMIT = "x-delivery-limit"
ARG_OVERFLOW = "x-overflow"
ARG_MESSAGE_TTL = "x-message-ttl"
#: Exchange argument (RabbitMQ's name has no ``x-``): where the exchange sends what
#: none of its bindings match. Checked on redeclare like a queue argument (a
#: difference is ``406 PRECONDITION_FAILED``) and, like them, fixed at creation.
ARG_ALTERNATE_EXCHANGE = "alternate-exchange"

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


def is_task_name(name: object) -> bool:
    """Whether ``name`` is a string :func:`check_task_name` accepts."""
    return (
        isinstance(name, str)
        and len(name) <= MAX_TASK_NAME_LENGTH
        and TASK_NAME_PATTERN.fullmatch(name) is not None  # match's $ lets a newline end it
    )


def check_task_name(name: str) -> str:
    """Return ``name`` if it can be a task name, else raise :class:`InvalidNameError`."""
    if not is_task_name(name):
        raise InvalidNameError(
            f"invalid task name {name!r}: use dotted words of letters, digits, '_' and '-'"
            f" (for example 'image.resize'), at most {MAX_TASK_NAME_LENGTH} characters"
        )
    return name


def check_namespace(namespace: str) -> str:
    """Return ``namespace`` if usable as a prefix, else raise :class:`InvalidNameError`."""
    if not NAMESPACE_PATTERN.fullmatch(namespace):
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
    the delay ladder ``jobs.delay.00`` ... ``jobs.delay.24`` and ``jobs.delay.out``, and
    ``jobs.unroutable`` (a fanout exchange and a queue) for what the ladder releases
    to a task that has no queue.
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

    def task_queue(self, task: str, priority: Priority = Priority.NORMAL, shard: int = 0) -> str:
        """The task's queue of ``priority`` and ``shard`` (normal, 0: the only queue of
        a task declared without priorities or shards; see :mod:`topology.lanes`)."""
        return f"{self.namespace}.task.{check_task_name(task)}{Lane(priority, shard).suffix}"

    def lane_queue(self, task: str, lane: Lane) -> str:
        return self.task_queue(task, lane.level, lane.shard)

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

    @property
    def unroutable_exchange(self) -> str:
        """The alternate exchange of :attr:`delay_out_exchange` (fanout): a delayed job
        whose task has no queue goes there at the end of the ladder, not nowhere."""
        return f"{self.namespace}.unroutable"

    @property
    def unroutable_queue(self) -> str:
        """Holds what :attr:`unroutable_exchange` receives, for an operator to see."""
        return f"{self.namespace}.unroutable"

    def routing_key(self, task: str, priority: Priority = Priority.NORMAL, shard: int = 0) -> str:
        """Routing key of a job for ``task`` (at ``priority``, to ``shard``) on the
        work exchange."""
        return check_task_name(task) + Lane(priority, shard).suffix
