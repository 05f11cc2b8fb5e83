"""The acks of one channel (broker_jobs.worker.acks) against a real broker: which
deliveries one ``multiple`` ack may cover, and which it must never cover."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import aio_pika
import pytest

from broker_jobs.worker.acks import ChannelAcks
from tests.support import Broker, wait_until

pytestmark = pytest.mark.broker


def queue_of_five(broker: Broker, name: str) -> None:
    with broker.connection("test acks setup") as connection:
        channel = connection.channel()
        channel.queue_declare(name, durable=True)
        for number in range(1, 6):
            channel.basic_publish("", name, str(number).encode())


async def settle(broker: Broker, queue: str, step: Callable[[ChannelAcks], object]) -> None:
    """Take the queue's five deliveries on one channel (tags 1-5), let ``step`` settle
    some of them through a ChannelAcks, then close the channel: what it did not ack
    goes back to the queue."""
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=5)
        underlay = await channel.get_underlay_channel()
        acks = ChannelAcks(underlay)
        taken: list[int] = []
        got_five = asyncio.Event()

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            assert message.delivery_tag is not None
            acks.taken(message.delivery_tag)
            taken.append(message.delivery_tag)
            if len(taken) == 5:
                got_five.set()

        await (await channel.get_queue(queue)).consume(take)
        await asyncio.wait_for(got_five.wait(), 30)
        assert taken == [1, 2, 3, 4, 5]
        outcome = step(acks)
        if asyncio.iscoroutine(outcome):
            await outcome


def left_in(broker: Broker, queue: str, expected: int) -> list[bytes]:
    """The bodies back in ``queue``, read once it holds ``expected`` or more (the broker
    requeues a closed channel's unacked deliveries on its own time)."""
    with broker.connection("test acks check") as connection:
        channel = connection.channel()
        wait_until(
            lambda: channel.queue_declare(queue, passive=True).method.message_count >= expected,
            within=10,
            what=f"{expected} deliveries back in {queue}",
        )
        bodies = []
        while True:
            method, _properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return sorted(bodies)
            bodies.append(body)


@pytest.fixture
def queue(broker: Broker, namespace: str) -> Iterator[str]:
    name = f"{namespace}.acks"
    queue_of_five(broker, name)
    yield name
    with broker.connection("test acks cleanup") as connection:
        connection.channel().queue_delete(name)


def test_a_left_delivery_is_never_covered_by_a_later_multiple_ack(
    broker: Broker, queue: str
) -> None:
    """Delivery 2 is left (not started: the broker is to give it back); 1, 3, 4 and
    5 succeed. The acks may take 1 in one frame and 3-5 in others, but never 2."""

    async def step(acks: ChannelAcks) -> None:
        acks.forget(2)
        await acks.ack_many([1, 3, 4, 5])

    asyncio.run(settle(broker, queue, step))
    assert left_in(broker, queue, 1) == [b"2"]


def test_deliveries_acked_out_of_order_are_all_acked_and_a_held_one_is_not(
    broker: Broker, queue: str
) -> None:
    """4, then 1 and 2, then 5 are recorded; 3 is still in hand when the channel
    closes: 3 alone goes back."""

    async def step(acks: ChannelAcks) -> None:
        await acks.ack_many([4])
        await acks.ack_many([1, 2])
        await acks.ack(5)

    asyncio.run(settle(broker, queue, step))
    assert left_in(broker, queue, 1) == [b"3"]


def test_nothing_is_acked_on_a_lost_channel(broker: Broker, queue: str) -> None:
    async def step(acks: ChannelAcks) -> None:
        assert acks.lose() == 5
        assert await acks.ack_many([1, 2, 3]) is False

    asyncio.run(settle(broker, queue, step))
    assert left_in(broker, queue, 5) == [b"1", b"2", b"3", b"4", b"5"]
