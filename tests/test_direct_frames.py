"""Settlement frames written to the transport at once (broker_jobs.worker.direct_frames),
on a real broker: an ack with nothing queued before it is written there and then, and
settles its delivery; a frame already in aiormq's write queue, or a closed channel,
leaves the frame to aiormq's path. Fails if the installed aiormq's internals stop
taking the direct write."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aio_pika
import pamqp.frame
import pytest
from aiormq.abc import ChannelFrame
from pamqp import commands
from pamqp.heartbeat import Heartbeat

from broker_jobs.worker.acks import ChannelAcks
from broker_jobs.worker.direct_frames import DirectFrames, Settlement, settlement_bytes
from tests.support import Broker
from tests.test_acks import filled_queue, left_in

pytestmark = pytest.mark.broker


@pytest.fixture
def queue(broker: Broker, namespace: str) -> Iterator[str]:
    with filled_queue(broker, f"{namespace}.direct-frames", 3) as name:
        yield name


def test_an_ack_with_nothing_queued_is_written_at_once_and_a_queued_frame_goes_first(
    broker: Broker, queue: str
) -> None:
    """Delivery 1 is acked directly (nothing in aiormq's write queue); while a frame
    waits in that queue, the ack of 2 is not written directly (it would overtake the
    frame) and goes the aiormq way through ChannelAcks; 3 stays unacked and comes back
    when the channel closes. A closed channel takes no direct write."""

    async def settle() -> tuple[bool, bool, bool]:
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=3)
            underlay = await channel.get_underlay_channel()
            acks = ChannelAcks(underlay)
            direct = DirectFrames(underlay)
            taken = asyncio.Queue[int]()

            async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                assert message.delivery_tag is not None
                acks.taken(message.delivery_tag)
                taken.put_nowait(message.delivery_tag)

            await (await channel.get_queue(queue)).consume(take)
            tags = [await asyncio.wait_for(taken.get(), 30) for _ in range(3)]
            assert tags == [1, 2, 3]
            write_queue = underlay.connection.write_queue
            acked_at_once = direct.write(commands.Basic.Ack(delivery_tag=1))
            assert write_queue.empty(), "the direct ack went through aiormq's queue"
            acks.forget(1)  # settled above, outside the books
            # A frame waits in aiormq's queue (no loop turn has let its writer take it).
            write_queue.put_nowait(ChannelFrame.marshall(0, [Heartbeat()]))
            overtook = direct.write(commands.Basic.Ack(delivery_tag=2))
            assert await acks.ack(2)  # the aiormq way, after the queued frame
            await channel.close()
            after_close = direct.write(commands.Basic.Ack(delivery_tag=3))
        return acked_at_once, overtook, after_close

    acked_at_once, overtook, after_close = asyncio.run(settle())
    assert acked_at_once, "this aiormq lacks what DirectFrames needs: acks take its queue"
    assert not overtook
    assert not after_close
    assert left_in(broker, queue, 1) == [b"3"]


@pytest.mark.parametrize(
    "frame",
    [
        commands.Basic.Ack(delivery_tag=1),
        commands.Basic.Ack(delivery_tag=2**63 - 1, multiple=True),
        commands.Basic.Nack(delivery_tag=7, requeue=True),
        commands.Basic.Nack(delivery_tag=8, multiple=True, requeue=False),
        commands.Basic.Nack(delivery_tag=9, multiple=True, requeue=True),
    ],
)
@pytest.mark.parametrize("channel", [1, 65535])
def test_a_settlement_is_packed_as_pamqp_marshals_it(frame: Settlement, channel: int) -> None:
    assert settlement_bytes(frame, channel) == pamqp.frame.marshal(frame, channel)
