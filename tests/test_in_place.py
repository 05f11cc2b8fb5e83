"""Deliveries taken as aiormq reads them (broker_jobs.worker.in_place), on a real
broker: the worker's consumer runs in the channel's reader, not in a task per
delivery, and any other consumer on the channel still gets its deliveries the aiormq
way. Fails if the installed aiormq's internals stop taking the replacement."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aio_pika
import pytest
from aiormq.abc import DeliveredMessage
from aiormq.tools import awaitable
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from broker_jobs.worker.in_place import InPlaceConsumer, _TakenInPlace, deliver_in_place
from tests.support import Broker

pytestmark = pytest.mark.broker


@pytest.fixture
def queues(broker: Broker, namespace: str) -> Iterator[tuple[str, str]]:
    names = (f"{namespace}.in-place", f"{namespace}.aiormq-way")
    with broker.connection("test in place setup") as connection:
        channel = connection.channel()
        for name in names:
            channel.queue_declare(name, durable=True)
            for number in range(3):
                channel.basic_publish("", name, str(number).encode())
    yield names
    with broker.connection("test in place cleanup") as connection:
        for name in names:
            connection.channel().queue_delete(name)


def test_the_worker_consumer_runs_in_the_reader_and_others_the_aiormq_way(
    broker: Broker, queues: tuple[str, str]
) -> None:
    in_place_queue, aiormq_queue = queues

    async def consume() -> tuple[list[bytes], list[bytes], list[str]]:
        taken: list[bytes] = []
        awaited: list[bytes] = []
        tasks: list[str] = []  # the coroutines the channel ran as tasks of their own
        all_six = asyncio.Event()

        def take(delivered: DeliveredMessage) -> None:
            taken.append(delivered.body)
            if len(taken) + len(awaited) == 6:
                all_six.set()

        async def the_aiormq_way(delivered: DeliveredMessage) -> None:
            awaited.append(delivered.body)
            await channel.basic_ack(delivered.delivery_tag)
            if len(taken) + len(awaited) == 6:
                all_six.set()

        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await (await connection.channel()).get_underlay_channel()
            assert deliver_in_place(channel), "this aiormq lacks what deliver_in_place needs"
            create_task = channel.create_task

            def counted(coroutine: Any) -> Any:
                tasks.append(coroutine.__qualname__)
                return create_task(coroutine)

            channel.create_task = counted  # type: ignore[method-assign]
            await channel.basic_consume(in_place_queue, InPlaceConsumer(take), no_ack=True)
            await channel.basic_consume(aiormq_queue, the_aiormq_way)
            await asyncio.wait_for(all_six.wait(), 30)
        return taken, awaited, tasks

    taken, awaited, tasks = asyncio.run(consume())
    assert taken == [b"0", b"1", b"2"]
    assert sorted(awaited) == [b"0", b"1", b"2"]
    # A task for each of the aiormq way's deliveries, none for those taken in place
    # (aiormq runs a plain callable's result wrapped: ``awaitable.<locals>.wrap``).
    assert [name for name in tasks if name != "Channel.rpc"] == [
        "test_the_worker_consumer_runs_in_the_reader_and_others_the_aiormq_way.<locals>"
        ".consume.<locals>.the_aiormq_way"
    ] * 3


def test_deliveries_that_begin_with_the_channel_queue_empty_are_taken_as_the_connection_reads(
    broker: Broker, namespace: str
) -> None:
    """Deliveries published once consuming has begun reach the in-place consumer
    straight from the connection's reader: none of their frames goes through the
    channel's frame queue (a loop turn each, for the channel's reader task)."""
    name = f"{namespace}.in-place-reader"

    async def consume() -> tuple[list[bytes], list[object]]:
        taken: list[bytes] = []
        queued: list[object] = []  # frames that went through the channel's queue
        all_three = asyncio.Event()

        def take(delivered: DeliveredMessage) -> None:
            taken.append(delivered.body)
            if len(taken) == 3:
                all_three.set()

        connection = await aio_pika.connect(broker.url)
        async with connection:
            publishing = await connection.channel()
            await publishing.declare_queue(name, durable=True)
            channel = await (await connection.channel()).get_underlay_channel()
            assert deliver_in_place(channel), "this aiormq lacks what deliver_in_place needs"
            put_nowait = channel.frames.put_nowait

            def recorded(item: tuple[int, object]) -> None:
                queued.append(item[1])
                put_nowait(item)

            channel.frames.put_nowait = recorded  # type: ignore[method-assign]
            await channel.basic_consume(name, InPlaceConsumer(take), no_ack=True)
            for body in (b"0", b"1", b"2"):
                await publishing.default_exchange.publish(aio_pika.Message(body), name)
            await asyncio.wait_for(all_three.wait(), 30)
            await publishing.queue_delete(name)
        return taken, queued

    taken, queued = asyncio.run(consume())
    assert taken == [b"0", b"1", b"2"]
    content = (commands.Basic.Deliver, ContentHeader, ContentBody)
    assert not [frame for frame in queued if isinstance(frame, content)]
    assert queued, "nothing went through the channel's queue: the recording is broken"


class _Channel:
    """What ``_TakenInPlace`` needs of a channel: its number (for the message)."""

    number = 1


def _deliver(tag: int) -> commands.Basic.Deliver:
    return commands.Basic.Deliver(consumer_tag="in-place", delivery_tag=tag, routing_key="q")


def test_a_delivery_is_assembled_from_its_frames_and_nothing_overtakes_a_queued_frame() -> None:
    """The state machine alone (no broker: what it is fed is the point): a body in two
    frames is joined; a delivery beginning while a frame waits in the channel's queue
    goes through the queue behind it; a frame that does not continue a held delivery
    puts the held frames into the queue first, in order."""

    async def feed() -> tuple[list[DeliveredMessage], list[object]]:
        taken: list[DeliveredMessage] = []
        frames: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
        consumer = awaitable(InPlaceConsumer(taken.append))  # type: ignore[arg-type]
        consumers = {"in-place": consumer}  # as aiormq keeps a consumer
        in_place = _TakenInPlace(_Channel(), consumers, frames)  # type: ignore[arg-type]
        await in_place.put((0, _deliver(1)))
        await in_place.put((0, ContentHeader(body_size=5)))
        await in_place.put((0, ContentBody(b"abc")))
        assert not taken
        assert frames.empty()
        await in_place.put((0, ContentBody(b"de")))
        assert [message.body for message in taken] == [b"abcde"]
        frames.put_nowait((0, "an earlier frame"))
        await in_place.put((0, _deliver(2)))  # behind the earlier frame
        await in_place.put((0, ContentHeader(body_size=0)))
        queued = [frames.get_nowait()[1] for _ in range(frames.qsize())]
        await in_place.put((0, _deliver(3)))
        await in_place.put((0, commands.Basic.Cancel(consumer_tag="in-place")))
        queued += [frames.get_nowait()[1] for _ in range(frames.qsize())]
        return taken, queued

    taken, queued = asyncio.run(feed())
    assert [message.delivery_tag for message in taken] == [1]
    assert [type(frame).__name__ for frame in queued] == [
        "str", "Deliver", "ContentHeader", "Deliver", "Cancel"
    ]  # fmt: skip
    delivers = [frame for frame in queued if isinstance(frame, commands.Basic.Deliver)]
    assert [frame.delivery_tag for frame in delivers] == [2, 3]
