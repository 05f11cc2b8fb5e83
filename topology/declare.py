"""Put a :class:`~topology.model.Topology` on a broker, idempotently, deleting nothing.

RabbitMQ answers a declaration that differs from an existing object with a bare
``406 PRECONDITION_FAILED`` naming one argument, and closes the channel. To tell the
operator every difference at once, :func:`declare` probes: it adopts the broker's
value of the named argument and declares again (which changes nothing, since the
object exists), until the broker agrees. The collected differences form the error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker
from pika.exchange_type import ExchangeType

from topology.errors import Conflict, Difference, TopologyConflictError
from topology.model import ExchangeSpec, QueueSpec, Topology

PRECONDITION_FAILED = 406
# More arguments than any queue or exchange of ours carries; the bound stops a
# broker that keeps objecting from looping us forever.
_MAX_PROBES = 16

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for (?P<kind>queue|exchange) '[^']*'"
    r" in vhost '[^']*': received (?P<received>.+?) but current is (?P<current>.+)$"
)
_TYPED_VALUE = re.compile(r"^the value '(?P<value>.*)' of type '(?P<type>[a-z]+)'$")
_INTEGER_TYPES = {"signedint", "long", "short", "byte", "unsignedint", "unsignedshort"}


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
    conflicts: list[Conflict] = []
    channel = connection.channel()
    for exchange in topology.exchanges:
        channel, conflict = _declare_exchange(connection, channel, exchange)
        if conflict:
            conflicts.append(conflict)
        else:
            report.exchanges.append(exchange.name)
    conflicted = {conflict.name for conflict in conflicts}
    for queue in topology.queues:
        channel, conflict = _declare_queue(connection, channel, queue)
        if conflict:
            conflicts.append(conflict)
        else:
            report.queues.append(queue.name)
    conflicted |= {conflict.name for conflict in conflicts}
    for binding in topology.bindings:
        if binding.exchange in conflicted or binding.destination in conflicted:
            continue
        if binding.to_exchange:
            channel.exchange_bind(binding.destination, binding.exchange, binding.routing_key)
        else:
            channel.queue_bind(binding.destination, binding.exchange, binding.routing_key)
        report.bindings += 1
    channel.close()
    if conflicts:
        raise TopologyConflictError(tuple(conflicts))
    return report


def _declare_exchange(
    connection: pika.BlockingConnection, channel: BlockingChannel, exchange: ExchangeSpec
) -> tuple[BlockingChannel, Conflict | None]:
    declaration: ExchangeSpec | None = exchange
    differences: list[Difference] = []
    first_message = ""
    while declaration is not None and len(differences) < _MAX_PROBES:
        try:
            declare_exchange(channel, declaration)
        except ChannelClosedByBroker as error:
            if error.reply_code != PRECONDITION_FAILED:
                raise
            channel = connection.channel()
            first_message = first_message or error.reply_text
            difference = parse_difference(error.reply_text)
            if difference is None or any(
                known.argument == difference.argument for known in differences
            ):
                break  # cannot learn more: report what we have and the broker's words
            differences.append(difference)
            declaration = adopt_exchange(declaration, difference)
        else:
            if not differences:
                return channel, None
            break
    return channel, Conflict("exchange", exchange.name, tuple(differences), first_message)


def declare_exchange(channel: BlockingChannel, exchange: ExchangeSpec) -> None:
    """One ``exchange.declare`` of ``exchange`` as specified (arguments included: the
    broker compares ``alternate-exchange`` with an existing exchange's)."""
    channel.exchange_declare(
        exchange.name,
        exchange_type=ExchangeType(exchange.type),
        durable=exchange.durable,
        arguments=dict(exchange.arguments),
    )


def adopt_exchange(exchange: ExchangeSpec, difference: Difference) -> ExchangeSpec | None:
    """``exchange`` with the broker's value of one difference, to probe for the next
    (the broker names one per refusal, the type first); None when it cannot be
    declared that way (a plugin's exchange type)."""
    if difference.argument == "type":
        try:
            return replace(exchange, type=ExchangeType(difference.existing).value)
        except ValueError:
            return None
    if difference.argument == "durable":
        return replace(exchange, durable=bool(difference.existing))
    arguments = dict(exchange.arguments)
    if difference.existing is None:
        arguments.pop(difference.argument, None)
    else:
        arguments[difference.argument] = difference.existing
    return replace(exchange, arguments=arguments)


def _declare_queue(
    connection: pika.BlockingConnection, channel: BlockingChannel, queue: QueueSpec
) -> tuple[BlockingChannel, Conflict | None]:
    arguments = dict(queue.arguments)
    durable = queue.durable
    differences: list[Difference] = []
    first_message = ""
    for _ in range(_MAX_PROBES):
        try:
            channel.queue_declare(queue.name, durable=durable, arguments=arguments)
        except ChannelClosedByBroker as error:
            if error.reply_code != PRECONDITION_FAILED:
                raise
            channel = connection.channel()
            first_message = first_message or error.reply_text
            difference = parse_difference(error.reply_text)
            if difference is None or any(
                known.argument == difference.argument for known in differences
            ):
                break  # cannot learn more: report what we have and the broker's words
            differences.append(difference)
            if difference.argument == "durable":
                durable = bool(difference.existing)
            elif difference.existing is None:
                arguments.pop(difference.argument, None)
            else:
                arguments[difference.argument] = difference.existing
        else:
            if not differences:
                return channel, None
            break
    return channel, Conflict("queue", queue.name, tuple(differences), first_message)


def parse_difference(reply_text: str) -> Difference | None:
    match = _INEQUIVALENT.search(reply_text)
    if not match:
        return None
    return Difference(
        argument=match["argument"],
        wanted=_parse_value(match["received"]),
        existing=_parse_value(match["current"]),
    )


def _parse_value(text: str) -> Any:  # noqa: PLR0911 - one return per printed form
    """Read a value as RabbitMQ prints it in an ``inequivalent arg`` message."""
    text = text.strip()
    if text == "none":
        return None
    typed = _TYPED_VALUE.match(text)
    if typed:
        if typed["type"] in _INTEGER_TYPES:
            return int(typed["value"])
        if typed["type"] == "bool":
            return typed["value"] == "true"
        return typed["value"]
    if len(text) >= 2 and text[0] == text[-1] == "'":
        text = text[1:-1]  # RabbitMQ quotes numbers and booleans alike: '10', 'true'
    if text in {"true", "false"}:
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return text
