"""The delay ladder: delayed jobs held by RabbitMQ itself, without a plugin.

Level ``k`` (0 <= k < :data:`DELAY_LEVELS`) is an exchange and a queue, both named
``<ns>.delay.<kk>``. The queue holds every message for exactly ``2**k`` seconds (a
queue-wide TTL, so its head is always the next to expire and a long delay never
blocks a short one), then dead-letters it to level ``k - 1``; level 0 dead-letters
to ``<ns>.delay.out``, where each task queue is bound.

What ``<ns>.delay.out`` cannot route (a job for a task that has no queue: the
publishing page cannot stop a publisher from sending one) goes to its alternate
exchange ``<ns>.unroutable``, a fanout bound to the queue ``<ns>.unroutable``, and
waits there for an operator instead of vanishing. A job leaves the ladder long
after its publisher's confirm, so ``mandatory`` cannot report it; and the work
exchange has no alternate exchange, since one would swallow the ``basic.return``
that publishers rely on there.

A delayed job's routing key spells its delay in binary, most significant level
first, then the task name: 13 s is ``0.….0.1.1.0.1.image.resize`` (25 digits). Level
``k``'s exchange sends a key whose digit ``k`` is 1 into its queue, and one whose digit
is 0 straight on to level ``k - 1``'s exchange, so a job waits only in the levels of
its set bits. A job is published to the level of its highest set bit (publishing to
the top level works too, but costs the broker a routing step per level above). The
ladder is a fixed set of objects per namespace, whatever the load: 27 exchanges,
26 queues, 51 bindings (the levels, the out exchange and the unroutable pair), plus
one binding per task on the out exchange.

Whole seconds go through the ladder; the job leaves it :data:`EARLY_MARGIN` early
(each hop adds a few milliseconds of lateness, which the margin absorbs) and the
consumer waits out the rest from the ``bj-due-at`` header: at most :data:`MAX_HOLD`.

Each level counts its time from the job's arrival in it, so a broker outage during
which a job's next hop fell due makes that job late by up to the outage's length
(docs/wire-format.md gives the measured bound).
"""

from __future__ import annotations

import math
import re
from typing import Any

from topology import names as n
from topology.lanes import ONLY_LANE, Lane
from topology.model import BindingSpec, ExchangeSpec, QueueSpec, QueueType, Topology

#: Levels of the ladder; level k holds 2**k seconds.
DELAY_LEVELS = 25
#: Seconds held by level 0.
DELAY_UNIT = 1.0
#: Seconds before its due time that a job leaves the ladder. A hop through a quorum
#: queue is 2-6 ms late (measured on RabbitMQ 3.10), so even the 25 hops of a
#: year-long delay arrive before the due time.
EARLY_MARGIN = 0.2
#: The longest delay the ladder can hold: about 388 days.
MAX_DELAY = (2**DELAY_LEVELS - 1) * DELAY_UNIT + EARLY_MARGIN
#: The longest a consumer holds a job before its due time: the remainder under one
#: unit plus the margin. Far below RabbitMQ's consumer_timeout (30 min by default).
MAX_HOLD = DELAY_UNIT + EARLY_MARGIN


def ladder_units(delay: float) -> int:
    """Whole units a job of ``delay`` seconds spends in the ladder (0: none)."""
    return max(0, math.floor((delay - EARLY_MARGIN) / DELAY_UNIT))


def delay_routing_key(units: int, task: str, lane: Lane = ONLY_LANE) -> str:
    """The routing key for ``units`` in the ladder, most significant level first, then
    the task's routing key (with its lane's suffix: priority level, shard)."""
    if not 0 <= units < 2**DELAY_LEVELS:
        raise ValueError(f"{units} units do not fit in {DELAY_LEVELS} levels")
    digits = format(units, f"0{DELAY_LEVELS}b")
    return ".".join(digits) + "." + n.check_task_name(task) + lane.suffix


def released_key(ladder_key: str) -> str | None:
    """Where ``<ns>.delay.out`` sends a job of ``ladder_key``: its key on the work
    exchange (the task and its lane's suffix, after the 25 digits). None when
    ``ladder_key`` is not a ladder key or names no task."""
    parts = ladder_key.split(".", DELAY_LEVELS)
    if len(parts) <= DELAY_LEVELS or any(digit not in ("0", "1") for digit in parts[:-1]):
        return None
    key = parts[-1]
    return key if n.is_task_name(re.split("[@:]", key, maxsplit=1)[0]) else None


