"""The byte layout of the AMQP 0-9-1 frames broker-jobs reads or writes itself
instead of through its drivers' generic codecs (AMQP 0-9-1, 2.3.5 and 4.2.3): the
publisher's publish frames and its confirms, the worker's deliveries and its acks.
One description, so that a reader and a writer of one frame cannot disagree."""

from __future__ import annotations

import struct

#: Frame types.
METHOD, HEADER, BODY = 1, 2, 3
#: Every frame starts with its type (octet), channel (short) and payload size (long)...
FRAME_HEADER = struct.Struct(">BHI")
#: ... and ends with this octet.
FRAME_END = 0xCE
#: A frame's bytes besides its payload.
FRAME_OVERHEAD = FRAME_HEADER.size + 1

#: The Basic class, and its methods that settle a delivery or confirm a publish.
BASIC = 60
BASIC_ACK, BASIC_NACK = 80, 120
#: A ``basic.ack`` or ``basic.nack`` method frame, whole: frame type, channel, payload
#: size (:data:`SETTLEMENT_PAYLOAD`), class, method, delivery tag, bits (multiple;
#: requeue, a nack's), frame end.
SETTLEMENT = struct.Struct(">BHIHHQBB")
SETTLEMENT_PAYLOAD = SETTLEMENT.size - FRAME_OVERHEAD
