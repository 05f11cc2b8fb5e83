"""A delivery's three frames (``basic.deliver``, content header, body) unmarshaled
in one step each, as pamqp would unmarshal them.

pamqp reads every frame field by field through generic decoders (a type name looked
up per field, a slice of the rest of the data per field, a validating constructor
with a regular expression for each ``Basic.Deliver``): ~9 µs for a delivery's method
frame and ~15 µs for its content header on a hot CPU, about twice that on the cold
one an idle worker meets each job with. A delivery's frames have a fixed layout, so
:func:`unmarshal_delivery_frame` reads them with a few ``struct`` calls into the same
pamqp objects, attribute for attribute (tests/test_delivery_frames.py compares them
with pamqp's for every shape).

Only what it reads exactly as pamqp does is taken: header tables of strings,
integers and booleans, a timestamp in seconds, one word of property flags.
Anything else (another method, a table value of another type, text that is not
UTF-8, a length that does not add up) gives None, and the caller takes pamqp's path,
which reads it or raises its own error as before.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from broker_jobs.amqp.frame_layout import BASIC, BODY, FRAME_HEADER, HEADER, METHOD

#: ``(bytes read, channel, frame)``, as ``pamqp.frame.unmarshal`` returns it.
ReceivedFrame = tuple[int, int, Any]

#: Where a frame's payload starts.
_PAYLOAD = FRAME_HEADER.size
#: Basic.Deliver: class 60, method 60.
_DELIVER = struct.pack(">HH", BASIC, 60)
_LONG_LONG = struct.Struct(">q")
_UNSIGNED_LONG_LONG = struct.Struct(">Q")
_UNSIGNED_LONG = struct.Struct(">I")
#: A header table's integers by type octet, as pamqp reads them ("L" signed too).
_INTEGERS = {
    ord("b"): struct.Struct(">b"),
    ord("B"): struct.Struct(">B"),
    ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"),
    ord("I"): struct.Struct(">l"),
    ord("i"): struct.Struct(">L"),
    ord("l"): _LONG_LONG,
    ord("L"): _LONG_LONG,
}
#: A content header's class, weight, body size and first word of property flags.
_HEADER_START = struct.Struct(">HHQH")
#: Seconds above this are read as milliseconds by pamqp: left to it.
_LAST_SECOND = 0xFFFFFFFF

_Properties = commands.Basic.Properties
_Deliver = commands.Basic.Deliver
#: The properties by flag, in the order they are on the wire, and how each is read
#: (every short string one way; cluster_id, deprecated, is left to pamqp).
_SHORT_STRING, _TABLE, _OCTET, _TIMESTAMP = range(4)
_LAYOUT = (
    ("content_type", _SHORT_STRING),
    ("content_encoding", _SHORT_STRING),
    ("headers", _TABLE),
    ("delivery_mode", _OCTET),
    ("priority", _OCTET),
    ("correlation_id", _SHORT_STRING),
    ("reply_to", _SHORT_STRING),
    ("expiration", _SHORT_STRING),
    ("message_id", _SHORT_STRING),
    ("timestamp", _TIMESTAMP),
    ("message_type", _SHORT_STRING),
    ("user_id", _SHORT_STRING),
    ("app_id", _SHORT_STRING),
)
_FIELDS = tuple((_Properties.flags[name], name, kind) for name, kind in _LAYOUT)
#: Flags of properties read here: any other (cluster_id, a continued flag word)
#: is left to pamqp.
_READ_HERE = sum(flag for flag, _, _ in _FIELDS)


class _NotReadHere(Exception):
    """A frame or value this module does not read: pamqp's path takes the frame."""


def unmarshal_delivery_frame(data: bytes) -> ReceivedFrame | None:
    """``pamqp.frame.unmarshal(data)`` for a whole frame (``data``, its end octet
    checked by the caller) of a delivery, read directly; None for any other frame
    or shape (the caller takes pamqp's path)."""
    kind, channel, size = FRAME_HEADER.unpack_from(data)
    if not size:  # a heartbeat, or a frame pamqp refuses
        return None
    end = _PAYLOAD + size
    try:
        if kind == BODY:
            return len(data), channel, ContentBody(data[_PAYLOAD:end])
        if kind == METHOD and data[_PAYLOAD : _PAYLOAD + 4] == _DELIVER:
            return len(data), channel, _deliver(data, _PAYLOAD + 4, end)
        if kind == HEADER:
            return len(data), channel, _content_header(data, _PAYLOAD, end)
    except (_NotReadHere, IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


def _deliver(data: bytes, at: int, end: int) -> commands.Basic.Deliver:
    consumer_tag, at = _short_string(data, at)
    (delivery_tag,) = _LONG_LONG.unpack_from(data, at)
    redelivered = bool(data[at + 8] & 1)
    exchange, at = _short_string(data, at + 9)
    routing_key, at = _short_string(data, at)
    if at > end:
        raise _NotReadHere
    # As pamqp's unmarshal leaves it: the constructor's checks are not run on a
    # frame read from the broker (their regular expression is most of its cost).
    deliver = _Deliver.__new__(_Deliver)
    deliver.consumer_tag = consumer_tag
    deliver.delivery_tag = delivery_tag
    deliver.redelivered = redelivered
    deliver.exchange = exchange
    deliver.routing_key = routing_key
    return deliver


def _content_header(data: bytes, at: int, end: int) -> ContentHeader:
    class_id, weight, body_size, flags = _HEADER_START.unpack_from(data, at)
    if flags & ~_READ_HERE:
        raise _NotReadHere
    at += _HEADER_START.size
    properties = _Properties()  # every property None (cluster_id ""), as pamqp starts
    for flag, name, kind in _FIELDS:
        if not flags & flag:
            continue
        value: Any
        if kind == _SHORT_STRING:
            value, at = _short_string(data, at)
        elif kind == _TABLE:
            value, at = _table(data, at)
        elif kind == _OCTET:
            value, at = data[at], at + 1
        else:
            (seconds,) = _UNSIGNED_LONG_LONG.unpack_from(data, at)
            if seconds > _LAST_SECOND:
                raise _NotReadHere
            value, at = datetime.fromtimestamp(seconds, tz=UTC), at + 8
        setattr(properties, name, value)
    if at > end:
        raise _NotReadHere
    header = ContentHeader(weight, body_size, properties)
    header.class_id = class_id
    return header


def _short_string(data: bytes, at: int) -> tuple[str, int]:
    length = data[at]
    start = at + 1
    if start + length > len(data):
        raise _NotReadHere
    return data[start : start + length].decode("utf-8"), start + length


def _table(data: bytes, at: int) -> tuple[dict[str, Any], int]:
    (length,) = _UNSIGNED_LONG.unpack_from(data, at)
    at += 4
    end = at + length
    table: dict[str, Any] = {}
    while at < end:
        key, at = _short_string(data, at)
        kind = data[at]
        at += 1
        value: Any
        if kind == 0x53:  # "S": a long string
            (size,) = _UNSIGNED_LONG.unpack_from(data, at)
            at += 4
            value = data[at : at + size].decode("utf-8")  # not UTF-8: pamqp gives bytes
            at += size
        elif kind == 0x74:  # "t": a boolean
            value = bool(data[at])
            at += 1
        else:  # an integer, of the size its type says
            number = _INTEGERS.get(kind)
            if number is None:
                raise _NotReadHere
            (value,) = number.unpack_from(data, at)
            at += number.size
        table[key] = value
    if at != end:
        raise _NotReadHere
    return table, end
