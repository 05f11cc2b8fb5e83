"""A worker's settings refuse values it cannot work with, at construction, with the
library's error: not a worker that starts and then fails every claim."""

from __future__ import annotations

from typing import Any

import pytest

from broker_jobs.errors import ConfigurationError
from broker_jobs.worker import WorkerSettings


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"lease": 0}, "lease must be a positive number of seconds"),
        ({"lease": -5}, "lease must be a positive number of seconds"),
        ({"grace": -1}, "grace must be 0 or more seconds"),
        ({"concurrency": 0}, "concurrency must be at least 1"),
        (
            {"concurrency": 4, "prefetch": 2},
            r"prefetch \(2\) must be at least the concurrency \(4\)",
        ),
        ({"overrun_grace": 0}, "overrun_grace must be a positive number of seconds"),
    ],
)
def test_values_a_worker_cannot_work_with_are_refused(given: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        WorkerSettings(**given)


def test_a_grace_of_zero_is_allowed() -> None:
    assert WorkerSettings(grace=0).grace == 0
