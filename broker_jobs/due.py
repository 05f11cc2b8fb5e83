"""When a job is due, and the route that gets it there.

``delay`` and ``eta`` become the job's ``due_at``; :func:`route_for` sends a job due
in a second or more through the delay ladder (:mod:`topology.delay`) and anything
sooner straight to its task queue. Either way the job may reach its queue up to
:data:`~topology.delay.MAX_HOLD` seconds early, and a consumer waits
:func:`seconds_until_due` before running it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from broker_jobs.envelope import Job
from broker_jobs.errors import JobError
from topology import Names
from topology.delay import MAX_DELAY, delay_routing_key, entry_exchange, ladder_units
from topology.lanes import Lane, shard_of

Delay = float | int | timedelta


class InvalidDelayError(JobError):
    """A delay or due time that cannot be honoured; the message says why."""


@dataclass(frozen=True)
class Route:
    """Where to publish a job: ``via_ladder`` routes need the delay ladder."""

    exchange: str
    routing_key: str
    via_ladder: bool = False


def due_time(now: datetime, delay: Delay | None, eta: datetime | None) -> datetime | None:
    """The due time for ``delay`` seconds or at ``eta`` (aware), None for "now".

    A due time in the past means now; a negative delay or one beyond the ladder's
    reach (about 388 days) is an :class:`InvalidDelayError`.
    """
    if delay is not None and eta is not None:
        raise InvalidDelayError("give either delay or eta, not both")
    if eta is not None:
        if not isinstance(eta, datetime) or eta.tzinfo is None:
            raise InvalidDelayError(
                f"eta must be a timezone-aware datetime, got {eta!r}: use for example"
                " datetime(2030, 1, 1, 2, 0, tzinfo=UTC) or datetime.now(UTC) + timedelta(...)"
            )
        _check_reach(max((eta - now).total_seconds(), 0.0))
        return eta
    if delay is None:
        return None
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or math.isnan(seconds):
        raise InvalidDelayError(f"delay must be seconds or a timedelta, got {delay!r}")
    if seconds < 0:
        raise InvalidDelayError(f"delay must not be negative, got {seconds:g} s")
    _check_reach(seconds)
    return now + timedelta(seconds=seconds) if seconds > 0 else None


def route_for(names: Names, job: Job, now: datetime, shards: int = 1) -> Route:
    """Route a job through the ladder for the whole units of its delay, if any, to
    its task's queue of its priority level and of its key's shard (of ``shards``)."""
    lane = Lane(job.priority, shard_of(job.idempotency_key, shards))
    direct = direct_route(names, job.task, lane)
    if job.due_at is None:
        return direct
    units = ladder_units((job.due_at - now).total_seconds())
    if units == 0:
        return direct
    return Route(
        entry_exchange(names, units),
        delay_routing_key(units, job.task, lane),
        via_ladder=True,
    )


def direct_route(names: Names, task: str, lane: Lane) -> Route:
    """Straight to ``task``'s queue of ``lane`` (a job due now)."""
    return Route(names.work_exchange, names.routing_key(task, lane.level, lane.shard))


def seconds_until_due(job: Job, now: datetime) -> float:
    """How long a consumer holds ``job`` before running it (0 when due)."""
    if job.due_at is None:
        return 0.0
    return max((job.due_at - now).total_seconds(), 0.0)


def _check_reach(seconds: float) -> None:
    if seconds > MAX_DELAY:
        raise InvalidDelayError(
            f"a delay of {seconds:,.0f} s is beyond the {MAX_DELAY:,.0f} s (about"
            f" {MAX_DELAY / 86400:.0f} days) that the delay ladder holds; schedule it"
            " later from a beat schedule instead"
        )
