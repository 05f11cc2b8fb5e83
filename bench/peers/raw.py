"""The reference: a plain aio-pika consumer (manual ack after the no-op) and plain pika
(one by one) / aio-pika (pipelined) publishers with confirms, on a queue of our own.

    python -m bench.peers.raw consume URL QUEUE PREFETCH    # the worker process
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import aio_pika.abc
import pika

from bench.peers.common import (
    FamilyBase,
    OwnQueueLane,
    Variant,
    WorkerProcess,
    python_command,
    record,
)
from broker_jobs.worker import WorkerSettings

NAME = "raw"
#: The prefetch the others get by default for 8 jobs at once: broker-jobs' 2 x 8 + 64.
PREFETCH = WorkerSettings(concurrency=8).prefetch_count


def body(seq: int) -> bytes:
    return json.dumps({"seq": seq}, separators=(",", ":")).encode()


class RawPublisher:
    """pika ``BlockingConnection`` + ``confirm_delivery()``: each publish waits for its
    confirm; the batch is aio-pika, every publish in flight at once (``gather``)."""

    def __init__(self, url: str, queue: str) -> None:
        self._url, self._queue = url, queue
        self._connection = pika.BlockingConnection(pika.URLParameters(url))
        self._channel = self._connection.channel()
        self._channel.confirm_delivery()
        self._properties = pika.BasicProperties(delivery_mode=2, content_type="application/json")

    def publish(self, seq: int, delay: float | None = None) -> None:
        if delay is not None:
            raise NotImplementedError("raw AMQP has no delayed delivery")
        self._channel.basic_publish("", self._queue, body(seq), self._properties, mandatory=True)

    def publish_batch(self, seqs: range) -> None:
        asyncio.run(publish_pipelined(self._url, self._queue, seqs))

    def close(self) -> None:
        with contextlib.suppress(pika.exceptions.AMQPError):
            self._connection.close()


async def publish_pipelined(url: str, queue: str, seqs: range) -> None:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = channel.default_exchange
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(body(seq), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    queue,
                    mandatory=True,
                )
                for seq in seqs
            )
        )
    finally:
        await connection.close()


@dataclass
class RawLane(OwnQueueLane):
    PREFIX = "raw"

    def declare(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            connection.channel().queue_declare(
                self.queue, durable=True, arguments={"x-queue-type": self.queue_type}
            )
        finally:
            connection.close()

    def publisher(self) -> RawPublisher:
        return RawPublisher(self.url, self.queue)

    def fill(self, seqs: range) -> None:
        asyncio.run(publish_pipelined(self.url, self.queue, seqs))

    def worker(self, variant: Variant, workdir: Path) -> WorkerProcess:
        return consumer_process(variant.name, self.url, self.queue, workdir)


def consumer_process(name: str, url: str, queue: str, workdir: Path) -> WorkerProcess:
    """The raw consumer of ``queue`` (any body whose JSON has a ``seq``), as a worker."""
    argv = python_command("-m", "bench.peers.raw", "consume", url, queue)
    return WorkerProcess(name, [*argv, str(PREFETCH)], workdir)


class RawFamily(FamilyBase):
    name = NAME
    delay_na: str | None = "n/a: raw AMQP has no delayed delivery"

    def lane(self, url: str, queue_type: str) -> RawLane:
        return RawLane(url, queue_type)

    def settings(self) -> dict[str, str]:
        return {
            "publish": "pika BlockingConnection, confirm_delivery(), basic_publish"
            " (persistent, mandatory) one at a time; batched: aio-pika"
            " channel(publisher_confirms=True), every publish in flight (asyncio.gather)",
            "worker": f"aio-pika, one connection and channel, set_qos(prefetch_count={PREFETCH}),"
            " queue.consume(callback): json.loads of the body, the record, message.ack()",
            "queue": "durable, x-queue-type classic|quorum, default exchange",
        }


VARIANTS = (Variant("raw aio-pika", NAME),)


# -- the consumer process ----------------------------------------------------------------


async def consume(url: str, queue_name: str, prefetch: int) -> None:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=prefetch)
    queue = await channel.get_queue(queue_name, ensure=False)

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        record(json.loads(message.body)["seq"])
        await message.ack()

    await queue.consume(on_message)
    await asyncio.Event().wait()  # until SIGTERM


def main(argv: list[str]) -> int:
    if argv[:1] != ["consume"] or len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(consume(argv[1], argv[2], int(argv[3])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
