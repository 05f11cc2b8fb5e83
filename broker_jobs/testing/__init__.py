"""Testing jobs: the kit that runs an app's jobs without a broker (``kit``:
:class:`JobsKit`, over ``memory_broker``, ``memory_publishers`` and ``memory_worker``),
its pytest fixtures (``pytest_plugin``, loaded by the ``broker_jobs`` entry point), and
real servers for integration tests: throwaway RabbitMQ nodes (``rabbit_node``) and
clusters of them (``rabbit_cluster``), a throwaway PostgreSQL (``postgres_node``), what
those share (``throwaway``), and a TCP proxy that cuts the network (``tcp_proxy``).
docs/testing.md shows them in use."""

from broker_jobs.testing.kit import DeadLetter, JobsKit, KitError
from broker_jobs.testing.memory_broker import TestClock
from broker_jobs.testing.memory_publishers import MemoryAsyncPublisher, MemoryPublisher

__all__ = [
    "DeadLetter",
    "JobsKit",
    "KitError",
    "MemoryAsyncPublisher",
    "MemoryPublisher",
    "TestClock",
]