def delivery_binding_key(task: str, lane: Lane = ONLY_LANE) -> str:
    """Binding of a task queue on the out exchange: any digits, then the task."""
    return "*." * DELAY_LEVELS + n.check_task_name(task) + lane.suffix


def entry_exchange(names: n.Names, units: int) -> str:
    """Where a job of ``units`` enters the ladder: the level of its highest set bit.

    Entering at the top would route every job down through up to 25 exchanges on
    the publishing channel (about 4 ms of broker CPU each, measured on 3.10): that
    caps a channel near 200 delayed jobs/s and eats the early margin under load.
    The higher levels would only pass it on, since their digits are 0.
    """
    if units < 1:
        raise ValueError("a job enters the ladder only for one unit or more")
    return names.delay_exchange(units.bit_length() - 1)


def out_exchange(names: n.Names) -> ExchangeSpec:
    """``<ns>.delay.out``, with :func:`unroutable` as its alternate exchange. It belongs
    to the namespace (task queues bind to it even before the ladder exists); an
    alternate exchange that does not exist yet routes nothing, as before."""
    return ExchangeSpec(
        names.delay_out_exchange,
        "topic",
        arguments={n.ARG_ALTERNATE_EXCHANGE: names.unroutable_exchange},
    )


def unroutable(names: n.Names, queue_type: QueueType = QueueType.QUORUM) -> Topology:
    """Where the out exchange sends a job it cannot route: a fanout exchange and a
    queue, both ``<ns>.unroutable``. The queue has no TTL and no dead-lettering: its
    jobs stay until an operator moves or deletes them. Quorum like the ladder, so that
    what a quorum ladder kept through a crash is not lost on its last step."""
    exchange = names.unroutable_exchange
    queue = names.unroutable_queue
    return Topology(
        exchanges=(ExchangeSpec(exchange, "fanout"),),
        queues=(QueueSpec(queue, {n.ARG_QUEUE_TYPE: queue_type.value}),),
        bindings=(BindingSpec(exchange, queue, ""),),
    )


def ladder(
    names: n.Names, queue_type: QueueType = QueueType.QUORUM
) -> tuple[tuple[ExchangeSpec, ...], tuple[QueueSpec, ...], tuple[BindingSpec, ...]]:
    """The ladder's levels and :func:`unroutable`: exchanges, queues and bindings. The
    out exchange and the per-task bindings on it belong to the namespace and the
    tasks."""
    exchanges: list[ExchangeSpec] = []
    queues: list[QueueSpec] = []
    bindings: list[BindingSpec] = []
    for level in range(DELAY_LEVELS):
        here = names.delay_exchange(level)
        below = names.delay_exchange(level - 1) if level else names.delay_out_exchange
        prefix = "*." * (DELAY_LEVELS - 1 - level)
        exchanges.append(ExchangeSpec(here, "topic"))
        arguments = _level_arguments(level, below, queue_type)
        queues.append(QueueSpec(names.delay_queue(level), arguments))
        bindings.append(BindingSpec(here, names.delay_queue(level), prefix + "1.#"))
        bindings.append(BindingSpec(here, below, prefix + "0.#", to_exchange=True))
    lost = unroutable(names, queue_type)
    return (
        tuple(exchanges) + lost.exchanges,
        tuple(queues) + lost.queues,
        tuple(bindings) + lost.bindings,
    )


def _level_arguments(level: int, below: str, queue_type: QueueType) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        n.ARG_QUEUE_TYPE: queue_type.value,
        n.ARG_MESSAGE_TTL: int(2**level * DELAY_UNIT * 1000),
        n.ARG_DEAD_LETTER_EXCHANGE: below,
    }
    if queue_type is QueueType.QUORUM:
        # Expired messages move on only once the next level has them: a crash or
        # restart between two levels loses nothing.
        arguments[n.ARG_DEAD_LETTER_STRATEGY] = "at-least-once"
        arguments[n.ARG_OVERFLOW] = "reject-publish"
    return arguments
