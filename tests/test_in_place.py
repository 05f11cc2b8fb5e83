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

from broker_jobs.worker.in_place import InPlaceConsumer, deliver_in_place
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
