"""The worker's execution protocol over the memory broker.

Each delivery goes through :class:`~broker_jobs.worker.protocol.Runner`, the code a
real worker runs (decode and validate, claim in the store, the idempotency check,
the handler under its time limit, the retry policy, dead letters and their reasons,
follow-ups, record-then-ack); only the transport is memory: the channel whose acks
and dead-letter publishes the protocol makes, and a link that is always up.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import aio_pika
import aio_pika.abc
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from broker_jobs.app import App
from broker_jobs.due import seconds_until_due
from broker_jobs.envelope import WireMessage, decode
from broker_jobs.errors import BrokerJobsError, DecodeError, HandlerStuckError
from broker_jobs.store.base import Store
from broker_jobs.testing.memory_broker import MemoryBroker
from broker_jobs.testing.memory_publishers import MemoryAsyncPublisher
from broker_jobs.worker.acks import ChannelAcks
from broker_jobs.worker.daemon import check_transactions, task_queues
from broker_jobs.worker.delivery import Delivery
from broker_jobs.worker.execution import Executor
from broker_jobs.worker.link import BrokerLink
from broker_jobs.worker.protocol import Runner
from broker_jobs.worker.settings import ProtocolSettings


class MemoryExchange:
    """An exchange of the memory broker, as the protocol publishes dead letters to it."""

    def __init__(self, broker: MemoryBroker, name: str) -> None:
        self._broker = broker
        self.name = name

    async def publish(
        self, message: aio_pika.Message, routing_key: str, *, mandatory: bool = True, **_: Any
    ) -> None:
        if not self._broker.publish(self.name, routing_key, wire_of(message)) and mandatory:
            raise BrokerJobsError(f"the memory broker routed nothing for {routing_key!r}")


class MemoryChannel:
    """The channel of the protocol's acks (``ChannelAcks``) and dead letters."""

    is_closed = False

    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self._broker.ack(delivery_tag, multiple=multiple)

    async def basic_nack(
        self, delivery_tag: int, multiple: bool = False, requeue: bool = True
    ) -> None:
        del requeue  # the protocol only ever hands deliveries back
        self._broker.requeue(delivery_tag, multiple=multiple)

    async def get_exchange(self, name: str, *, ensure: bool = False) -> MemoryExchange:
        del ensure
        return MemoryExchange(self._broker, name)


class MemoryLink:
    """The worker's link to the memory broker: always up."""

    is_up = True

    def __init__(self, channel: MemoryChannel) -> None:
        self._channel = channel

    async def wait_up(self) -> aio_pika.abc.AbstractChannel:
        return cast(aio_pika.abc.AbstractChannel, self._channel)


def wire_of(message: aio_pika.Message) -> WireMessage:
    """The neutral form of a message the protocol publishes."""
    timestamp = message.timestamp
    return WireMessage(
        body=message.body,
        message_id=message.message_id,
        type=message.type,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        timestamp=int(timestamp.timestamp()) if isinstance(timestamp, datetime) else None,
        headers=dict(message.headers or {}),
    )


def delivery_of(
    tag: int, message: WireMessage, routing_key: str, acks: ChannelAcks, channel: MemoryChannel
) -> Delivery:
    """A delivery as aiormq would hand it to the worker."""
    stamp = message.timestamp
    properties = spec.Basic.Properties(
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        headers=dict(message.headers),
        delivery_mode=message.delivery_mode,
        message_id=message.message_id,
        timestamp=None if stamp is None else datetime.fromtimestamp(stamp, UTC),
        message_type=message.type,
    )
    delivered = DeliveredMessage(
        delivery=spec.Basic.Deliver(
            consumer_tag="memory",
            delivery_tag=tag,
            redelivered=False,
            exchange="",
            routing_key=routing_key,
        ),
        header=ContentHeader(body_size=len(message.body), properties=properties),
        body=message.body,
        channel=cast(Any, channel),
    )
    acks.taken(tag)
    return Delivery(delivered, acks)


@dataclass
class Waiting:
    """A delivery taken early (a job leaves the ladder a little before its due time):
    held by the harness until the test's clock reaches ``due``, as a worker holds it."""

    due: datetime
    tag: int
    message: WireMessage
    routing_key: str
    queue: str


