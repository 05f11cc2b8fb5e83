"""Compare a :class:`~topology.model.Topology` with the broker without changing it.

Existence is learnt with passive declares, which create nothing (and, measured on
RabbitMQ 3.10, need no permission at all). A passive declare ignores arguments,
so for an object that exists we declare it again with the wanted settings: on an
existing object that is a no-op when they agree and ``406 PRECONDITION_FAILED``
naming one differing argument when they do not. Like :mod:`topology.declare`, we
then adopt the broker's value and declare again until it agrees, collecting every
difference (:mod:`topology.probe`). Nothing that is missing is ever declared.

Caveats, both inherent to AMQP 0-9-1:

- bindings cannot be listed without the management plugin, so they are reported
  as re-declared by ``apply`` (idempotent), not as in sync or missing;
- an object deleted by someone else between the passive check and the probe would
  be re-created by the probe (with the wanted settings, as ``apply`` would).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import pika
from pika.exceptions import ChannelClosedByBroker

from topology.errors import Conflict
from topology.model import BindingSpec, ExchangeSpec, QueueSpec, Topology
from topology.names import ARG_QUEUE_TYPE
from topology.probe import EXCHANGE, QUEUE, Channels, Kind, Spec, probe

NOT_FOUND = 404
ACCESS_REFUSED = 403


class Status(StrEnum):
    IN_SYNC = "in sync"
    MISSING = "missing, to create"
    CONFLICT = "conflict"
    #: The user may not re-declare (no configure permission): existence only.
    UNCHECKED = "exists, settings not checked (no configure permission)"


class BindingStatus(StrEnum):
    CREATE = "to create with their exchange or queue"
    REDECLARE = "to re-declare (idempotent: AMQP cannot list bindings to compare)"
    BLOCKED = "blocked by a conflict"


@dataclass(frozen=True)
class ObjectState:
    kind: str  # "exchange" or "queue"
    name: str
    status: Status
    detail: str  # exchange type or queue type, for the listing
    conflict: Conflict | None = None


@dataclass(frozen=True)
class BindingState:
    binding: BindingSpec
    status: BindingStatus


@dataclass(frozen=True)
class Inspection:
    """The broker's state of each wanted object, in the topology's order."""

    objects: tuple[ObjectState, ...]
    bindings: tuple[BindingState, ...]

    def having(self, status: Status) -> tuple[ObjectState, ...]:
        return tuple(state for state in self.objects if state.status is status)

    def bindings_having(self, status: BindingStatus) -> tuple[BindingState, ...]:
        return tuple(state for state in self.bindings if state.status is status)

    @property
    def conflicts(self) -> tuple[Conflict, ...]:
        return tuple(state.conflict for state in self.objects if state.conflict)

    @property
    def in_sync(self) -> bool:
        """Every exchange and queue exists without a known difference."""
        return not self.having(Status.MISSING) and not self.having(Status.CONFLICT)


def inspect_topology(connection: pika.BlockingConnection, topology: Topology) -> Inspection:
    """The state of every object of ``topology`` on the broker; changes nothing."""
    channels = Channels(connection)
    states = [_state(channels, EXCHANGE, spec, spec.type) for spec in topology.exchanges]
    states += [_state(channels, QUEUE, spec, _queue_type(spec)) for spec in topology.queues]
    channels.close()
    by_name = {(state.kind, state.name): state.status for state in states}
    bindings = tuple(
        BindingState(binding, _binding_status(binding, by_name)) for binding in topology.bindings
    )
    return Inspection(tuple(states), bindings)


def _state(channels: Channels, kind: Kind[Spec], spec: Spec, detail: str) -> ObjectState:
    """The broker's state of one exchange or queue: a passive declare for existence,
    then (it exists: declaring it again cannot create it) the probe for differences
    (of an exchange: type, durability or alternate exchange, one per declare, the
    type first; measured on RabbitMQ 3.10, an alternate exchange added, removed or
    changed is a 406 too)."""

    def state(status: Status, conflict: Conflict | None = None) -> ObjectState:
        return ObjectState(kind.name, spec.name, status, detail, conflict)

    try:
        if isinstance(spec, ExchangeSpec):
            channels.get().exchange_declare(spec.name, passive=True)
        else:
            channels.get().queue_declare(spec.name, passive=True)
    except ChannelClosedByBroker as error:
        if error.reply_code == NOT_FOUND:
            return state(Status.MISSING)
        # 405 RESOURCE_LOCKED: an exclusive queue of another connection
        return state(Status.CONFLICT, _unexplained(kind.name, spec.name, error))
    try:
        conflict = probe(channels, kind, spec)
    except ChannelClosedByBroker as error:
        if error.reply_code == ACCESS_REFUSED:
            return state(Status.UNCHECKED)
        return state(Status.CONFLICT, _unexplained(kind.name, spec.name, error))
    return state(Status.IN_SYNC) if conflict is None else state(Status.CONFLICT, conflict)


def _queue_type(spec: QueueSpec) -> str:
    return str(spec.arguments.get(ARG_QUEUE_TYPE, "classic"))


def _unexplained(kind: str, name: str, error: ChannelClosedByBroker) -> Conflict:
    """A refusal we cannot break down into arguments: keep the broker's words."""
    return Conflict(kind, name, (), f"{error.reply_code} {error.reply_text}")


def _binding_status(
    binding: BindingSpec, states: Mapping[tuple[str, str], Status]
) -> BindingStatus:
    ends = [
        states.get(("exchange", binding.exchange)),
        states.get(("exchange" if binding.to_exchange else "queue", binding.destination)),
    ]
    if Status.CONFLICT in ends:
        return BindingStatus.BLOCKED  # topology.declare skips these bindings
    if Status.MISSING in ends:
        return BindingStatus.CREATE
    return BindingStatus.REDECLARE
