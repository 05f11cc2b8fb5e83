"""Retry policies: whether a failed job runs again, and after how long.

A policy is per task (``@app.task(name, retry=RetryPolicy(...))``). The worker asks
:meth:`RetryPolicy.decide` after a failure and either publishes the next attempt
through the delay ladder (confirmed before the failed delivery is acked) or
dead-letters the job. The worker never sleeps between attempts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from broker_jobs.errors import BrokerJobsError, ConfigurationError


class PermanentError(BrokerJobsError):
    """Raise from a handler to dead-letter the job at once, without retrying."""


class RetryableError(BrokerJobsError):
    """Raise from a handler to retry even when the policy's ``retry_on`` would not."""


@dataclass(frozen=True)
class Decision:
    """``delay`` is None when the job must not run again; ``permanent``: it must not
    because of what it raised (a permanent error, or one the policy does not retry),
    not because it ran out of attempts."""

    delay: float | None
    reason: str
    permanent: bool = False

    @property
    def retry(self) -> bool:
        return self.delay is not None


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, or an explicit ``schedule``.

    ``max_attempts`` counts every execution, the first included. ``schedule`` gives
    the delay before attempt 2, 3, ... (``[30, 300, 1800, 7200]``: 30 s, 5 min,
    30 min, 2 h) and caps the attempts at ``len(schedule) + 1``. Exceptions in
    ``permanent`` (and :class:`PermanentError`) never retry; with ``retry_on`` set,
    only those (and :class:`RetryableError`) do.
    """

    max_attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 3600.0
    jitter: bool = True
    schedule: Sequence[float | timedelta] | None = None  # stored as a tuple of seconds
    retry_on: tuple[type[BaseException], ...] | None = None
    permanent: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError("max_attempts counts the first run too: use 1 or more")
        if self.base_delay <= 0 or self.max_delay < self.base_delay:
            raise ConfigurationError("need 0 < base_delay <= max_delay (seconds)")
        if self.schedule is not None:
            delays = [_seconds(step) for step in self.schedule]
            if not delays or any(step < 0 for step in delays):
                raise ConfigurationError("schedule needs one or more delays >= 0 seconds")
            object.__setattr__(self, "schedule", tuple(delays))
            object.__setattr__(self, "max_attempts", len(delays) + 1)

    def decide(
        self, error: BaseException, attempt: int, rng: random.Random | None = None
    ) -> Decision:
        """What to do after ``attempt`` (1 for the first run) failed with ``error``."""
        kind = type(error).__name__
        if isinstance(error, (PermanentError, *self.permanent)):
            return Decision(None, f"permanent error {kind}", permanent=True)
        if (
            self.retry_on is not None
            and not isinstance(error, RetryableError)
            and not isinstance(error, self.retry_on)
        ):
            return Decision(None, f"{kind} is not retried by this task's policy", permanent=True)
        if attempt >= self.max_attempts:
            return Decision(None, f"out of attempts ({attempt} of {self.max_attempts})")
        return Decision(self.delay_before(attempt + 1, rng), f"retrying after {kind}")

    def delay_before(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before ``attempt`` (2 for the first retry)."""
        if self.schedule is not None:
            return _seconds(self.schedule[min(attempt - 2, len(self.schedule) - 1)])
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** (attempt - 2))
        if not self.jitter:
            return ceiling
        # Full jitter (uniform in [0, ceiling]) spreads a herd of jobs that failed
        # together; the floor keeps a retry from coming back at once.
        return max(self.base_delay / 2, (rng or random).uniform(0, ceiling))


def _seconds(step: float | timedelta) -> float:
    return step.total_seconds() if isinstance(step, timedelta) else float(step)
