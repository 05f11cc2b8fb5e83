"""A read of the broker's publisher confirms (``basic.ack`` frames) in one step.

What a confirmed publisher reads is almost always one ``basic.ack`` frame, or a few
back to back. pika decodes each through its generic frame decoder (a ``Method``
frame, a ``Basic.Ack`` object) and dispatches it through its callback registry (the
callbacks of the channel and method looked up by name, each wrapped): about a third
of the CPU a confirmed publish spends in pika. :func:`read_acks` reads a buffer of
nothing but whole ``basic.ack`` frames of one channel directly; anything else (a
nack, a return, a heartbeat, a close, a partial frame) gives None, and pika reads the
buffer as before. tests/test_confirm_frames.py compares it with pika's encoding.
"""

from __future__ import annotations

from broker_jobs.amqp.frame_layout import (
    BASIC,
    BASIC_ACK,
    FRAME_END,
    METHOD,
    SETTLEMENT,
    SETTLEMENT_PAYLOAD,
)


def read_acks(data: bytes, channel: int) -> list[tuple[int, bool]] | None:
    """The ``(delivery_tag, multiple)`` of each ``basic.ack`` in ``data`` when it is
    nothing but whole ``basic.ack`` frames of ``channel``; None otherwise."""
    if not data or len(data) % SETTLEMENT.size:
        return None
    acks = []
    for kind, on_channel, size, class_id, method_id, tag, flags, end in SETTLEMENT.iter_unpack(
        data
    ):
        if (
            kind != METHOD
            or on_channel != channel
            or size != SETTLEMENT_PAYLOAD
            or class_id != BASIC
            or method_id != BASIC_ACK
            or end != FRAME_END
            or flags > 1  # bits a later protocol might add: pika decides
        ):
            return None
        acks.append((tag, flags == 1))
    return acks
