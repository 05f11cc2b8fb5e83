"""A worker's passes over ``<ns>.unroutable`` (broker_jobs.worker.rerouting), without
a broker: what a stopping worker does with a pass its broker stopped answering, and
when a look makes a pass.
The passes themselves run on a real broker in tests/test_unroutable.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from broker_jobs.errors import AccessRefusedError, BrokerConnectionError
from broker_jobs.urls import BrokerURLs
from broker_jobs.worker import rerouting
from topology.names import Names


class OpenConnection:
    """What the passes need of the worker's connection: that it is open."""

    is_closed = False


async def one_waiting(_self: rerouting.Rerouting, _connection: Any) -> int:
    """The queue's depth as the worker's connection reads it: a job waits there."""
    return 1


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
    monkeypatch.setattr(rerouting.Rerouting, "_depth", one_waiting)
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


def test_a_look_that_read_the_depth_while_a_pass_was_refused_makes_no_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refusal (the user's permissions) stops the looks' passes: also the look that
    was reading the queue's depth while the refused pass ended (seen in CI: a second,
    silent, refused pass)."""
    passes: list[object] = []

    def refused(*args: Any, **__: Any) -> None:
        passes.append(args)
        raise AccessRefusedError("403 ACCESS_REFUSED - access to queue refused")

    async def depth_read_across_the_refusal(self: rerouting.Rerouting, _connection: Any) -> int:
        assert self._pass is not None
        if asyncio.current_task() is not self._pass:  # the look's read, not the pass's
            await asyncio.shield(self._pass)  # the connection's pass, refused meanwhile
        return 1  # not what the last pass kept (nothing): a pass, but for the refusal

    monkeypatch.setattr(rerouting, "reroute", refused)
    monkeypatch.setattr(rerouting.Rerouting, "_depth", depth_read_across_the_refusal)

    async def look_during_the_refused_pass() -> None:
        looker = rerouting.Rerouting(Names("jobs"), "w1")
        looker.connected(OpenConnection(), BrokerURLs.parse("amqp://localhost/"))  # type: ignore[arg-type]
        await looker.look()
        await looker.close()

    asyncio.run(look_during_the_refused_pass())
    assert len(passes) == 1
