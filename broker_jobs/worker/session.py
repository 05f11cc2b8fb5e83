"""One connection's consuming: a channel, a consumer per task queue, the acks of
its deliveries, and how it ended (lost, or a consumer cancelled by the broker).

The queues are consumed on the channel's aiormq channel directly: aio-pika's
``Queue.consume`` runs each delivery's callback in a task of its own, one loop
iteration after the delivery's own task (measured: part of the latency gap to a raw
consumer). The channel's reader calls the callback as it reads the delivery
(worker.in_place): it takes the delivery at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NamedTuple

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands

from broker_jobs.errors import WORKER_DECLARES, TopologyMissingError
from broker_jobs.urls import mask_text
from broker_jobs.worker.acks import ChannelAcks
from broker_jobs.worker.in_place import InPlaceConsumer, deliver_in_place

log = logging.getLogger(__name__)

#: Takes a delivery of a task's queue, with the acks of its channel.
OnDelivery = Callable[[DeliveredMessage, str, ChannelAcks], None]


class SessionEnded(Exception):
    """Why a session's consuming ended, other than the worker stopping."""


class Lost(SessionEnded):
    """The connection or the channel is gone; the worker reconnects."""


class Cancelled(SessionEnded):
    """The broker cancelled a consumer (its queue deleted); the worker stops."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(f"the broker cancelled the consumer of {queue}")


class _Consumer(NamedTuple):
    queue: str
    task: str
    #: A second consumer of its queue, for a deeper buffer (worker.prefetch_boost).
    boost: bool


class Session:
    """Consumes the task queues on one connection until it ends."""

    def __init__(self, connection: aio_pika.abc.AbstractConnection) -> None:
        self.connection = connection
        self.channel: aio_pika.abc.AbstractChannel | None = None
        self.acks: ChannelAcks | None = None
        self._consumers: dict[str, _Consumer] = {}  # by consumer tag
        #: Consumers change one step at a time (a pause, a resume, a boost, the stop):
        #: a boost must not consume a queue a pause is cancelling.
        self._changing = asyncio.Lock()
        #: Each queue is consumed a second time (see :meth:`boost`): the second consumers'
        #: prefetch, 0 while not boosted.
        self._boost_prefetch = 0
        self._prefetch = 0
        self._cancelled = False
        self._on_delivery: OnDelivery | None = None
        self._ended: asyncio.Future[SessionEnded] = asyncio.get_running_loop().create_future()

    async def open(self, queues: dict[str, str], prefetch: int, on_delivery: OnDelivery) -> None:
        """Open a confirming channel and consume ``queues`` (queue name -> task).
        Returned dead letters raise (no dead-letter queue): never ack what was dropped."""
        channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        self.channel = channel
        self._prefetch = prefetch
        await channel.set_qos(prefetch_count=prefetch)
        underlay = await channel.get_underlay_channel()
        self.acks = ChannelAcks(underlay)
        underlay.closing.add_done_callback(self._on_closed)
        underlay.on_consumer_cancel_callbacks.add(self._on_cancel)
        deliver_in_place(underlay)
        self._on_delivery = on_delivery
        await self.consume(queues)

    async def consume(self, queues: dict[str, str]) -> None:
        """Consume ``queues`` (queue name -> task) on the open channel: at the start,
        and when a paused task is resumed (twice each while boosted)."""
        async with self._changing:
            if self._cancelled:
                return
            await self._consume(queues, boost=False)
            if self.boosted:
                await self._consume(queues, boost=True)

    async def stop_consuming(self, queues: Iterable[str]) -> None:
        """Cancel the consumers of ``queues`` (a paused task's): no more deliveries
        from them once the broker confirmed (those in hand stay in hand)."""
        names = set(queues)
        async with self._changing:
            await self._cancel([tag for tag, c in self._consumers.items() if c.queue in names])

    def queues_consumed(self) -> int:
        """How many queues are consumed (once or twice each)."""
        return len({c.queue for c in self._consumers.values()})

    @property
    def boosted(self) -> bool:
        return self._boost_prefetch > 0

    async def boost(self, prefetch: int) -> None:
        """Consume each queue consumed now a second time, with ``prefetch``: a deeper
        buffer (worker.prefetch_boost)."""
        async with self._changing:
            if self.boosted or self._cancelled:
                return
            self._boost_prefetch = prefetch
            await self._consume({c.queue: c.task for c in self._consumers.values()}, boost=True)

    async def unboost(self) -> list[str]:
        """Cancel the second consumers (their tags returned); what they delivered
        stays in hand."""
        async with self._changing:
            if not self.boosted:
                return []
            self._boost_prefetch = 0
            tags = [tag for tag, c in self._consumers.items() if c.boost]
            await self._cancel(tags)
            return tags

    async def cancel_consumers(self) -> None:
        """No new deliveries (a graceful stop); a lost channel has none anyway."""
        async with self._changing:
            self._cancelled = True
            with contextlib.suppress(*aio_pika.exceptions.CONNECTION_EXCEPTIONS):
                await self._cancel(list(self._consumers))

    async def _consume(self, queues: dict[str, str], *, boost: bool) -> None:
        """Consume ``queues``; ``boost``: second consumers, with the boost's prefetch
        (RabbitMQ gives a consumer the channel's prefetch of the moment it starts)."""
        if not boost or self._boost_prefetch == self._prefetch:
            await self._consume_all(queues, boost=boost)
            return
        assert self.channel is not None  # opened
        await self.channel.set_qos(prefetch_count=self._boost_prefetch)
        try:
            await self._consume_all(queues, boost=True)
        finally:
            await self.channel.set_qos(prefetch_count=self._prefetch)

    async def _consume_all(self, queues: dict[str, str], *, boost: bool) -> None:
        assert self.acks is not None  # opened
        assert self._on_delivery is not None
        acks, on_delivery, underlay = self.acks, self._on_delivery, self.acks.channel
        for queue, task in queues.items():

            def take(delivered: DeliveredMessage, task: str = task) -> None:
                if delivered.delivery_tag is not None:
                    acks.taken(delivered.delivery_tag)
                try:
                    on_delivery(delivered, task, acks)
                except Exception:  # not into aiormq's reader: that would close the channel
                    log.exception("taking a delivery from %s failed", task)

            try:
                ok = await underlay.basic_consume(queue, InPlaceConsumer(take))
            except aio_pika.exceptions.ChannelNotFoundEntity as error:
                raise TopologyMissingError(
                    mask_text(str(error.args[-1])), or_else=WORKER_DECLARES
                ) from None
            assert ok.consumer_tag is not None  # the broker always names the consumer
            self._consumers[ok.consumer_tag] = _Consumer(queue, task, boost)

    async def _cancel(self, tags: list[str]) -> None:
        underlay = self.acks.channel if self.acks is not None else None
        for tag in tags:
            del self._consumers[tag]  # before the cancel: not the broker's cancel
            if underlay is not None and not underlay.is_closed:
                await underlay.basic_cancel(tag)

    async def ended(self) -> SessionEnded:
        """Wait until the session ends: :class:`Lost` or :class:`Cancelled`."""
        return await asyncio.shield(self._ended)

    def end(self, why: SessionEnded) -> None:
        if not self._ended.done():
            self._ended.set_result(why)

    async def close(self) -> None:
        """Ack what is recorded and waiting for a frame (acks.STRAGGLER_WAIT), then
        close the connection (returning what it holds unacked to the queues)."""
        if self.acks is not None:
            # Apart from the close: a flush that fails (the channel went meanwhile; the
            # broker redelivers those deliveries) must not leave the connection open,
            # holding the rest of its deliveries.
            with contextlib.suppress(Exception):
                await self.acks.flush()
        with contextlib.suppress(Exception):  # a lost connection has nothing to close
            await self.connection.close()

    def _on_closed(self, closing: asyncio.Future[Any]) -> None:
        cause = "the channel was closed"
        if closing.cancelled():
            cause = "the connection was closed"
        elif (error := closing.exception()) is not None:
            cause = describe_loss(error)
        self.end(Lost(cause))

    def _on_cancel(self, frame: commands.Basic.Cancel) -> None:
        consumer = self._consumers.pop(frame.consumer_tag or "", None)
        if consumer is not None:
            self.end(Cancelled(consumer.queue))


async def change_quietly(step: Awaitable[None]) -> None:
    """A consumer change on a session that may be going: its loss ends the session,
    and the next one consumes what is not paused then."""
    try:
        await step
    except Exception as error:  # the session's own watcher reports the loss
        log.debug("changing consumers failed (the session is going?): %s", error)


#: A connection aiormq closed by cancelling its reader: its heartbeat found no frame
#: from the broker for three heartbeat intervals.
SILENT_BROKER = (
    "no frame from the broker within three heartbeat intervals (a network cut, a"
    " firewall dropping the connection, or a node that stopped answering)"
)


def describe_loss(error: BaseException) -> str:
    """The cause of a lost connection or channel, for one log line."""
    if isinstance(error, asyncio.CancelledError):
        return SILENT_BROKER
    if isinstance(error, aiormq.exceptions.ConnectionClosed | aiormq.exceptions.ChannelClosed):
        code, text = (*error.args, None, None)[:2]
        if code is not None:
            return f"{type(error).__name__} {code} {mask_text(str(text))}"
    text = mask_text(str(error)).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
