"""The sync publisher's own read of ``basic.ack`` frames (``publish/confirm_frames.py``):
the acks pika would decode from the same bytes, and None for anything else, so that
pika's decoder (and its callbacks) take it."""

from __future__ import annotations

import pika.frame
import pika.spec
import pytest

from broker_jobs.publish.confirm_frames import read_acks


def ack(tag: int, *, multiple: bool = False, channel: int = 1) -> bytes:
    return pika.frame.Method(channel, pika.spec.Basic.Ack(tag, multiple)).marshal()


@pytest.mark.parametrize("tag", [1, 255, 2**32 + 7, 2**64 - 1])
@pytest.mark.parametrize("multiple", [False, True])
def test_one_ack_reads_as_pika_encodes_it(tag: int, multiple: bool) -> None:
    assert read_acks(ack(tag, multiple=multiple), 1) == [(tag, multiple)]


def test_acks_back_to_back_read_in_order() -> None:
    data = ack(3) + ack(5, multiple=True) + ack(6)
    assert read_acks(data, 1) == [(3, False), (5, True), (6, False)]


def test_an_ack_of_another_channel_is_left_to_pika() -> None:
    assert read_acks(ack(1, channel=2), 1) is None
    assert read_acks(ack(1) + ack(2, channel=2), 1) is None


@pytest.mark.parametrize(
    "other",
    [
        pika.frame.Method(1, pika.spec.Basic.Nack(4, multiple=False)).marshal(),
        pika.frame.Method(1, pika.spec.Channel.Close(404, "NOT_FOUND", 60, 40)).marshal(),
        pika.frame.Heartbeat().marshal(),
        pika.frame.Method(1, pika.spec.Basic.Return(312, "NO_ROUTE", "x", "y")).marshal(),
    ],
    ids=["nack", "channel close", "heartbeat", "return"],
)
def test_anything_but_acks_is_left_to_pika(other: bytes) -> None:
    assert read_acks(other, 1) is None
    assert read_acks(ack(1) + other, 1) is None
    assert read_acks(other + ack(1), 1) is None


def test_a_partial_or_damaged_frame_is_left_to_pika() -> None:
    whole = ack(9)
    assert read_acks(b"", 1) is None
    assert read_acks(whole[:-1], 1) is None
    assert read_acks(whole + whole[:10], 1) is None
    assert read_acks(whole[:-1] + b"\x00", 1) is None  # no frame end
    assert read_acks(whole[:-2] + b"\x02" + whole[-1:], 1) is None  # an unknown flag
