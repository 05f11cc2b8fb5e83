"""Everything a namespace needs on the broker, assembled from its parts."""

from __future__ import annotations

from collections.abc import Iterable

from topology import delay
from topology.model import (
    BindingSpec,
    ExchangeSpec,
    QueueOptions,
    QueueSpec,
    QueueType,
    Topology,
    dead_letter_queue_arguments,
    task_queue_arguments,
)
from topology.names import Names


def namespace_topology(
    names: Names,
    tasks: Iterable[tuple[str, QueueOptions]],
    *,
    ladder: bool = True,
    ladder_queue_type: QueueType = QueueType.QUORUM,
) -> Topology:
    """The work and dead-letter exchanges, a queue and a dead-letter queue per task,
    each task queue bound for delayed delivery, and (``ladder``) the delay ladder."""
    tasks = sorted(tasks, key=lambda item: item[0])
    topology = Topology(
        exchanges=(
            ExchangeSpec(names.work_exchange, "topic"),
            ExchangeSpec(names.dead_letter_exchange, "direct"),
            delay.out_exchange(names),
        )
    )
    for task, options in tasks:
        topology += task_topology(names, task, options)
    if ladder:
        topology += ladder_topology(names, ladder_queue_type)
    return topology


def task_topology(names: Names, task: str, options: QueueOptions) -> Topology:
    """One task's queues and bindings (its exchanges belong to the namespace): a
    queue per priority level when it has priorities, one dead-letter queue."""
    dead = names.dead_letter_queue(task)
    queues = [QueueSpec(dead, dead_letter_queue_arguments(options))]
    bindings = [BindingSpec(names.dead_letter_exchange, dead, names.routing_key(task))]
    for lane in options.lanes:
        queue = names.lane_queue(task, lane)
        key = names.routing_key(task, lane.level, lane.shard)
        queues.append(QueueSpec(queue, task_queue_arguments(names, task, options)))
        bindings.append(BindingSpec(names.work_exchange, queue, key))
        bindings.append(
            BindingSpec(names.delay_out_exchange, queue, delay.delivery_binding_key(task, lane))
        )
    return Topology(queues=tuple(queues), bindings=tuple(bindings))


def ladder_topology(names: Names, queue_type: QueueType = QueueType.QUORUM) -> Topology:
    exchanges, queues, bindings = delay.ladder(names, queue_type)
    return Topology(exchanges, queues, bindings)
