"""Compare a :class:`~topology.model.Topology` with the broker without changing it.

Existence is learnt with passive declares, which create nothing (and, measured on
RabbitMQ 3.10, need no permission at all). A passive declare ignores arguments,
so for an object that exists we declare it again with the wanted settings: on an
existing object that is a no-op when they agree and ``406 PRECONDITION_FAILED``
naming one differing argument when they do not. Like :mod:`topology.declare`, we
then adopt the broker's value and declare again until it agrees, collecting every
difference. Nothing that is missing is ever declared.

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
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker

# The 406 parser is private to declare.py; sharing it keeps one reading of the
# broker's messages (a public name there is proposed to its owner).
from topology.declare import (
    PRECONDITION_FAILED,
    adopt_exchange,
    declare_exchange,
    parse_difference,
)
from topology.errors import Conflict, Difference
from topology.model import BindingSpec, ExchangeSpec, QueueSpec, Topology
from topology.names import ARG_QUEUE_TYPE

NOT_FOUND = 404
ACCESS_REFUSED = 403
#: Bound on probe rounds per queue, as in declare.py: more than any queue's arguments.
_MAX_PROBES = 16


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
    channels = _Channels(connection)
    states = [_exchange_state(channels, spec) for spec in topology.exchanges]
    states += [_queue_state(channels, spec) for spec in topology.queues]
    channels.close()
    by_name = {(state.kind, state.name): state.status for state in states}
    bindings = tuple(
        BindingState(binding, _binding_status(binding, by_name)) for binding in topology.bindings
    )
    return Inspection(tuple(states), bindings)


class _Channels:
    """One open channel at a time: the broker closes a channel on every 404/406."""

    def __init__(self, connection: pika.BlockingConnection) -> None:
        self._connection = connection
        self._channel: BlockingChannel | None = None

    def get(self) -> BlockingChannel:
        if self._channel is None or not self._channel.is_open:
            self._channel = self._connection.channel()
        return self._channel

    def close(self) -> None:
        if self._channel is not None and self._channel.is_open:
            self._channel.close()


def _exchange_state(channels: _Channels, spec: ExchangeSpec) -> ObjectState:
    def state(status: Status, conflict: Conflict | None = None) -> ObjectState:
        return ObjectState("exchange", spec.name, status, spec.type, conflict)

    try:
        channels.get().exchange_declare(spec.name, passive=True)
    except ChannelClosedByBroker as error:
        if error.reply_code == NOT_FOUND:
            return state(Status.MISSING)
        return state(Status.CONFLICT, _unexplained("exchange", spec.name, error))
    # Exists: declaring it again cannot create it, and reports a difference of type,
    # durability or alternate exchange, one per declare, the type first (measured on
    # RabbitMQ 3.10: an alternate exchange added, removed or changed is a 406 too).
    declaration: ExchangeSpec | None = spec
    differences: list[Difference] = []
    first_message = ""
    while declaration is not None and len(differences) < _MAX_PROBES:
        try:
            declare_exchange(channels.get(), declaration)
        except ChannelClosedByBroker as error:
            if error.reply_code == ACCESS_REFUSED:
                return state(Status.UNCHECKED)
            if error.reply_code != PRECONDITION_FAILED:
                return state(Status.CONFLICT, _unexplained("exchange", spec.name, error))
            first_message = first_message or error.reply_text
            difference = parse_difference(error.reply_text)
            if difference is None or _known(difference, differences):
                break  # cannot learn more: report what we have and the broker's words
            differences.append(difference)
            declaration = adopt_exchange(declaration, difference)
        else:
            if not differences:
                return state(Status.IN_SYNC)
            break
    conflict = Conflict("exchange", spec.name, tuple(differences), first_message)
    return state(Status.CONFLICT, conflict)


def _queue_state(channels: _Channels, spec: QueueSpec) -> ObjectState:
    try:
        channels.get().queue_declare(spec.name, passive=True)
    except ChannelClosedByBroker as error:
        if error.reply_code == NOT_FOUND:
            status, conflict = Status.MISSING, None
        else:  # 405 RESOURCE_LOCKED: an exclusive queue of another connection
            status, conflict = Status.CONFLICT, _unexplained("queue", spec.name, error)
    else:
        status, conflict = _probe_queue(channels, spec)
    detail = str(spec.arguments.get(ARG_QUEUE_TYPE, "classic"))
    return ObjectState("queue", spec.name, status, detail, conflict)


def _probe_queue(channels: _Channels, spec: QueueSpec) -> tuple[Status, Conflict | None]:
    """Re-declare the existing queue, adopting each argument the broker names."""
    arguments: dict[str, Any] = dict(spec.arguments)
    durable = spec.durable
    differences: list[Difference] = []
    first_message = ""
    for _ in range(_MAX_PROBES):
        try:
            channels.get().queue_declare(spec.name, durable=durable, arguments=arguments)
        except ChannelClosedByBroker as error:
            if error.reply_code == ACCESS_REFUSED:
                return Status.UNCHECKED, None
            if error.reply_code != PRECONDITION_FAILED:
                return Status.CONFLICT, _unexplained("queue", spec.name, error)
            first_message = first_message or error.reply_text
            difference = parse_difference(error.reply_text)
            if difference is None or _known(difference, differences):
                break  # cannot learn more: report what we have and the broker's words
            differences.append(difference)
            durable, arguments = _adopt(difference, durable, arguments)
        else:
            if not differences:
                return Status.IN_SYNC, None
            break
    return Status.CONFLICT, Conflict("queue", spec.name, tuple(differences), first_message)


def _adopt(
    difference: Difference, durable: bool, arguments: dict[str, Any]
) -> tuple[bool, dict[str, Any]]:
    """The declaration with the broker's value of one argument."""
    if difference.argument == "durable":
        return bool(difference.existing), arguments
    arguments = dict(arguments)
    if difference.existing is None:
        arguments.pop(difference.argument, None)
    else:
        arguments[difference.argument] = difference.existing
    return durable, arguments


def _known(difference: Difference, differences: list[Difference]) -> bool:
    return any(known.argument == difference.argument for known in differences)


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
