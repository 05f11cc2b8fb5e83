"""The production publishers with the memory broker in place of RabbitMQ.

:class:`MemoryPublisher` is a :class:`~broker_jobs.Publisher` and
:class:`MemoryAsyncPublisher` an :class:`~broker_jobs.AsyncPublisher`: building,
validating, delays, priorities, shards, the ledger and the errors are theirs; only the
send is replaced, and a publish is confirmed once the memory broker routed it (a job
no queue takes is an :class:`~broker_jobs.UnroutableError`, as with ``mandatory``).
"""

from __future__ import annotations

from collections.abc import Callable

from broker_jobs.app import App
from broker_jobs.envelope import Job
from broker_jobs.errors import BrokerJobsError, TopologyMissingError
from broker_jobs.publish.async_publisher import AsyncPublisher
from broker_jobs.publish.prepare import BatchOutcome, JobFactory, Prepared, PublisherBase
from broker_jobs.publish.publisher import Publisher
from broker_jobs.store.base import Store
from broker_jobs.testing.memory_broker import MemoryBroker, UnknownExchangeError

#: The URL the memory publishers show (they never connect).
MEMORY_URL = "amqp://memory/"


def send_to_memory(
    broker: MemoryBroker,
    factory: JobFactory,
    prepared: list[Prepared],
    on_confirmed: Callable[[Job], None] | None,
) -> BatchOutcome:
    """Route each job on ``broker``: confirmed if a queue took it."""
    outcome = BatchOutcome([item.job for item in prepared])
    for item in prepared:
        route = factory.current_route(item)
        try:
            routed = broker.publish(route.exchange, route.routing_key, item.message)
        except UnknownExchangeError as error:
            outcome.failed[item.job.id] = TopologyMissingError(str(error))
            continue
        if not routed:
            outcome.failed[item.job.id] = factory.unroutable(item.job)
            continue
        outcome.confirmed.add(item.job.id)
        if on_confirmed is not None:
            on_confirmed(item.job)
    return outcome


class MemoryConnected(PublisherBase):
    """What both memory publishers are made with: the memory broker in place of a URL."""

    def __init__(
        self,
        broker: MemoryBroker,
        app: App | None = None,
        *,
        namespace: str | None = None,
        ledger: Store | None = None,
    ) -> None:
        self._memory = broker
        super().__init__(MEMORY_URL, app, namespace=namespace, declare=False, ledger=ledger)

    def _route_one(self, prepared: Prepared) -> BrokerJobsError | None:
        """One job routed on the memory broker: its error, or None."""
        outcome = send_to_memory(self._memory, self._factory, [prepared], None)
        return outcome.failed.get(prepared.job.id)


class MemoryPublisher(MemoryConnected, Publisher):
    """A :class:`~broker_jobs.Publisher` whose broker is ``broker``."""

    def _send_one(self, prepared: Prepared) -> BrokerJobsError | None:
        return self._route_one(prepared)

    def _send_batch(
        self, prepared: list[Prepared], on_confirmed: Callable[[Job], None] | None
    ) -> BatchOutcome:
        return send_to_memory(self._memory, self._factory, prepared, on_confirmed)

    def connect(self) -> None:
        """Always connected."""

    def close(self) -> None:
        """Nothing to close."""


class MemoryAsyncPublisher(MemoryConnected, AsyncPublisher):
    """An :class:`~broker_jobs.AsyncPublisher` whose broker is ``broker``."""

    async def _send_one(self, prepared: Prepared, closings: int) -> BrokerJobsError | None:
        return self._route_one(prepared)

    async def _send_batch(
        self, prepared: list[Prepared], on_confirmed: Callable[[Job], None] | None
    ) -> BatchOutcome:
        return send_to_memory(self._memory, self._factory, prepared, on_confirmed)

    async def connect(self) -> None:
        """Always connected."""

    async def close(self) -> None:
        """Nothing to close."""
