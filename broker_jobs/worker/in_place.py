"""Consumer callbacks called as aiormq reads each delivery, not in a task of their own.

aiormq runs every consumer callback through ``create_task``: a task, a wrapper, an
entry in the channel's future store and two done-callbacks per delivery, which cost
about a tenth of the worker's event loop (py-spy, 30,000 jobs, memory store) and put
a loop iteration between reading a delivery and taking it. The worker's callback only
takes the delivery (it never awaits), so :func:`deliver_in_place` lets it be called
directly, at the first of two places:

- **As the connection's reader reads the delivery's frames** (:class:`_TakenInPlace`):
  aiormq's connection reader puts every frame into its channel's queue, and the
  channel's reader task takes them from there a loop turn later. A delivery to an
  :class:`InPlaceConsumer` that begins while that queue is empty (the channel's
  reader has taken everything before it) is assembled from its frames there and then
  and taken at once: one loop turn less between reading a delivery and taking it.
  With anything queued before it, it goes through the queue, so that deliveries are
  still taken in delivery order (the acks' books rely on it).
- **As the channel's reader reads them**: its ``_on_deliver_frame`` replaced with the
  same steps (read the content header and the body, find the consumer, call it).

It uses aiormq's internals (the channel's ``frames`` queue, ``consumers``,
``_on_deliver_frame``, ``_read_content``): where an aiormq lacks them, nothing is
replaced and its own path runs (the callback still takes the delivery in a task).
tests/test_in_place.py fails if the replacement stops taking effect on the installed
aiormq.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiormq.abc import AbstractChannel, DeliveredMessage
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

log = logging.getLogger(__name__)


class InPlaceConsumer:
    """A consumer callback for aiormq's ``basic_consume`` that also takes deliveries
    in place: ``take`` (synchronous) is what the replaced reader calls; called the
    aiormq way (in a task of its own), it takes the delivery there."""

    def __init__(self, take: Callable[[DeliveredMessage], None]) -> None:
        self.take = take

    async def __call__(self, delivered: DeliveredMessage) -> None:
        self.take(delivered)


def deliver_in_place(channel: AbstractChannel) -> bool:
    """Let ``channel`` call :class:`InPlaceConsumer` callbacks as it reads each
    delivery; False (nothing changed) if this aiormq lacks the internals it needs."""
    read_header = getattr(channel, "_Channel__get_content_header", None)
    read_content = getattr(channel, "_read_content", None)
    aiormq_way = getattr(channel, "_on_deliver_frame", None)
    consumers = getattr(channel, "consumers", None)
    frames = getattr(channel, "frames", None)
    if (
        read_header is None
        or read_content is None
        or aiormq_way is None
        or not isinstance(consumers, dict)
        or not isinstance(frames, asyncio.Queue)
    ):
        log.debug("aiormq lacks what deliver_in_place needs: its own path runs")
        return False
    frames.put = _TakenInPlace(channel, consumers, frames).put  # type: ignore[method-assign]

    async def on_deliver_frame(frame: commands.Basic.Deliver) -> None:
        consumer = _in_place_consumer(consumers, frame)
        if consumer is None:
            await aiormq_way(frame)  # reads the content itself
            return
        header = await read_header()
        consumer.take(await read_content(frame, header))

    channel._on_deliver_frame = on_deliver_frame  # type: ignore[attr-defined]
    return True


def _in_place_consumer(
    consumers: dict[str, Any], frame: commands.Basic.Deliver
) -> InPlaceConsumer | None:
    # aiormq keeps a plain callable wrapped (tools.awaitable, functools.wraps)
    consumer = getattr(consumers.get(frame.consumer_tag or ""), "__wrapped__", None)
    return consumer if isinstance(consumer, InPlaceConsumer) else None


class _TakenInPlace:
    """The ``put`` of one channel's frame queue (what aiormq's connection reader
    awaits for each frame of the channel): a delivery to an :class:`InPlaceConsumer`
    that begins with the queue empty is held here frame by frame and taken when its
    body is complete; every other frame is queued as before. Frames of one delivery
    arrive together on their channel (AMQP 0-9-1, 4.2.6), so a frame that does not
    continue a held delivery is unexpected: the held frames are queued first, in
    order, and aiormq's channel reader meets the error as it would have."""

    def __init__(
        self, channel: AbstractChannel, consumers: dict[str, Any], frames: asyncio.Queue[Any]
    ) -> None:
        self._channel = channel
        self._consumers = consumers
        self._frames = frames
        self._queue: Callable[[Any], Awaitable[None]] = frames.put
        #: The delivery being assembled: its frames, its consumer, its body's length.
        self._held: list[Any] = []
        self._consumer: InPlaceConsumer | None = None
        self._length = 0

    async def put(self, item: tuple[int, Any]) -> None:
        weight, frame = item
        if self._held:
            if self._continues(frame):
                return
            held, self._held = self._held, []
            for earlier in held:
                await self._queue((weight, earlier))
        elif isinstance(frame, commands.Basic.Deliver) and self._frames.empty():
            consumer = _in_place_consumer(self._consumers, frame)
            if consumer is not None:
                self._held, self._consumer, self._length = [frame], consumer, 0
                return
        await self._queue(item)

    def _continues(self, frame: Any) -> bool:
        """Take ``frame`` into the held delivery (and the delivery, once whole); False
        if it is not the delivery's next frame."""
        held = self._held
        if len(held) == 1:
            if not isinstance(frame, ContentHeader):
                return False
        elif isinstance(frame, ContentBody):
            self._length += len(frame.value)
        else:
            return False
        held.append(frame)
        header = held[1]
        if self._length >= header.body_size:
            consumer, self._consumer, self._held = self._consumer, None, []
            body = b"".join(part.value for part in held[2:])
            assert consumer is not None  # set with the held delivery
            consumer.take(DeliveredMessage(held[0], header, body, self._channel))
        return True
