"""The worker's success summary (broker_jobs.worker.success_summary): one INFO line per
flush counting the successes by task since the last, none for a quiet second; with
``each_success`` the observer logs every success at INFO and counts nothing."""

from __future__ import annotations

import logging

import pytest

from broker_jobs.envelope import Job
from broker_jobs.worker.observer import JobObserver
from broker_jobs.worker.success_summary import SuccessSummary

LOGGER = "broker_jobs.worker.observer"


def test_a_flush_says_how_many_succeeded_by_task_and_a_quiet_one_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    summary = SuccessSummary("w1", logging.getLogger(LOGGER), clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger=LOGGER):
        summary.add("mail.send")
        summary.add("image.resize", 2)
        now[0] += 1.0
        summary.flush()
        now[0] += 1.0
        summary.flush()  # nothing since: no line
        summary.add("mail.send")
        now[0] += 0.5
        summary.flush()
    said = [(r.getMessage(), r.succeeded, r.by_task) for r in caplog.records]  # type: ignore[attr-defined]
    assert said == [
        (
            "worker w1: 3 jobs succeeded in the last 1.0 s (image.resize 2, mail.send 1)",
            3,
            {"image.resize": 2, "mail.send": 1},
        ),
        ("worker w1: 1 job succeeded in the last 0.5 s (mail.send 1)", 1, {"mail.send": 1}),
    ]


@pytest.mark.parametrize("each_success", [False, True])
def test_the_observer_logs_each_success_or_counts_it(
    caplog: pytest.LogCaptureFixture, each_success: bool
) -> None:
    observer = JobObserver("jobs", "w1", each_success=each_success)
    jobs = [Job(id=f"id-{n}", task="mail.send", idempotency_key=f"k{n}") for n in range(3)]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        observer.succeeded(jobs[0], None)
        observer.succeeded_all((job, None) for job in jobs[1:])
        observer.flush_summary()
    messages = [r.getMessage() for r in caplog.records]
    if each_success:
        assert len(messages) == 3
        assert all("succeeded in ? on w1" in m for m in messages)
    else:
        assert len(messages) == 1
        assert "3 jobs succeeded in the last" in messages[0]


def test_at_warning_nothing_is_built_or_counted(caplog: pytest.LogCaptureFixture) -> None:
    observer = JobObserver("jobs", "w1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        observer.succeeded(Job(id="id-1", task="mail.send", idempotency_key="k1"), None)
    assert observer.summary is not None
    with caplog.at_level(logging.INFO, logger=LOGGER):
        observer.flush_summary()
    assert caplog.records == []
