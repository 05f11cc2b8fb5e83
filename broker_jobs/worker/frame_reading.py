"""Whole frames taken from the connection's read buffer in one step.

aiormq reads every AMQP frame with three awaited ``readexactly`` calls into a
``BytesIO`` under an ``asyncio.Lock`` (``FrameReceiver.get_frame``), then unmarshals
it: a delivery is three frames (method, content header, body). A busy worker's
socket reads bring many deliveries at once, so most frames are already whole in the
connection's ``StreamReader`` buffer when asked for: :func:`whole_frame` slices such
a frame out and unmarshals it directly (a delivery's frames by
:mod:`~broker_jobs.worker.delivery_frames`, any other by pamqp). With the buffer
short of a frame, it waits for the next bytes as aiormq would and looks again: an
idle worker's delivery arrives whole in one read. Anything else (a frame still not
wholly read, the connection's first frame, end of file, a read error, a bad frame
end) takes aiormq's own path, which waits, raises and reports as before.

:func:`reading_whole_frames` puts it on aiormq's ``FrameReceiver`` class for a block
(``broker-jobs worker`` runs its worker inside one), so it serves every aiormq
connection of the process meanwhile: it changes how a frame is read, never which
frame or what it holds. It relies on asyncio's ``StreamReader`` internals (``_buffer``,
``_exception``, ``_eof``, ``_waiter``, ``_wait_for_data``, ``_maybe_resume_transport``,
which ``readexactly`` itself uses: where one is missing nothing is installed) and on
aiormq's ``FrameReceiver`` attributes (``reader``, ``started``, ``lock``: where one is
missing, aiormq's path reads).
tests/test_frame_reading.py fails if the replacement stops taking effect.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pamqp.frame
from aiormq.connection import FrameReceiver
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError
from pamqp import commands
from pamqp.exceptions import PAMQPException
from pamqp.header import ContentHeader

from broker_jobs.amqp.frame_layout import (
    FRAME_END,
    FRAME_HEADER,
    FRAME_OVERHEAD,
    HEADER,
)
from broker_jobs.worker.delivery_frames import ReceivedFrame, unmarshal_delivery_frame

log = logging.getLogger(__name__)


def whole_frame(receiver: Any) -> ReceivedFrame | None:
    """The next frame of ``receiver`` (an aiormq ``FrameReceiver``) if it is wholly
    in its reader's buffer and nothing else is reading; None otherwise (the caller
    takes aiormq's path)."""
    reader = _free_reader(receiver)
    if reader is None:
        return None
    buffer: bytearray = reader._buffer  # type: ignore[attr-defined]
    end = _first_frame_end(buffer)
    if not end or len(buffer) < end or buffer[end - 1] != FRAME_END:
        return None
    data = bytes(memoryview(buffer)[:end])
    del buffer[:end]
    reader._maybe_resume_transport()  # type: ignore[attr-defined]  # as readexactly does
    return _unmarshal(data)


def _free_reader(receiver: Any) -> asyncio.StreamReader | None:
    """``receiver``'s reader, past the connection's first frame, if nothing else
    reads it and it holds no error; None otherwise."""
    # getattr: an aiormq without these attributes takes its own path, never fails here.
    reader = getattr(receiver, "reader", None)
    lock = getattr(receiver, "lock", None)
    if not isinstance(reader, asyncio.StreamReader) or not getattr(receiver, "started", False):
        return None
    if not isinstance(lock, asyncio.Lock) or lock.locked():
        return None
    if reader._exception is not None:  # type: ignore[attr-defined]
        return None
    return reader


def _first_frame_end(buffer: bytearray) -> int:
    """Where the first frame in ``buffer`` ends, frame-end octet included; 0 while
    its header is not all there."""
    if len(buffer) < FRAME_OVERHEAD:
        return 0
    _, _, size = FRAME_HEADER.unpack_from(buffer)
    return int(size) + FRAME_OVERHEAD


def _unmarshal(data: bytes) -> ReceivedFrame:
    """A whole frame read: a delivery's directly, any other by pamqp."""
    frame = unmarshal_delivery_frame(data)
    if frame is not None:
        return frame
    try:
        return pamqp.frame.unmarshal(data)
    except PAMQPException as error:  # what aiormq's own path raises
        raise InvalidFrameError(str(error)) from error


#: The header a content header whose properties cannot be read is given instead of
#: them (``x-``: never one of a publisher's, dropped from its dead letter).
UNREADABLE_PROPERTIES = "x-broker-jobs-unreadable-properties"
#: A content header frame's type, and its payload's start: class, weight, body size.
_HEADER_START = struct.Struct(">HHQ")


