"""pytest fixtures for testing jobs: loaded by the ``broker_jobs`` entry point of
``pytest11``, so installing broker-jobs is enough (docs/testing.md).

- ``jobs_kit``: a :class:`~broker_jobs.testing.JobsKit` for the app your
  ``broker_jobs_app`` fixture returns (define it in your ``conftest.py``); no broker.
- ``make_jobs_kit``: makes kits for apps of your choosing (each closed at the end).
- ``rabbitmq_url``: an AMQP URL for integration tests, one per session: the
  ``BROKER_JOBS_TEST_AMQP_URL`` variable's, else a throwaway node started from the
  installed ``rabbitmq-server`` (about 6 s) and deleted at the end; the test skips,
  saying how to get one, when there is neither.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker_jobs.app import App
from broker_jobs.testing.kit import JobsKit
from broker_jobs.testing.rabbit_node import RabbitNode

#: An AMQP URL of a broker to run integration tests against, instead of a throwaway node.
AMQP_URL_VARIABLE = "BROKER_JOBS_TEST_AMQP_URL"


@pytest.fixture
def broker_jobs_app() -> App:
    """The app ``jobs_kit`` tests: override this fixture in your conftest.py."""
    raise pytest.UsageError(
        "jobs_kit needs your app: define a fixture in conftest.py, e.g.\n"
        "    @pytest.fixture\n"
        "    def broker_jobs_app():\n"
        "        from myservice.jobs import app\n"
        "        return app"
    )


@pytest.fixture
def make_jobs_kit() -> Iterator[Callable[..., JobsKit]]:
    """``make_jobs_kit(app, **options)``: a :class:`JobsKit` (options as its own),
    closed when the test ends."""
    kits: list[JobsKit] = []

    def make(app: App, **options: Any) -> JobsKit:
        kit = JobsKit(app, **options)
        kits.append(kit)
        return kit

    yield make
    for kit in kits:
        kit.close()


@pytest.fixture
def jobs_kit(broker_jobs_app: App, make_jobs_kit: Callable[..., JobsKit]) -> JobsKit:
    """A :class:`JobsKit` of ``broker_jobs_app``, with a memory ledger."""
    return make_jobs_kit(broker_jobs_app)


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """An AMQP URL of a real RabbitMQ for integration tests (see the module's text)."""
    if url := os.environ.get(AMQP_URL_VARIABLE):
        yield url
        return
    if not RabbitNode.available():
        pytest.skip(
            f"no RabbitMQ for integration tests: set {AMQP_URL_VARIABLE}=amqp://... or"
            " install rabbitmq-server (apt-get install rabbitmq-server)"
        )
    with RabbitNode.create(prefix="bj-pytest") as node:
        yield node.url
