"""A worker's passes over ``<ns>.unroutable`` (broker_jobs.worker.rerouting), without
a broker: what a stopping worker does with a pass its broker stopped answering.
The passes themselves run on a real broker in tests/test_unroutable.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from broker_jobs.errors import BrokerConnectionError
from broker_jobs.urls import BrokerURLs
from broker_jobs.worker import rerouting
from topology.names import Names


class OpenConnection:
    """What the passes need of the worker's connection: that it is open."""

    is_closed = False


def test_a_stopping_worker_leaves_a_pass_its_broker_does_not_answer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A pass blocked on a silent broker (a network black hole: pika waits for its
    heartbeat) holds a stopping worker CLOSE_WAIT seconds at most, and its thread
    does not keep the process from exiting."""
    entered, answer = threading.Event(), threading.Event()

    def silent_broker(*_: Any, **__: Any) -> None:
        entered.set()
        answer.wait()
        raise BrokerConnectionError("the broker never answered")

    monkeypatch.setattr(rerouting, "reroute", silent_broker)
    monkeypatch.setattr(rerouting, "CLOSE_WAIT", 0.1)
    caplog.set_level(logging.INFO, logger=rerouting.__name__)

    async def stop_during_a_pass() -> None:
        passes = rerouting.Rerouting(Names("jobs"), "w1")
        passes.connected(OpenConnection(), BrokerURLs.parse("amqp://localhost/"))  # type: ignore[arg-type]
        assert await asyncio.to_thread(entered.wait, 10), "no pass started"
        await passes.close()

    try:
        asyncio.run(stop_during_a_pass())
    finally:
        answer.set()
    assert "leaving a pass over jobs.unroutable unfinished" in caplog.text
