"""The worker's own unmarshaling of a delivery's frames (``worker/delivery_frames.py``):
the same pamqp objects, attribute for attribute, as pamqp's own unmarshaling of the
same bytes, for every shape of delivery; None where it does not read a frame, so
that pamqp's path (and its errors) takes it."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pamqp.frame
import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from broker_jobs.envelope import WireMessage
from broker_jobs.publish.frames import publish_frames
from broker_jobs.worker.delivery_frames import unmarshal_delivery_frame
from broker_jobs.worker.frame_reading import UNREADABLE_PROPERTIES, tolerate_unreadable_headers
from tests.test_frames import SHAPES


def header_frame(properties: commands.Basic.Properties, body_size: int = 42) -> bytes:
    return pamqp.frame.marshal(ContentHeader(0, body_size, properties), 1)


def deliver_frame(**fields: Any) -> bytes:
    method = commands.Basic.Deliver(
        **{
            "consumer_tag": "ctag1.9f1c",
            "delivery_tag": 1,
            "exchange": "shop.work",
            "routing_key": "image.resize",
            **fields,
        }
    )
    return pamqp.frame.marshal(method, 3)


def same_as_pamqp(data: bytes) -> Any:
    """The frame read directly, after checking it equals pamqp's in every attribute."""
    ours = unmarshal_delivery_frame(data)
    theirs = pamqp.frame.unmarshal(data)
    assert ours is not None
    assert ours[:2] == theirs[:2]
    mine, pamqps = ours[2], theirs[2]
    assert type(mine) is type(pamqps)
    if isinstance(mine, ContentHeader):
        assert vars(mine).keys() == vars(pamqps).keys()
        assert (mine.class_id, mine.weight, mine.body_size) == (
            pamqps.class_id,
            pamqps.weight,
            pamqps.body_size,
        )
        mine, pamqps = mine.properties, pamqps.properties
    names = getattr(type(pamqps), "__slots__", None) or vars(pamqps).keys()
    for name in names:
        found, expected = getattr(mine, name), getattr(pamqps, name)
        assert (found, type(found)) == (expected, type(expected)), name
    return mine


@pytest.mark.parametrize("message", SHAPES.values(), ids=SHAPES.keys())
def test_a_job_as_the_publisher_sends_it(message: WireMessage) -> None:
    """Every shape of a job's message the publisher sends (those of test_frames.py)."""
    frames = publish_frames(1, "shop.work", "image.resize", message, 131072)
    assert frames is not None
    _publish, header, *body = frames
    read = same_as_pamqp(header)
    assert (read.message_id, read.headers or {}) == (message.message_id, message.headers)
    for part in body:
        same_as_pamqp(part)


@pytest.mark.parametrize(
    "properties",
    [
        commands.Basic.Properties(),
        commands.Basic.Properties(
            content_type="application/json",
            content_encoding="utf-8",
            headers={
                "s": "text",
                "b": -128,
                "s16": -(2**15),
                "i": -(2**31),
                "big": 2**40,
                "neg": -(2**63),
                "yes": True,
            },
            delivery_mode=1,
            priority=9,
            correlation_id="c-1",
            reply_to="amq.rabbitmq.reply-to",
            expiration="60000",
            message_id="m" * 255,
            timestamp=datetime(2106, 2, 7, 6, 28, 15, tzinfo=UTC),  # the last second
            message_type="image.resize",
            user_id="guest",
            app_id="billing",
        ),
        commands.Basic.Properties(headers={}),
        commands.Basic.Properties(headers={"": "", "false": False}),
    ],
    ids=["none", "every property", "empty table", "empty strings"],
)
def test_any_properties_of_the_types_read_here(properties: commands.Basic.Properties) -> None:
    same_as_pamqp(header_frame(properties, body_size=2**40))


