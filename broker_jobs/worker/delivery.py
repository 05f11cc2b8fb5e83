"""A delivery's two views: the neutral wire form that is decoded into a job, and
aio-pika's message, made only when the per-delivery protocol needs one."""

from __future__ import annotations

import aio_pika
import aio_pika.abc
from aiormq import spec
from aiormq.abc import DeliveredMessage

from broker_jobs.envelope import Job, WireMessage, decode
from broker_jobs.errors import BrokerJobsError, DecodeError
from broker_jobs.worker.acks import ChannelAcks
from broker_jobs.worker.frame_reading import UNREADABLE_PROPERTIES
from topology.lanes import lane_of_routing_key


class WrongQueueError(BrokerJobsError):
    """A message whose type names another task than the queue it came from. A queue's
    messages only ever run its own task: permission to publish to one task must not
    give a way to run another."""

    def __init__(self, named: str) -> None:
        self.named = named
        super().__init__(f"the message names task {named!r}")

    def explain(self, queue_task: str) -> str:
        return (
            f"the message's type is {self.named!r} but it arrived in the queue of task"
            f" {queue_task!r}: a queue's messages only run its own task (publish it with"
            f" routing key {self.named!r}, or fix its type property)"
        )


def decode_for_queue(message: WireMessage, queue_task: str, routing_key: str | None) -> Job:
    """The job in a delivery from ``queue_task``'s queue: :class:`DecodeError` if it is
    not a valid job, :class:`WrongQueueError` if it names another task. Its priority
    is the level of the queue it came from (``routing_key`` names it), whatever its
    ``bj-priority`` header says: its retries go back to that queue, which exists."""
    unreadable = message.headers.get(UNREADABLE_PROPERTIES)
    if unreadable is not None:
        raise DecodeError("header", str(unreadable))
    job = decode(message)
    if job.task != queue_task:
        raise WrongQueueError(job.task)
    level = lane_of_routing_key(routing_key).level
    if job.priority is not level:
        job = job.copy(priority=level)
    return job


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

    __slots__ = ("acks", "task")

    def __init__(self, delivered: DeliveredMessage, acks: ChannelAcks, task: str = "") -> None:
        super().__init__(delivered, no_ack=False)
        self.acks = acks
        #: The task of the queue it came from ("": not known, as in the memory worker).
        self.task = task

    @property
    def tag(self) -> int:
        return self.delivery_tag or 0
