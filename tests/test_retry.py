"""Retry policies decide, without sleeping, whether and when a job runs again."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from broker_jobs.errors import ConfigurationError
from broker_jobs.retry import PermanentError, RetryableError, RetryPolicy


def test_exponential_backoff_without_jitter_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=2, max_delay=30, jitter=False)
    assert [policy.delay_before(attempt) for attempt in range(2, 8)] == [2, 4, 8, 16, 30, 30]


def test_full_jitter_stays_within_bounds_and_varies() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=1, max_delay=60)
    rng = random.Random(7)
    delays = [policy.delay_before(5, rng) for _ in range(200)]
    assert all(0.5 <= delay <= 8 for delay in delays)
    assert len(set(delays)) > 150


def test_an_explicit_schedule_sets_delays_and_attempts() -> None:
    policy = RetryPolicy(schedule=[30, timedelta(minutes=5), 1800, timedelta(hours=2)])
    assert policy.max_attempts == 5
    assert [policy.delay_before(attempt) for attempt in range(2, 6)] == [30, 300, 1800, 7200]
    assert policy.decide(ValueError(), attempt=4).delay == 7200
    assert not policy.decide(ValueError(), attempt=5).retry


def test_attempts_run_out() -> None:
    policy = RetryPolicy(max_attempts=3, jitter=False)
    assert policy.decide(OSError("flaky"), attempt=1).retry
    assert policy.decide(OSError("flaky"), attempt=2).retry
    final = policy.decide(OSError("flaky"), attempt=3)
    assert not final.retry
    assert "out of attempts (3 of 3)" in final.reason


def test_permanent_errors_never_retry_and_retry_on_limits_retries() -> None:
    policy = RetryPolicy(permanent=(KeyError,), retry_on=(ConnectionError,))
    assert not policy.decide(PermanentError("bad input"), attempt=1).retry
    assert not policy.decide(KeyError("x"), attempt=1).retry
    assert not policy.decide(ValueError("x"), attempt=1).retry
    assert policy.decide(ValueError("x"), attempt=1).permanent
    assert policy.decide(KeyError("x"), attempt=1).permanent
    assert not RetryPolicy(max_attempts=1).decide(ValueError("x"), attempt=1).permanent
    assert policy.decide(ConnectionError("x"), attempt=1).retry
    assert policy.decide(RetryableError("x"), attempt=1).retry


@pytest.mark.parametrize(
    "options",
    [{"max_attempts": 0}, {"base_delay": 0}, {"base_delay": 10, "max_delay": 1}, {"schedule": []}],
)
def test_bad_policies_fail_loudly(options: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**options)  # type: ignore[arg-type]
