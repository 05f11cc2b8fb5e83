"""The acks of one channel (broker_jobs.worker.acks) against a real broker: which
deliveries one ``multiple`` ack may cover, and which it must never cover."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Iterator

import aio_pika
import pytest
from aiormq.abc import ChannelFrame
from pamqp.heartbeat import Heartbeat

from broker_jobs.worker.acks import STRAGGLER_WAIT, ChannelAcks
from tests.support import Broker, wait_until

pytestmark = pytest.mark.broker


def queue_of(broker: Broker, name: str, count: int) -> None:
    with broker.connection("test acks setup") as connection:
        channel = connection.channel()
        channel.queue_declare(name, durable=True)
        for number in range(1, count + 1):
            channel.basic_publish("", name, str(number).encode())


@contextlib.contextmanager
def filled_queue(broker: Broker, name: str, count: int) -> Iterator[str]:
    """The queue ``name`` holding the bodies ``1`` ... ``count`` (:func:`queue_of`),
    deleted on leaving."""
    queue_of(broker, name, count)
    try:
        yield name
    finally:
        with broker.connection("test acks cleanup") as connection:
            connection.channel().queue_delete(name)


async def settle(
    broker: Broker,
    queue: str,
    step: Callable[[ChannelAcks], object],
    *,
    count: int = 5,
    flush: bool = True,
) -> None:
    """Take the queue's ``count`` deliveries on one channel (tags 1 to ``count``), let
    ``step`` settle some of them through a ChannelAcks, ack what waits for a frame
    (as the worker's session does before it closes) unless ``flush`` is false, then
    close the channel: what it did not ack goes back to the queue."""
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=count)
        underlay = await channel.get_underlay_channel()
        acks = ChannelAcks(underlay)
        taken: list[int] = []
        got_all = asyncio.Event()

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            assert message.delivery_tag is not None
            acks.taken(message.delivery_tag)
            taken.append(message.delivery_tag)
            if len(taken) == count:
                got_all.set()

        await (await channel.get_queue(queue)).consume(take)
        await asyncio.wait_for(got_all.wait(), 30)
        assert taken == list(range(1, count + 1))
        outcome = step(acks)
        if asyncio.iscoroutine(outcome):
            await outcome
        if flush:
            await acks.flush()
        assert not underlay.is_closed, "the channel was closed (an ack the broker refused?)"


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
    with filled_queue(broker, f"{namespace}.acks", 5) as name:
        yield name


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


def test_a_recorded_delivery_behind_one_in_hand_is_acked_after_a_short_wait(
    broker: Broker, queue: str
) -> None:
    """2-5 are recorded while 1 is in hand: no ``multiple`` frame can cover them, so
    they wait (``STRAGGLER_WAIT``) for one, then are acked one by one without a flush."""

    async def step(acks: ChannelAcks) -> None:
        await acks.ack_many([2, 3, 4, 5])
        assert acks.waiting == 4
        async with asyncio.timeout(10):
            while acks.waiting:
                await asyncio.sleep(0.01)  # polling the books, not timing them

    asyncio.run(settle(broker, queue, step, flush=False))
    assert left_in(broker, queue, 1) == [b"1"]


def test_concurrent_single_and_multiple_settlements_never_settle_a_tag_twice(
    broker: Broker, namespace: str
) -> None:
    """300 deliveries settled by concurrent tasks, in a shuffled order: single acks,
    nacks and batches of ``ack_many``. aiormq's write queue holds ten frames, so many
    frames wait for room at once; a ``multiple`` ack overtaking the single settlement
    of a tag it covers would settle that tag twice, and the broker would close the
    channel. Only the nacked deliveries go back."""
    name = f"{namespace}.acks-concurrent"
    count = 300
    queue_of(broker, name, count)
    order = random.Random(27)
    tags = list(range(1, count + 1))
    order.shuffle(tags)
    nacked = sorted(tags[:30])
    singles = tags[30:100]
    batched = tags[100:]

    async def later(settlement: Awaitable[bool]) -> bool:
        # Spread over a few straggler waits: fresh frames arrive while others wait for
        # room, and while the acks of stragglers go out.
        await asyncio.sleep(order.random() * 4 * STRAGGLER_WAIT)
        return await settlement

    async def step(acks: ChannelAcks) -> None:
        settlements = [acks.nack(tag) for tag in nacked] + [acks.ack(tag) for tag in singles]
        settlements += [acks.ack_many(batched[at : at + 7]) for at in range(0, len(batched), 7)]
        order.shuffle(settlements)
        assert all(await asyncio.gather(*(later(settlement) for settlement in settlements)))

    try:
        asyncio.run(settle(broker, name, step, count=count))
        assert left_in(broker, name, len(nacked)) == sorted(str(tag).encode() for tag in nacked)
    finally:
        with broker.connection("test acks cleanup") as connection:
            connection.channel().queue_delete(name)


def test_acks_at_once_settle_now_or_change_nothing_where_they_would_wait(
    broker: Broker, queue: str
) -> None:
    """``ack_at_once`` and ``ack_many_at_once`` settle here and now when nothing of the
    channel is being sent: 1 alone, then 2 and 3 in one ``multiple`` frame. While a
    frame waits in aiormq's write queue, or another settlement holds the channel's
    turn, they answer None and leave the books as they were: 4 is still in hand
    (acked later, the ordinary way), 5 never settled comes back."""

    async def step(acks: ChannelAcks) -> None:
        assert acks.ack_at_once(1) is True
        assert acks.ack_many_at_once([2, 3]) is True
        assert acks.waiting == 0
        write_queue = acks.channel.connection.write_queue
        write_queue.put_nowait(ChannelFrame.marshall(0, [Heartbeat()]))
        assert acks.ack_at_once(4) is None
        assert acks.ack_many_at_once([4]) is None
        assert acks.waiting == 0  # 4 is still in hand: not marked recorded
        async with asyncio.timeout(10):
            while not write_queue.empty():  # until aiormq's writer takes the queued frame
                await asyncio.sleep(0)
        async with acks._sending:  # another settlement's turn
            assert acks.ack_at_once(4) is None
        assert await acks.ack(4)

    asyncio.run(settle(broker, queue, step))
    assert left_in(broker, queue, 1) == [b"5"]
