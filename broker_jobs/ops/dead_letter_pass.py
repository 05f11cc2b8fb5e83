"""One pass over a dead-letter queue: every message read, none lost, the order kept.

Every operation of :class:`~broker_jobs.ops.dead_letters.DeadLetterQueues` (list,
replay, purge with a filter) is such a pass; this module is the broker's side of it,
and of the queues' depth and purge (:func:`translated` words pika's errors).

**Reading loses nothing and keeps the order.** A pass over a queue takes its
depth, then gets that many messages one by one (``basic.get``). A message the
operation takes (a replayed or purged one) is acked; every other one is *moved to
the back*: a copy is published to the queue (through the default exchange, so to
that queue alone) and, once the broker confirmed the copy, the original is acked.
After the whole pass the queue holds the kept dead letters in the order they were
(a dead letter arriving meanwhile lands among them, in its arrival order).

Giving the messages back instead (a reject with requeue, or closing the channel)
does not keep the order of a quorum queue: measured on RabbitMQ 3.10.8, 40
messages read unacked came back in a scrambled order after a channel close, and
rotated after rejects in order (a classic queue kept the order both ways). Each
giving back also counts as a delivery (``x-delivery-count``), and a quorum queue of
RabbitMQ 4.0 to 4.2 has a default delivery limit of 20 that would drop a dead letter
(a dead-letter queue has no dead-letter exchange) after as many reads. A moved copy
starts with no count. The cost: a pass writes every message once, and an operation
killed midway leaves at most one dead letter twice in the queue (its copy
confirmed, the original not acked yet: the connection's end returns the original,
out of its place). Nothing is lost, and a dead letter in the queue twice is
harmless: a replay of both runs the job once (``broker_jobs.ops.dead_letters``).

**A pass takes no message while the broker confirms nothing.** A message taken
while the broker blocks publishes (a memory or disk alarm, a node still starting)
goes back to the queue when the pass fails, and that counts as a delivery too: an
operator reading the dead letters again and again through an alarm would drop one
at the limit. So before its first ``basic.get`` a pass publishes two probes that no
queue takes (:func:`probe_publishing`) and goes on only once the broker answered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pika.adapters.blocking_connection
import pika.exceptions

from broker_jobs.envelope import WireMessage
from broker_jobs.errors import (
    AccessRefusedError,
    BrokerConnectionError,
    BrokerJobsError,
    TopologyMissingError,
)
from broker_jobs.ops.dead_letter_message import DeadLetter, moved_message, read_dead_letter
from broker_jobs.publish.pika_link import Delivery, PikaLink
from broker_jobs.urls import mask_text

Channel = pika.adapters.blocking_connection.BlockingChannel
#: Told each dead letter of a pass, and the link the pass publishes on: True takes it
#: (it is acked), False keeps it (it moves to the back).
Visit = Callable[[DeadLetter, PikaLink], bool]
#: AMQP reply code for a queue or exchange that does not exist.
NOT_FOUND = 404
#: AMQP reply code for an operation the user's permissions do not allow.
ACCESS_REFUSED = 403
#: The probes' routing key. Through the default exchange it names a queue that cannot
#: exist (a client may not declare a name that begins with ``amq.``); through the
#: work exchange it matches no binding (``@`` is in no task name).
PROBE_KEY = "amq.broker-jobs@probe"


def one_pass(
    channel: Channel,
    *,
    task: str | None,
    queue: str,
    link: PikaLink,
    timeout: float,
    visit: Visit,
    going_on: Callable[[], bool] = lambda: True,
    back_through: str = "",
    probe_through: str = "",
) -> None:
    """Every message of ``task``'s dead-letter ``queue``, as deep as it was at the start:
    ``visit`` True acks it (taken); False moves it to the back (kept), so after the
    whole pass the kept ones are in the order they were. Closes ``channel``.

    ``task`` None: a queue of no one task (``<ns>.unroutable``), whose messages are
    read with the routing key they came with as their task; give ``back_through``
    then, an exchange that routes to ``queue`` alone whatever the key (a fanout), so
    that a kept message keeps its key (through the default exchange, its key would
    be the queue's name). ``going_on`` False ends the pass before the next message
    (a stopping worker's). The probes (:func:`probe_publishing`) go through
    ``probe_through``, an exchange the pass may publish to that does not route
    :data:`PROBE_KEY` to ``queue``."""
    mover = _Mover(link, channel, queue, timeout, back_through)
    try:
        # Only the depth at the start: what arrives meanwhile (the copies among
        # it) waits for the next pass.
        depth = depth_of(channel, queue)
        if depth:
            probe_publishing(link, probe_through, timeout, before=f"reading {queue}")
        for _ in range(depth):
            if not going_on():
                break
            method, properties, body = channel.basic_get(queue, auto_ack=False)
            if method is None or method.delivery_tag is None or properties is None:
                break  # emptied meanwhile (another client took some)
            key = method.routing_key or ""
            letter = read_dead_letter(key if task is None else task, properties, _bytes(body))
            if visit(letter, link):
                channel.basic_ack(method.delivery_tag)
            else:
                mover.keep(method.delivery_tag, letter, key)
    finally:
        close_channel(channel)  # what is still unacked goes back to the queue


@dataclass
class _Mover:
    """Moves kept dead letters to the back of their queue: a copy is published and
    confirmed, then the original is acked at once. Returning a message instead (a
    reject, a channel close) does not keep the order of a quorum queue, and neither
    did acking many ``basic.get`` deliveries late: on RabbitMQ 3.10.8, 40 gets acked
    after the pass left 7 unacked (back in the queue, twice); acked one by one, none."""

    link: PikaLink
    channel: Channel
    queue: str
    timeout: float
    exchange: str  # "": the default exchange, to the queue by its name

    def keep(self, tag: int, letter: DeadLetter, key: str) -> None:
        # The default exchange routes to this queue alone, whatever else the
        # dead-letter exchange may be bound to.
        routing_key = key if self.exchange else self.queue
        delivery = settled_publish(
            self.link,
            self.exchange,
            routing_key,
            moved_message(letter),
            self.timeout,
            doing=f"moving a message to the back of {self.queue}",
            meanwhile="none is lost, but one may now be in the queue twice, and the"
            " unacked ones out of order",
        )
        if not delivery.acked or delivery.returned:
            raise BrokerJobsError(
                f"the broker refused to put a message back at the end of {self.queue}"
                " (basic.nack or basic.return): it stays where it was; check that the"
                " queue exists and is not full, and try again"
            )
        self.channel.basic_ack(tag)


def probe_publishing(link: PikaLink, exchange: str, timeout: float, *, before: str) -> None:
    """Two publishes that no queue takes (``exchange``, :data:`PROBE_KEY`), each
    answered with a return and an ack when the broker takes publishes. Two, because a
    broker under an alarm reads the first publish of a connection, then blocks it
    (measured: one probe was answered under a memory alarm, and the job sent after it
    was not). Raises :class:`BrokerConnectionError` when no answer comes in time: the
    pass then takes nothing (measured: ``x-delivery-count`` goes up by one at each
    channel close and each requeue, on 3.10 and 4.0, and a quorum queue of RabbitMQ
    4.0 drops a message at its 20th)."""
    for _ in range(2):
        settled_publish(
            link,
            exchange,
            PROBE_KEY,
            WireMessage(body=b"", message_id=None, type=None, content_type=None),
            timeout,
            doing=f"probing the broker before {before}",
            meanwhile="no message was taken (the broker confirms no publish now: a memory"
            " or disk alarm? `broker-jobs status` shows it)",
        )


def settled_publish(
    link: PikaLink,
    exchange: str,
    routing_key: str,
    message: WireMessage,
    timeout: float,
    *,
    doing: str,
    meanwhile: str,
) -> Delivery:
    """Publish ``message`` on ``link`` and wait for the broker's answer (an ack, a
    nack, a return then an ack). None within ``timeout``, or a link that closed:
    :class:`BrokerConnectionError` saying what the pass was ``doing`` and what is
    left ``meanwhile``."""
    delivery = link.publish(exchange, routing_key, message)
    settled = link.wait(lambda: delivery.settled, timeout)
    link.forget_settled()
    if not settled:
        why = link.describe_closed() if not link.is_open else "no confirm in time"
        raise BrokerConnectionError(f"{doing}: {why}; {meanwhile}")
    return delivery


def depth_of(channel: Channel, queue: str) -> int:
    """The queue's depth (a passive declare: 404 when it does not exist)."""
    return channel.queue_declare(queue, passive=True).method.message_count or 0


def close_channel(channel: Channel) -> None:
    """Close a channel: its unacked messages go back to the front of their queue."""
    if channel.is_open:
        with contextlib.suppress(pika.exceptions.AMQPError):
            channel.close()


#: What an operation over dead-letter queues needs of the broker's permissions.
DEAD_LETTER_PERMISSIONS = (
    "Reading dead letters needs read permission on the dead-letter queues, replaying them"
    " write permission on the work exchange too (broker-jobs topology permissions)"
)


@contextlib.contextmanager
def translated(permissions: str = DEAD_LETTER_PERMISSIONS) -> Iterator[None]:
    """pika's errors as the library's, with passwords masked; a refusal says what
    the operation needs (``permissions``)."""
    try:
        yield
    except pika.exceptions.ChannelClosedByBroker as error:
        if error.reply_code == NOT_FOUND:
            raise TopologyMissingError(error.reply_text) from None
        refused = AccessRefusedError if error.reply_code == ACCESS_REFUSED else BrokerJobsError
        raise refused(
            f"the broker refused: {error.reply_code} {mask_text(error.reply_text)}. {permissions}"
        ) from None
    except pika.exceptions.AMQPError as error:
        raise BrokerConnectionError(
            f"the connection to the broker broke: {type(error).__name__}:"
            f" {mask_text(str(error))}; unacked messages went back to their queue"
        ) from None


def _bytes(body: bytes | str | None) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else body or b""
