"""Every difference between a wanted exchange or queue and the broker's, learnt by
declaring it: the probe that :mod:`topology.declare` and :mod:`topology.inspect` share.

RabbitMQ answers a declaration that differs from an existing object with a bare
``406 PRECONDITION_FAILED`` naming one argument, and closes the channel. To tell the
operator every difference at once, :func:`probe` adopts the broker's value of the
named argument and declares again (which changes nothing, since the object exists),
until the broker agrees. The collected differences form a :class:`Conflict`. One
reading of the broker's messages (:func:`parse_difference`) serves both callers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import pika
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker
from pika.exchange_type import ExchangeType

from topology.errors import Conflict, Difference
from topology.model import ExchangeSpec, QueueSpec

PRECONDITION_FAILED = 406
# More arguments than any queue or exchange of ours carries; the bound stops a
# broker that keeps objecting from looping us forever.
MAX_PROBES = 16

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for (?P<kind>queue|exchange) '[^']*'"
    r" in vhost '[^']*': received (?P<received>.+?) but current is (?P<current>.+)$"
)
_TYPED_VALUE = re.compile(r"^the value '(?P<value>.*)' of type '(?P<type>[a-z]+)'$")
_INTEGER_TYPES = {"signedint", "long", "short", "byte", "unsignedint", "unsignedshort"}

Spec = TypeVar("Spec", ExchangeSpec, QueueSpec)


class Channels:
    """One open channel at a time: the broker closes a channel on every 404/406, and
    :meth:`get` opens the next."""

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


@dataclass(frozen=True)
class Kind(Generic[Spec]):
    """How to probe one kind of object: declare one, adopt a difference into one."""

    name: str  #: "exchange" or "queue", as a :class:`Conflict` says
    declare: Callable[[BlockingChannel, Spec], None]
    #: The declaration with the broker's value of one difference; None: cannot be.
    adopt: Callable[[Spec, Difference], Spec | None]


def probe(channels: Channels, kind: Kind[Spec], wanted: Spec) -> Conflict | None:
    """Declare ``wanted`` until the broker agrees, adopting its value of each argument
    it names; None when it agreed at once, else the differences found (and the
    broker's first words) as a conflict. Any other refusal than a 406 (403, 405...)
    is raised: :class:`ChannelClosedByBroker`."""
    declaration: Spec | None = wanted
    differences: list[Difference] = []
    first_message = ""
    while declaration is not None and len(differences) < MAX_PROBES:
        try:
            kind.declare(channels.get(), declaration)
        except ChannelClosedByBroker as error:
            if error.reply_code != PRECONDITION_FAILED:
                raise
            first_message = first_message or error.reply_text
            difference = parse_difference(error.reply_text)
            if difference is None or any(
                known.argument == difference.argument for known in differences
            ):
                break  # cannot learn more: report what we have and the broker's words
            differences.append(difference)
            declaration = kind.adopt(declaration, difference)
        else:
            if not differences:
                return None
            break
    return Conflict(kind.name, wanted.name, tuple(differences), first_message)


def declare_exchange(channel: BlockingChannel, exchange: ExchangeSpec) -> None:
    """One ``exchange.declare`` of ``exchange`` as specified (arguments included: the
    broker compares ``alternate-exchange`` with an existing exchange's)."""
    channel.exchange_declare(
        exchange.name,
        exchange_type=ExchangeType(exchange.type),
        durable=exchange.durable,
        arguments=dict(exchange.arguments),
    )


def declare_queue(channel: BlockingChannel, queue: QueueSpec) -> None:
    """One ``queue.declare`` of ``queue`` as specified."""
    channel.queue_declare(queue.name, durable=queue.durable, arguments=dict(queue.arguments))


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
    return replace(exchange, arguments=_adopt_argument(exchange.arguments, difference))


def adopt_queue(queue: QueueSpec, difference: Difference) -> QueueSpec:
    """``queue`` with the broker's value of one difference, to probe for the next."""
    if difference.argument == "durable":
        return replace(queue, durable=bool(difference.existing))
    return replace(queue, arguments=_adopt_argument(queue.arguments, difference))


def _adopt_argument(arguments: Mapping[str, Any], difference: Difference) -> dict[str, Any]:
    adopted = dict(arguments)
    if difference.existing is None:
        adopted.pop(difference.argument, None)
    else:
        adopted[difference.argument] = difference.existing
    return adopted


EXCHANGE: Kind[ExchangeSpec] = Kind("exchange", declare_exchange, adopt_exchange)
QUEUE: Kind[QueueSpec] = Kind("queue", declare_queue, adopt_queue)


def parse_difference(reply_text: str) -> Difference | None:
    """The difference a 406's text names (``inequivalent arg ...``); None for another."""
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
