"""Consumer callbacks called as aiormq reads each delivery, not in a task of their own.

aiormq runs every consumer callback through ``create_task``: a task, a wrapper, an
entry in the channel's future store and two done-callbacks per delivery, which cost
about a tenth of the worker's event loop (py-spy, 30,000 jobs, memory store) and put
a loop iteration between reading a delivery and taking it. The worker's callback only
takes the delivery (it never awaits), so :func:`deliver_in_place` lets the channel's
reader call it directly.

It replaces the channel's ``_on_deliver_frame`` with the same steps (read the content
header and the body, find the consumer, call it), using aiormq's internals: where an
aiormq lacks them, nothing is replaced and its own path runs (the callback still
takes the delivery in a task). tests/test_in_place.py fails if the replacement
stops taking effect on the installed aiormq.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiormq.abc import AbstractChannel, DeliveredMessage
from pamqp import commands

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
    if (
        read_header is None
        or read_content is None
        or aiormq_way is None
        or not isinstance(consumers, dict)
    ):
        log.debug("aiormq lacks what deliver_in_place needs: its own path runs")
        return False

    async def on_deliver_frame(frame: commands.Basic.Deliver) -> None:
        # aiormq keeps a plain callable wrapped (tools.awaitable, functools.wraps)
        consumer = getattr(consumers.get(frame.consumer_tag), "__wrapped__", None)
        if not isinstance(consumer, InPlaceConsumer):
            await aiormq_way(frame)  # reads the content itself
            return
        header = await read_header()
        consumer.take(await read_content(frame, header))

    channel._on_deliver_frame = on_deliver_frame  # type: ignore[attr-defined]
    return True
