"""The publisher's own marshaling of a publish (``publish/frames.py``): the same bytes
as pika's, for every shape of message the publishers send; None where it does not
encode a value, so that pika's path (and its errors) takes the message."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pika.frame
import pika.spec
import pytest

from broker_jobs.envelope import Job, WireMessage, encode
from broker_jobs.publish.frames import publish_frames
from broker_jobs.publish.pika_link import pika_properties
from topology.priority import Priority

BODY_MAX = 131072 - 8  # pika's default frame_max less a frame's header and end


def pika_frames(
    channel: int, exchange: str, routing_key: str, message: WireMessage, body_max: int
) -> list[bytes]:
    """What pika's ``Connection._send_message`` hands to its output."""
    body = message.body
    method = pika.spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True)
    frames = [
        pika.frame.Method(channel, method).marshal(),
        pika.frame.Header(channel, len(body), pika_properties(message)).marshal(),
    ]
    frames += [
        pika.frame.Body(channel, body[start : start + body_max]).marshal()
        for start in range(0, len(body), body_max)
    ]
    return frames


def job(**fields: Any) -> Job:
    return Job.model_validate({"task": "image.resize", "payload": {"width": 128}, **fields})


SHAPES = {
    "defaults": encode(job()),
    "every header": encode(
        job(
            idempotency_key="invoice-42",
            attempt=3,
            due_at=datetime(2030, 1, 1, tzinfo=UTC),
            priority=Priority.HIGH,
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            tracestate="vendor=value",
        )
    ),
    "unicode": encode(job(payload={"name": "Zoë ☃"}, id="ид-1", idempotency_key="ключ")),
    "large attempt": encode(job(attempt=2**31 - 1)),
    "no optional property": replace(
        encode(job()), content_encoding=None, timestamp=None, headers={}
    ),
    "several body frames": encode(job(payload={"blob": "x" * 300_000})),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_frames_are_pikas_bytes(shape: str) -> None:
    message = SHAPES[shape]
    for channel, body_max in ((1, BODY_MAX), (7, 4096 - 8)):
        ours = publish_frames(channel, "jobs.work", "image.resize@high:3", message, body_max)
        assert ours == pika_frames(channel, "jobs.work", "image.resize@high:3", message, body_max)


def test_a_body_as_long_as_a_frame_takes_one_frame_and_an_empty_body_none() -> None:
    exact = replace(SHAPES["defaults"], body=b"x" * 100)
    assert publish_frames(1, "", "q", exact, 100) == pika_frames(1, "", "q", exact, 100)
    assert len(publish_frames(1, "", "q", exact, 100) or []) == 3
    empty = replace(SHAPES["defaults"], body=b"")
    assert publish_frames(1, "", "q", empty, 100) == pika_frames(1, "", "q", empty, 100)
    assert len(publish_frames(1, "", "q", empty, 100) or []) == 2


@pytest.mark.parametrize(
    "headers",
    [{"flag": True}, {"big": 2**31}, {"small": -(2**31) - 1}, {"ratio": 0.5}, {"raw": b"x"}],
)
def test_other_header_values_are_left_to_pika(headers: dict[str, Any]) -> None:
    message = replace(SHAPES["defaults"], headers=headers)
    assert publish_frames(1, "jobs.work", "image.resize", message, BODY_MAX) is None


def test_a_short_string_too_long_is_left_to_pika() -> None:
    message = SHAPES["defaults"]
    assert publish_frames(1, "jobs.work", "x" * 256, message, BODY_MAX) is None
    assert publish_frames(1, "jobs.work", "é" * 128, message, BODY_MAX) is None  # 256 bytes
    with pytest.raises(pika.exceptions.ShortStringTooLong):
        pika_frames(1, "jobs.work", "x" * 256, message, BODY_MAX)