class MemoryWorker:
    """Runs the app's tasks from the memory broker's queues, on the caller's loop."""

    def __init__(
        self,
        app: App,
        store: Store,
        broker: MemoryBroker,
        *,
        concurrency: int,
        worker_id: str,
        overrun_grace: float,
    ) -> None:
        self._app = app
        self._store = store
        self._broker = broker
        self._channel = MemoryChannel(broker)
        self._acks = ChannelAcks(cast(Any, self._channel))
        self._executor = Executor(concurrency)
        self._runner = Runner(
            app,
            store,
            executor=self._executor,
            publisher=MemoryAsyncPublisher(broker, app),
            link=cast(BrokerLink, MemoryLink(self._channel)),
            settings=ProtocolSettings(worker_id=worker_id, overrun_grace=overrun_grace),
        )
        self._queues = task_queues(app, tuple(spec.name for spec in app if spec.handler))
        self._waiting: list[Waiting] = []

    @property
    def next_due(self) -> datetime | None:
        """When the earliest delivery held for its due time falls due."""
        return min((waiting.due for waiting in self._waiting), default=None)

    @property
    def holding(self) -> int:
        return len(self._waiting)

    @property
    def outcomes(self) -> Counter[str]:
        """What the protocol did, by outcome (``succeeded``, ``retried``,
        ``dead:<reason>``, ``duplicate``, ...), since the worker was made."""
        return self._runner.outcomes.counts

    async def run_ready(self) -> int:
        """Run every delivery that is due now, and what they make due now (a retry
        without a delay, a follow-up), until none is left; how many were run."""
        ran = 0
        while started := self._start_due():
            await self._settled()
            ran += started
        return ran

    async def _settled(self) -> None:
        """Wait until every started delivery settled. A sync handler still running its
        overrun grace past its time limit is settled as a worker about to be replaced
        settles it (its attempt failed by its time limit: retried or dead-lettered), once
        the others settled; then :class:`HandlerStuckError` is raised, as the worker
        exits with code 70, and this worker is done (its thread may run on)."""
        overruns = self._runner.overruns
        settled = asyncio.ensure_future(self._runner.finish(math.inf))
        stuck = asyncio.ensure_future(overruns.seen_stuck.wait())
        try:
            await asyncio.wait({settled, stuck}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stuck.cancel()
        if overruns.seen_stuck.is_set():
            overruns.settle_stuck.set()
            await settled
            raise HandlerStuckError(overruns.ever_stuck, overruns.unrecorded)
        await settled

    def _start_due(self) -> int:
        now = self._broker.clock.now()
        due, self._waiting = (
            [w for w in self._waiting if w.due <= now],
            [w for w in self._waiting if w.due > now],
        )
        for queue, task in self._queues.items():
            if self._broker.depth(queue):  # as a worker refuses it at its start
                check_transactions(self._app, (task,), self._store)
            while (taken := self._broker.take(queue)) is not None:
                tag, message, routing_key = taken
                waiting = Waiting(now, tag, message, routing_key, queue)
                if (later := _due_at(message, now)) is not None:
                    waiting.due = later
                    self._waiting.append(waiting)
                else:
                    due.append(waiting)
        for waiting in due:
            task = self._queues[waiting.queue]
            delivery = delivery_of(
                waiting.tag, waiting.message, waiting.routing_key, self._acks, self._channel
            )
            self._runner.spawn(delivery, task, self._runner.process(delivery, task))
        return len(due)

    def close(self) -> None:
        """Stop its threads (without waiting for them: a stuck one never ends)."""
        self._runner.close()
        self._executor.shutdown()

    def replaced(self) -> None:
        """Done after a stuck handler, as its process would exit: the deliveries it
        holds until they fall due go back to their queues (the broker returns a dead
        connection's), and its threads are left to end on their own."""
        for waiting in self._waiting:
            self._broker.requeue(waiting.tag)
        self._waiting.clear()
        self.close()


def _due_at(message: WireMessage, now: datetime) -> datetime | None:
    """When a job that is not due yet falls due (None: it is due, or not a job)."""
    try:
        job = decode(message)
    except DecodeError:
        return None  # the protocol dead-letters it at once
    if seconds_until_due(job, now) <= 0:
        return None
    return job.due_at
