"""Settlement frames written to the connection's transport at once, when nothing waits.

aiormq sends every frame through its connection's write queue: ``basic_ack`` puts the
frame there, the connection's writer task takes it in a later loop turn and writes
it, and ``basic_ack`` returns a turn after that, once the writer says so (a drain
future). A worker taking jobs one at a time pays those two loop turns for every job
(docs/worker.md, *Speed*). When the write queue is empty and the writer is waiting on
it, no frame is due before this one: :class:`DirectFrames` writes it to the writer's
``StreamWriter`` at once, as the writer task would have. It reaches the broker in the
same order and is in the transport when the call returns, as after aiormq's drain.
Anything else (a frame queued, the writer gone or closing, the channel or its
connection closing) is left to aiormq's path, which waits, raises and reports as before.

It relies on aiormq internals: the connection's ``write_queue`` and ``_writer_task``
(whose coroutine holds the ``StreamWriter`` as its local ``writer``) and the channel's
close event. Where one is missing, nothing is written here and aiormq's path runs.
tests/test_direct_frames.py fails if it stops taking effect on the installed aiormq.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiormq.abc import AbstractChannel, TaskWrapper
from pamqp import commands

from broker_jobs.amqp.frame_layout import (
    BASIC,
    BASIC_ACK,
    BASIC_NACK,
    FRAME_END,
    METHOD,
    SETTLEMENT,
    SETTLEMENT_PAYLOAD,
)

#: The frames written here: they carry no content and expect no reply.
Settlement = commands.Basic.Ack | commands.Basic.Nack


def settlement_bytes(frame: Settlement, channel: int) -> bytes:
    """``pamqp.frame.marshal(frame, channel)``, packed in one step (pamqp's generic
    encoder took ~2 µs a frame hot; tests/test_direct_frames.py compares the bytes)."""
    if isinstance(frame, commands.Basic.Ack):
        method, bits = BASIC_ACK, int(frame.multiple)
    else:
        method, bits = BASIC_NACK, int(frame.multiple) | int(frame.requeue) << 1
    return SETTLEMENT.pack(
        METHOD, channel, SETTLEMENT_PAYLOAD, BASIC, method, frame.delivery_tag, bits, FRAME_END
    )


class DirectFrames:
    """Writes one channel's settlement frames straight to its connection's transport
    when nothing waits to be sent before them."""

    def __init__(self, channel: AbstractChannel) -> None:
        self._channel = channel
        #: The writer task last looked into, and its ``StreamWriter`` (None: not found
        #: there; aiormq's path is taken for that connection's life).
        self._found: tuple[asyncio.Task[Any], asyncio.StreamWriter | None] | None = None

    def write(self, frame: Settlement) -> bool:
        """Write ``frame`` now if nothing is due before it; False: not written (send it
        the aiormq way)."""
        writer = self.idle_writer()
        if writer is None:
            return False
        self.send(writer, frame)
        return True

    def send(self, writer: asyncio.StreamWriter, frame: Settlement) -> None:
        """Write ``frame`` to ``writer``, an :meth:`idle_writer` of this same loop turn."""
        writer.write(settlement_bytes(frame, self._channel.number))

    def idle_writer(self) -> asyncio.StreamWriter | None:
        """The connection's ``StreamWriter`` if the channel is open and nothing waits
        in aiormq's write queue (so until the loop next runs something else); None
        otherwise."""
        channel = self._channel
        closing = getattr(channel, "_Channel__close_event", None)
        if not isinstance(closing, asyncio.Event) or closing.is_set() or channel.is_closed:
            return None
        connection = channel.connection
        queue = getattr(connection, "write_queue", None)
        if connection.is_closed or not isinstance(queue, asyncio.Queue) or not queue.empty():
            return None
        return self._writer(getattr(connection, "_writer_task", None))

    def _writer(self, task: object) -> asyncio.StreamWriter | None:
        """The ``StreamWriter`` of the connection's running writer task, if open."""
        if isinstance(task, TaskWrapper):  # how aiormq keeps its tasks
            task = task.task
        if not isinstance(task, asyncio.Task) or task.done():
            return None
        found = self._found
        if found is None or found[0] is not task:  # looked up once per connection
            frame = getattr(task.get_coro(), "cr_frame", None)
            writer = frame.f_locals.get("writer") if frame is not None else None
            found = (task, writer if isinstance(writer, asyncio.StreamWriter) else None)
            self._found = found
        writer = found[1]
        return None if writer is None or writer.is_closing() else writer
