"""Put a :class:`~topology.model.Topology` on a broker, idempotently, deleting nothing.

An object that exists with other settings is not changed: :func:`declare` learns
every difference at once by probing (:mod:`topology.probe`: it adopts the broker's
value of the argument a ``406 PRECONDITION_FAILED`` names and declares again, which
changes nothing, until the broker agrees), declares everything else, and raises the
collected differences as one :class:`TopologyConflictError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pika

from topology.errors import Conflict, TopologyConflictError
from topology.model import Topology
from topology.probe import EXCHANGE, QUEUE, Channels, Kind, Spec, probe


@dataclass
class DeclareReport:
    """What :func:`declare` did; conflicts are raised, not reported."""

    exchanges: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    bindings: int = 0


def declare(connection: pika.BlockingConnection, topology: Topology) -> DeclareReport:
    """Declare every object of ``topology``; raise :class:`TopologyConflictError` after
    declaring all that does not conflict, listing every conflicting object."""
    report = DeclareReport()
    channels = Channels(connection)
    conflicts = _declare_each(channels, EXCHANGE, topology.exchanges, report.exchanges)
    conflicts += _declare_each(channels, QUEUE, topology.queues, report.queues)
    conflicted = {conflict.name for conflict in conflicts}
    for binding in topology.bindings:
        if binding.exchange in conflicted or binding.destination in conflicted:
            continue
        channel = channels.get()
        if binding.to_exchange:
            channel.exchange_bind(binding.destination, binding.exchange, binding.routing_key)
        else:
            channel.queue_bind(binding.destination, binding.exchange, binding.routing_key)
        report.bindings += 1
    channels.close()
    if conflicts:
        raise TopologyConflictError(tuple(conflicts))
    return report


def _declare_each(
    channels: Channels, kind: Kind[Spec], specs: Iterable[Spec], declared: list[str]
) -> list[Conflict]:
    """Declare each of ``specs``; the conflicting ones' conflicts, the others' names
    added to ``declared``."""
    conflicts = []
    for spec in specs:
        conflict = probe(channels, kind, spec)
        if conflict:
            conflicts.append(conflict)
        else:
            declared.append(spec.name)
    return conflicts
