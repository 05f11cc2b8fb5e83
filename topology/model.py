"""The broker's shape as plain data: exchanges, queues and bindings of a namespace.

Built from task names alone, so that the app, a declarative file and the operator's
commands all produce the same objects; :mod:`topology.declare` puts them on a broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from topology import names as n
from topology.lanes import Lane, check_shards, task_lanes
from topology.priority import Priority, PriorityPolicy

#: Redeliveries of one message before a quorum queue dead-letters it. A job that
#: crashes its worker every time (segfault, OOM kill) stops here instead of looping;
#: retries decided by the worker are new messages and do not count.
DEFAULT_DELIVERY_LIMIT = 10


class QueueType(StrEnum):
    """Quorum queues are replicated and enforce a delivery limit; classic are neither."""

    QUORUM = "quorum"
    CLASSIC = "classic"


@dataclass(frozen=True)
class QueueOptions:
    """How a task's queue is declared. The defaults suit most tasks."""

    queue_type: QueueType = QueueType.QUORUM
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT
    #: None: one queue. A policy (or ``"strict"``, ``"6:3:1"``): a queue per priority
    #: level, picked between by the worker so (:mod:`topology.priority`).
    priorities: PriorityPolicy | None = None
    #: Queues per level, a job going to the shard of its key (:mod:`topology.lanes`):
    #: one hot task spread over several queues, led by several nodes.
    shards: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "queue_type", QueueType(self.queue_type))
        if self.priorities is not None:
            object.__setattr__(self, "priorities", PriorityPolicy.parse(self.priorities))
        check_shards(self.shards)
        if self.delivery_limit < 1:
            raise ValueError(f"delivery_limit must be at least 1, got {self.delivery_limit}")

    @property
    def lanes(self) -> tuple[Lane, ...]:
        """The task's queues: each priority level's (if any), each shard's."""
        levels = tuple(Priority) if self.priorities is not None else (Priority.NORMAL,)
        return task_lanes(levels, self.shards)


@dataclass(frozen=True)
class ExchangeSpec:
    """An exchange; ``arguments`` are fixed at creation, like a queue's (the only one
    RabbitMQ compares on redeclare is ``alternate-exchange``)."""

    name: str
    type: str
    durable: bool = True
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueSpec:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    durable: bool = True


@dataclass(frozen=True)
class BindingSpec:
    """Messages published to ``exchange`` with a matching key go to ``destination``,
    a queue or (``to_exchange``) another exchange."""

    exchange: str
    destination: str
    routing_key: str
    to_exchange: bool = False


@dataclass(frozen=True)
class Topology:
    """Everything a namespace needs on the broker, in declaration order."""

    exchanges: tuple[ExchangeSpec, ...] = ()
    queues: tuple[QueueSpec, ...] = ()
    bindings: tuple[BindingSpec, ...] = ()

    def __add__(self, other: Topology) -> Topology:
        return Topology(
            self.exchanges + other.exchanges,
            self.queues + other.queues,
            self.bindings + other.bindings,
        )


def task_queue_arguments(names: n.Names, task: str, options: QueueOptions) -> dict[str, Any]:
    """Arguments of a task queue: dead-lettering to the task's dead-letter queue."""
    arguments: dict[str, Any] = {
        n.ARG_QUEUE_TYPE: options.queue_type.value,
        n.ARG_DEAD_LETTER_EXCHANGE: names.dead_letter_exchange,
        # Every level's queue dead-letters to the task's one dead-letter queue.
        n.ARG_DEAD_LETTER_ROUTING_KEY: names.routing_key(task),
    }
    if options.queue_type is QueueType.QUORUM:
        arguments[n.ARG_DELIVERY_LIMIT] = options.delivery_limit
        # At-least-once dead-lettering keeps a message until the dead-letter queue
        # confirms it; RabbitMQ silently falls back to at-most-once unless the queue
        # rejects publishes on overflow instead of dropping its head.
        arguments[n.ARG_DEAD_LETTER_STRATEGY] = "at-least-once"
        arguments[n.ARG_OVERFLOW] = "reject-publish"
    return arguments


def dead_letter_queue_arguments(options: QueueOptions) -> dict[str, Any]:
    return {n.ARG_QUEUE_TYPE: options.queue_type.value}