def tolerate_unreadable_headers() -> None:
    """From now on, pamqp reads a content header whose properties it cannot read as
    :func:`unreadable_header` makes it, for every aiormq connection of the process
    (aiormq's own path and :func:`whole_frame` alike call ``pamqp.frame.unmarshal``).
    ``Worker.run`` calls it. Installed once and kept, never taken back: workers of one
    process (threads, tests) start and end in any order, and a worker still running
    must keep it; it changes nothing but what became of a frame that failed."""
    original = pamqp.frame.unmarshal
    if getattr(original, "tolerates_unreadable_headers", False):
        return

    def unmarshal(data: bytes) -> ReceivedFrame:
        try:
            return original(data)
        except (PAMQPException, ValueError, RecursionError) as error:
            unreadable = unreadable_header(data, error)
            if unreadable is None:
                raise
            return unreadable

    unmarshal.tolerates_unreadable_headers = True  # type: ignore[attr-defined]
    pamqp.frame.unmarshal = unmarshal  # type: ignore[assignment]


def unreadable_header(data: bytes, error: BaseException) -> ReceivedFrame | None:
    """A content header frame (``data``) whose properties pamqp cannot read (a
    message id that is not UTF-8, a header table nested too deeply) as one with no
    properties but :data:`UNREADABLE_PROPERTIES`: its delivery is then dead-lettered
    like any bad message, instead of the connection closing on it, and the same
    message coming back first on every new connection. None for any other frame."""
    kind, channel, size = FRAME_HEADER.unpack_from(data)
    if kind != HEADER or size < _HEADER_START.size:
        return None
    _class, weight, body_size = _HEADER_START.unpack_from(data, FRAME_HEADER.size)
    why = f"its properties cannot be read ({type(error).__name__}: {str(error)[:200]})"
    properties = commands.Basic.Properties(headers={UNREADABLE_PROPERTIES: why})
    return len(data), channel, ContentHeader(weight, body_size, properties)


@contextmanager
def reading_whole_frames() -> Iterator[bool]:
    """Inside the block, every aiormq connection of this process reads whole frames
    in one step (yields False, nothing changed, where aiormq or asyncio lack what it
    needs). Nested blocks leave it to the outermost; its end puts aiormq's method
    back. Enter it with the event loop running."""
    aiormq_way = FrameReceiver.get_frame
    if getattr(aiormq_way, "reads_whole_frames", False):
        yield True
        return
    if not _has_stream_internals():
        log.debug("asyncio's StreamReader lacks what whole_frame needs: aiormq's path runs")
        yield False
        return
    FrameReceiver.get_frame = _reading_whole_frames(aiormq_way)  # type: ignore[method-assign,assignment]
    try:
        yield True
    finally:
        FrameReceiver.get_frame = aiormq_way  # type: ignore[method-assign]


async def _data_arrived(receiver: Any) -> bool:
    """Wait for the next bytes of ``receiver``'s reader, as aiormq's path would, so
    that a frame arriving whole after a quiet spell (an idle worker's every delivery)
    is read in one step too: True once bytes arrived. False, not waiting, where
    aiormq's path must read: another reader, an end of file or an error known, a
    whole (so bad) frame in the buffer, the connection's first frame; and an error
    met while waiting, which that path raises as its own."""
    reader = _free_reader(receiver)
    if reader is None or reader._eof or reader._waiter is not None:  # type: ignore[attr-defined]
        return False
    buffer: bytearray = reader._buffer  # type: ignore[attr-defined]
    end = _first_frame_end(buffer)
    if end and len(buffer) >= end:
        return False
    async with receiver.lock:  # as aiormq's path holds it while it reads
        try:
            await reader._wait_for_data("get_frame")  # type: ignore[attr-defined]
        except Exception:  # the reader's error: aiormq's path raises it as its own
            return False
    if reader._eof and not buffer:  # type: ignore[attr-defined]
        # What aiormq's path, waiting in its read, raises at this end (asked afresh,
        # it would end the frames quietly, and the connection would not see its loss).
        raise AMQPConnectionError(
            "Server connection unexpectedly closed. Read 0 bytes but 1 bytes expected"
        )
    return True


def _has_stream_internals() -> bool:
    probe = asyncio.StreamReader()
    return all(
        hasattr(probe, name)
        for name in (
            "_buffer",
            "_exception",
            "_maybe_resume_transport",
            "_eof",
            "_waiter",
            "_wait_for_data",
        )
    )


def _reading_whole_frames(
    aiormq_way: Callable[[Any], Awaitable[ReceivedFrame]],
) -> Callable[[Any], Awaitable[ReceivedFrame]]:
    async def get_frame(self: Any) -> ReceivedFrame:
        frame = whole_frame(self)
        if frame is None and await _data_arrived(self):
            frame = whole_frame(self)
        if frame is not None:
            return frame
        return await aiormq_way(self)

    get_frame.reads_whole_frames = True  # type: ignore[attr-defined]
    get_frame.__wrapped__ = aiormq_way  # type: ignore[attr-defined]
    return get_frame
