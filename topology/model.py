"""The broker's shape as plain data: exchanges, queues and bindings of a namespace.

Built from task names alone, so that the app, a declarative file and the operator's
commands all produce the same objects; :mod:`topology.declare` puts them on a broker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from topology import names as n

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "queue_type", QueueType(self.queue_type))
        if self.delivery_limit < 1:
            raise ValueError(f"delivery_limit must be at least 1, got {self.delivery_limit}")


@dataclass(frozen=True)
class ExchangeSpec:
    name: str
    type: str
    durable: bool = True


@dataclass(frozen=True)
class QueueSpec:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    durable: bool = True


@dataclass(frozen=True)
class BindingSpec:
    exchange: str
    queue: str
    routing_key: str


@dataclass(frozen=True)
class Topology:
    """Everything a namespace needs on the broker, in declaration order."""

    exchanges: tuple[ExchangeSpec, ...]
    queues: tuple[QueueSpec, ...]
    bindings: tuple[BindingSpec, ...]


def task_queue_arguments(
    names: n.Names, task: str, options: QueueOptions
) -> dict[str, Any]:
    """Arguments of a task queue: dead-lettering to the task's dead-letter queue."""
    arguments: dict[str, Any] = {
        n.ARG_QUEUE_TYPE: options.queue_type.value,
        n.ARG_DEAD_LETTER_EXCHANGE: names.dead_letter_exchange,
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


def namespace_topology(
    names: n.Names, tasks: Iterable[tuple[str, QueueOptions]]
) -> Topology:
    """The exchanges of ``names`` and a queue plus dead-letter queue per task."""
    queues: list[QueueSpec] = []
    bindings: list[BindingSpec] = []
    for task, options in sorted(tasks, key=lambda item: item[0]):
        queue = names.task_queue(task)
        dead = names.dead_letter_queue(task)
        queues.append(QueueSpec(dead, dead_letter_queue_arguments(options)))
        queues.append(QueueSpec(queue, task_queue_arguments(names, task, options)))
        bindings.append(BindingSpec(names.work_exchange, queue, names.routing_key(task)))
        bindings.append(BindingSpec(names.dead_letter_exchange, dead, names.routing_key(task)))
    return Topology(
        exchanges=(
            ExchangeSpec(names.work_exchange, "topic"),
            ExchangeSpec(names.dead_letter_exchange, "direct"),
        ),
        queues=tuple(queues),
        bindings=tuple(bindings),
    )
