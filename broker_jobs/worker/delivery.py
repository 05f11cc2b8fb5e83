"""A delivery's two views: the neutral wire form that is decoded into a job, and
aio-pika's message, made only when the per-delivery protocol needs one."""

from __future__ import annotations

import aio_pika
import aio_pika.abc
from aiormq import spec
from aiormq.abc import DeliveredMessage

from broker_jobs.envelope import WireMessage
from broker_jobs.worker.acks import ChannelAcks


def wire_message(message: aio_pika.abc.AbstractIncomingMessage) -> WireMessage:
    """The neutral form of a delivery, for :func:`~broker_jobs.envelope.decode`."""
    return properties_wire_message(message.body, message.properties)


def delivered_wire_message(delivered: DeliveredMessage) -> WireMessage:
    """:func:`wire_message` of a delivery as aiormq hands it over (no aio-pika
    message made)."""
    return properties_wire_message(delivered.body, delivered.header.properties)


def properties_wire_message(body: bytes, properties: spec.Basic.Properties) -> WireMessage:
    timestamp = properties.timestamp
    return WireMessage(
        body=body,
        message_id=properties.message_id,
        type=properties.message_type,
        content_type=properties.content_type,
        content_encoding=properties.content_encoding,
        timestamp=int(timestamp.timestamp()) if timestamp is not None else None,
        headers=dict(properties.headers or {}),
    )


class Delivery(aio_pika.IncomingMessage):
    """aio-pika's message for a delivery, with the acks of the channel it came from
    (which outlive the channel: a lost channel's deliveries are never acked)."""

    __slots__ = ("acks",)

    def __init__(self, delivered: DeliveredMessage, acks: ChannelAcks) -> None:
        super().__init__(delivered, no_ack=False)
        self.acks = acks

    @property
    def tag(self) -> int:
        return self.delivery_tag or 0