def test_the_deliver_method_and_the_body() -> None:
    same_as_pamqp(deliver_frame())
    same_as_pamqp(
        deliver_frame(
            consumer_tag="", delivery_tag=2**63 - 1, redelivered=True, exchange="", routing_key=""
        )
    )
    same_as_pamqp(deliver_frame(routing_key="задача", consumer_tag="c" * 255))
    body = same_as_pamqp(pamqp.frame.marshal(ContentBody(b'{"width": 128}'), 3))
    assert isinstance(body, ContentBody)
    empty = pamqp.frame.marshal(ContentBody(b""), 3)  # never sent: pamqp refuses it
    assert unmarshal_delivery_frame(empty) is None


def _header_by_hand(flag_words: bytes, properties: bytes) -> bytes:
    """A content header frame of a 42-byte body with these flags and properties."""
    payload = struct.pack(">HHQ", 60, 0, 42) + flag_words + properties
    return struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"


@pytest.mark.parametrize(
    "data",
    [
        # A table value of another type: pamqp reads it.
        header_frame(commands.Basic.Properties(headers={"x-death": [{"count": 1}]})),
        header_frame(commands.Basic.Properties(headers={"price": Decimal("1.5")})),
        header_frame(commands.Basic.Properties(headers={"nested": {"a": "b"}})),
        header_frame(commands.Basic.Properties(headers={"f": 1.5})),
        # Milliseconds (pamqp's guess above the year 2106).
        header_frame(commands.Basic.Properties(timestamp=datetime(2200, 1, 1, tzinfo=UTC))),
        # cluster_id, and a second word of flags.
        _header_by_hand(struct.pack(">H", 1 << 2), b"\x03eu1"),
        _header_by_hand(struct.pack(">HH", 1, 0), b""),
        # Other methods, other frames.
        pamqp.frame.marshal(
            commands.Basic.GetOk(delivery_tag=1, exchange="", routing_key="", message_count=0), 1
        ),
        pamqp.frame.marshal(commands.Basic.Ack(delivery_tag=1), 1),
        pamqp.frame.marshal(commands.Channel.CloseOk(), 1),
    ],
    ids=[
        "array",
        "decimal",
        "table",
        "float",
        "milliseconds",
        "cluster_id",
        "flag words",
        "get-ok",
        "ack",
        "close-ok",
    ],
)
def test_what_is_not_read_here_is_left_to_pamqp(data: bytes) -> None:
    assert unmarshal_delivery_frame(data) is None
    pamqp.frame.unmarshal(data)  # which reads it


def _text(value: bytes) -> bytes:
    return bytes([len(value)]) + value


def test_text_that_is_not_utf8_and_lengths_that_do_not_add_up_are_left_to_pamqp() -> None:
    """pamqp reads a long string that is not UTF-8 as bytes, and fails on a short one
    (the worker's :func:`tolerate_unreadable_headers` then dead-letters the message)."""
    latin = header_frame(commands.Basic.Properties(headers={"name": "Zoë"}))
    not_utf8 = latin.replace("Zoë".encode(), "Zoë".encode("latin-1") + b" ")
    assert unmarshal_delivery_frame(not_utf8) is None
    assert pamqp.frame.unmarshal(not_utf8)[2].properties.headers == {"name": b"Zo\xeb "}

    bad_id = header_frame(commands.Basic.Properties(message_id="id-é"))
    bad_id = bad_id.replace("é".encode(), b"\xff\xfe")
    assert unmarshal_delivery_frame(bad_id) is None
    tolerate_unreadable_headers()
    unreadable = pamqp.frame.unmarshal(bad_id)[2].properties.headers
    assert UNREADABLE_PROPERTIES in unreadable

    # A table whose length says more than its entries hold, and a short string that
    # runs past the frame.
    entry = _text(b"k") + b"S" + struct.pack(">I", 1) + b"v"
    flags = struct.pack(">H", 1 << 13)
    table = _header_by_hand(flags, struct.pack(">I", len(entry)) + entry)
    assert same_as_pamqp(table).headers == {"k": "v"}
    longer = _header_by_hand(flags, struct.pack(">I", len(entry) + 1) + entry + b"\x00")
    assert unmarshal_delivery_frame(longer) is None
    deliver = deliver_frame(routing_key="abc")
    past_the_end = deliver.replace(_text(b"abc"), bytes([200]) + b"abc")
    assert unmarshal_delivery_frame(past_the_end) is None
