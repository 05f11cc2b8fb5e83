"""The worker's link to the broker without a broker: pauses between attempts, the
reconnect timeout, a stop while the broker is away, and aiormq's disconnect lines."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from broker_jobs.errors import ReconnectTimeoutError
from broker_jobs.urls import BrokerURLs
from broker_jobs.worker import WorkerSettings
from broker_jobs.worker.link import FIRST_DELAY, BrokerLink, ExpectedDisconnects, LinkStoppedError

#: Nothing listens there: every attempt is refused at once.
NOWHERE = BrokerURLs.parse("amqp://guest:secret@127.0.0.1:1/")


class RecordingRandom(random.Random):
    """Records the ranges pauses are drawn from."""

    def __init__(self) -> None:
        super().__init__(7)
        self.ranges: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.ranges.append((a, b))
        return super().uniform(a, b)


def make_link(
    settings: WorkerSettings,
    rng: random.Random | None = None,
    stopping: asyncio.Event | None = None,
) -> BrokerLink:
    return BrokerLink(
        NOWHERE, name="test link", settings=settings, stopping=stopping or asyncio.Event(), rng=rng
    )


def test_pauses_grow_to_the_cap_each_in_its_upper_half_then_the_timeout_raises() -> None:
    rng = RecordingRandom()
    settings = WorkerSettings(reconnect_timeout=2.0, reconnect_max_delay=0.4)

    async def connect() -> None:
        await make_link(settings, rng).connect()

    with pytest.raises(ReconnectTimeoutError) as raised:
        asyncio.run(connect())
    assert raised.value.exit_code == 75
    assert "--reconnect-timeout 2" in str(raised.value)
    assert "secret" not in str(raised.value)
    highs = [high for _, high in rng.ranges]
    assert highs[:3] == [FIRST_DELAY, 2 * FIRST_DELAY, 4 * FIRST_DELAY]
    assert set(highs[3:]) == {0.4}, "the pause stops growing at reconnect_max_delay"
    assert all(low == high / 2 for low, high in rng.ranges)


def test_a_stop_while_the_broker_is_away_ends_connecting_and_waiting() -> None:
    async def scenario() -> tuple[object, BaseException | None]:
        stopping = asyncio.Event()
        link = make_link(WorkerSettings(), stopping=stopping)
        connecting = asyncio.create_task(link.connect())
        waiting = asyncio.create_task(link.wait_up())
        await asyncio.sleep(0.3)  # some refused attempts; neither returns meanwhile
        assert not connecting.done()
        assert not waiting.done()
        stopping.set()
        connected = await asyncio.wait_for(connecting, 5)
        error = await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 5)
        return connected, error[0]

    connected, error = asyncio.run(scenario())
    assert connected is None
    assert isinstance(error, LinkStoppedError)


def test_a_worker_without_a_broker_says_so_with_the_cause_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = WorkerSettings(reconnect_timeout=0.3)
    with caplog.at_level(logging.WARNING), pytest.raises(ReconnectTimeoutError):
        asyncio.run(make_link(settings).connect())
    warnings = [record.getMessage() for record in caplog.records if record.name.endswith("link")]
    assert len(warnings) == 1, "one line when the outage begins, not one per attempt"
    assert "no broker yet" in warnings[0]
    assert "127.0.0.1:1" in warnings[0]
    assert "for up to 0.3 s (--reconnect-timeout), then exiting 75" in warnings[0]
    assert "secret" not in caplog.text


def test_a_worker_that_waits_for_ever_says_how_to_make_it_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without --reconnect-timeout a worker (a --burst one in CI too) waits for its
    broker for ever: its first line says so and names the option (a new user's burst
    worker sat silent for 30 s until its reminder)."""

    async def first_attempt() -> None:
        stopping = asyncio.Event()
        connecting = asyncio.create_task(make_link(WorkerSettings(), stopping=stopping).connect())
        while not any(r.name.endswith("link") for r in caplog.records):
            await asyncio.sleep(0.01)
        stopping.set()
        await asyncio.wait_for(connecting, 5)

    with caplog.at_level(logging.WARNING):
        asyncio.run(first_attempt())
    (line,) = [record.getMessage() for record in caplog.records if record.name.endswith("link")]
    assert "for as long as it takes" in line
    assert "--reconnect-timeout SECONDS makes the worker exit with code 75" in line


def test_aiormq_disconnect_lines_are_dropped_only_while_installed() -> None:
    logger = logging.getLogger("aiormq.connection")
    expected = logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, "Cancelling cause reader exited abnormally",
        (), None,
    )  # fmt: skip
    other = logger.makeRecord(
        logger.name, logging.ERROR, __file__, 1, "Unexpected frame %r", ("x",), None
    )
    quiet = ExpectedDisconnects()
    with quiet.installed():
        assert not logger.filter(expected)
        assert logger.filter(other)
    assert logger.filter(expected)


def test_a_connection_that_cannot_consume_is_retried_after_a_pause_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker that accepts connections but not consumers (still starting) is not
    hammered: the next attempt waits, and one line says why."""
    rng = RecordingRandom()

    async def scenario() -> None:
        link = make_link(WorkerSettings(reconnect_timeout=0.5), rng)
        link.could_not_consume("ChannelClosed 541 INTERNAL_ERROR")
        assert rng.ranges == [], "no pause yet"
        await link.connect()

    with caplog.at_level(logging.WARNING), pytest.raises(ReconnectTimeoutError) as raised:
        asyncio.run(scenario())
    assert rng.ranges[0] == (FIRST_DELAY / 2, FIRST_DELAY), "paused before trying again"
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("link")]
    assert len(lines) == 1
    assert "cannot consume yet" in lines[0]
    assert "541 INTERNAL_ERROR" in lines[0]
    assert "--reconnect-timeout 0.5" in str(raised.value)
