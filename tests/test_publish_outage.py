"""What a worker says while the broker confirms none of its publishes
(broker_jobs/worker/publish_outage.py): once when they start failing, once when one
is confirmed again, whatever the number of tries between."""

from __future__ import annotations

import logging

import pytest

from broker_jobs.worker import publish_outage
from broker_jobs.worker.publish_outage import PublishOutage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (record.levelname, record.getMessage())
        for record in caplog.records
        if record.name == publish_outage.__name__
    ]


def test_an_outage_is_said_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=publish_outage.__name__)
    clock = Clock()
    outage = PublishOutage(clock)
    outage.confirmed()  # no outage: nothing to say
    for _ in range(50):
        outage.failed(TimeoutError(), outage.now())
        clock.now += 0.7
    reason = outage.describe()
    assert reason is not None
    assert "for 35 s" in reason  # /readyz's 503
    outage.confirmed()
    outage.confirmed()
    lines = said(caplog)
    levels = [level for level, _ in lines]
    assert levels == ["WARNING", *["DEBUG"] * 49, "INFO"]
    assert "memory or disk alarm" in lines[0][1]  # a bare timeout, said in words
    assert (
        lines[-1][1]
        == "the broker confirms publishes again after 35.0 s (50 tries failed meanwhile)"
    )
    assert outage.describe() is None

    began = outage.now()
    outage.failed(ConnectionError("connection reset"), began)  # a new outage: said again
    clock.now += 1
    outage.confirmed()
    assert [level for level, _ in said(caplog)][-2:] == ["WARNING", "INFO"]
    assert "(1 try failed meanwhile)" in said(caplog)[-1][1]


def test_a_try_begun_before_the_outage_ended_fails_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A publish that waited through the outage for a confirm that never came
    times out after another's confirm ended it: part of that outage, not a new one."""
    caplog.set_level(logging.DEBUG, logger=publish_outage.__name__)
    clock = Clock()
    outage = PublishOutage(clock)
    straggler = outage.now()
    outage.failed(TimeoutError(), outage.now())
    clock.now += 5
    outage.confirmed()
    clock.now += 5
    outage.failed(TimeoutError(), straggler)
    assert outage.describe() is None
    assert [level for level, _ in said(caplog)] == ["WARNING", "INFO", "DEBUG"]
    outage.failed(TimeoutError(), outage.now())  # begun after the end: a new outage
    assert [level for level, _ in said(caplog)][-1] == "WARNING"
