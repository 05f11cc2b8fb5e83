"""What time it is, for every decision of ours that reads the wall clock: due times,
leases, retry delays, dead-letter stamps, ledger timestamps.

Always the system clock, except inside :func:`clock_override`, which the testing kit
(:mod:`broker_jobs.testing.kit`) uses so that a test moves time forward instead of
sleeping. Monotonic timers (time limits, pauses between attempts) are not affected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

#: The overrides in force, innermost last; empty outside the testing kit.
_overrides: list[Callable[[], datetime]] = []


def utc_now() -> datetime:
    """Now, timezone-aware, in UTC."""
    if _overrides:
        return _overrides[-1]()
    return datetime.now(UTC)


@contextmanager
def clock_override(now: Callable[[], datetime]) -> Iterator[None]:
    """``utc_now()`` returns ``now()`` inside the block (every thread: a handler's
    thread and the store's see the same time as the worker's loop)."""
    _overrides.append(now)
    try:
        yield
    finally:
        _overrides.remove(now)
