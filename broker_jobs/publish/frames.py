"""A publish's AMQP frames (method, content header, body), marshaled in one pass.

pika marshals a publish through its generic encoders: a ``Basic.Publish`` object, a
``BasicProperties`` of fourteen fields looked at one by one, a table encoder, and a
frame object per frame (~13 us of CPU a publish on a hot CPU, about three times that
on the cold one a publisher meets after a pause). A :class:`WireMessage` has one
shape (a few strings, a delivery mode, a timestamp, a table of strings and
integers), so :func:`publish_frames` writes the same bytes directly for the sync
publisher's link (``pika_link.py``): tests/test_frames.py compares them with pika's
for each shape a job's message takes. A header value of any other type gives None,
and the caller takes pika's path.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from broker_jobs.amqp.frame_layout import BODY, FRAME_END, FRAME_HEADER, HEADER, METHOD
from broker_jobs.envelope import WireMessage

_FRAME_END = bytes([FRAME_END])
#: Basic.Publish (class 60, method 40), ticket 0.
_PUBLISH = struct.pack(">IH", 0x003C0028, 0)
_MANDATORY = b"\x01"
#: The content header's class (Basic), weight 0, before the body's size.
_HEADER_START = struct.pack(">HH", 60, 0)
_FLAG_CONTENT_TYPE = 1 << 15
_FLAG_CONTENT_ENCODING = 1 << 14
_FLAG_HEADERS = 1 << 13
_FLAG_DELIVERY_MODE = 1 << 12
_FLAG_MESSAGE_ID = 1 << 7
_FLAG_TIMESTAMP = 1 << 6
_FLAG_TYPE = 1 << 5
_INT32 = range(-(2**31), 2**31)


class _NotOurShape(Exception):
    """A value this module does not encode: pika's encoders take the message."""


def publish_frames(
    channel: int, exchange: str, routing_key: str, message: WireMessage, body_max: int
) -> list[bytes] | None:
    """The frames of a mandatory ``basic.publish`` of ``message`` on ``channel``, as
    pika marshals them (body frames of at most ``body_max`` bytes), or None when a
    header value is neither a string nor a 32-bit integer, or a short string is too
    long (pika's path then raises its own error)."""
    try:
        method = _PUBLISH + _short(exchange) + _short(routing_key) + _MANDATORY
        header = _content_header(message)
    except _NotOurShape:
        return None
    body = message.body
    frames = [_frame(METHOD, channel, method), _frame(HEADER, channel, header)]
    for start in range(0, len(body), body_max):
        frames.append(_frame(BODY, channel, body[start : start + body_max]))
    return frames


def _content_header(message: WireMessage) -> bytes:
    flags = _FLAG_HEADERS | _FLAG_DELIVERY_MODE
    before: list[bytes] = []  # the properties before the table, in the spec's order
    if message.content_type is not None:
        flags |= _FLAG_CONTENT_TYPE
        before.append(_short(message.content_type))
    if message.content_encoding is not None:
        flags |= _FLAG_CONTENT_ENCODING
        before.append(_short(message.content_encoding))
    after = [_table(message.headers), struct.pack("B", message.delivery_mode)]
    if message.message_id is not None:
        flags |= _FLAG_MESSAGE_ID
        after.append(_short(message.message_id))
    if message.timestamp is not None:
        flags |= _FLAG_TIMESTAMP
        after.append(struct.pack(">Q", message.timestamp))
    if message.type is not None:
        flags |= _FLAG_TYPE
        after.append(_short(message.type))
    sizes = struct.pack(">Q", len(message.body))
    return b"".join((_HEADER_START, sizes, struct.pack(">H", flags), *before, *after))


def _table(table: Mapping[str, Any]) -> bytes:
    pieces = []
    for key, value in table.items():
        pieces.append(_short(key))
        if isinstance(value, str):
            data = value.encode("utf-8")
            pieces.append(b"S" + struct.pack(">I", len(data)) + data)
        elif isinstance(value, int) and not isinstance(value, bool) and value in _INT32:
            pieces.append(b"I" + struct.pack(">i", value))
        else:
            raise _NotOurShape
    content = b"".join(pieces)
    return struct.pack(">I", len(content)) + content


def _short(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 255:
        raise _NotOurShape
    return struct.pack("B", len(data)) + data


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return FRAME_HEADER.pack(kind, channel, len(payload)) + payload + _FRAME_END
