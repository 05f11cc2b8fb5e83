"""Queue depths over time (docs/dashboard.md, "History"): how many jobs waited in each
task's queue, sampled by the exporter (:mod:`broker_jobs.ops.depth_sampling`) and
charted by the dashboard's history page.

A sample lands in two rows of the ledger: its minute's (the last sample of that
minute) and its hour's (the largest sample of that hour, so a peak between two
looks is not smoothed away). Minute rows are kept :data:`KEEP_MINUTES`, hour rows
:data:`KEEP_HOURS`: at most ~320 rows per task, whatever the sampling rate, and
several samplers (two exporters) write the same rows rather than more of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
#: What is kept of each resolution: enough for the history page's ranges (the last
#: hour per minute; the last day and week per hour), and a margin.
KEEP = {MINUTE: timedelta(hours=2), HOUR: timedelta(days=8)}
KEEP_MINUTES, KEEP_HOURS = KEEP[MINUTE], KEEP[HOUR]


def step_start(moment: datetime, step: timedelta) -> datetime:
    """The start of the minute or hour ``moment`` falls in."""
    if step == MINUTE:
        return moment.replace(second=0, microsecond=0)
    if step == HOUR:
        return moment.replace(minute=0, second=0, microsecond=0)
    raise ValueError(f"a depth step is a minute or an hour, not {step}")


def step_seconds(step: timedelta) -> int:
    """The step as the ledger stores it (60 or 3600)."""
    if step not in KEEP:
        raise ValueError(f"a depth step is a minute or an hour, not {step}")
    return int(step.total_seconds())


@dataclass(frozen=True)
class DepthRow:
    """One row to write: ``task``'s ``ready`` jobs in the ``step`` starting at ``at``.
    A minute row takes the newest sample, an hour row the largest (``peak``)."""

    task: str
    step: int  # seconds
    at: datetime
    ready: int

    @property
    def peak(self) -> bool:
        return self.step == step_seconds(HOUR)


def depth_rows(depths: Mapping[str, int], now: datetime) -> list[DepthRow]:
    """The rows a sample of ``depths`` (ready jobs by task) taken at ``now`` writes."""
    return [
        DepthRow(task, step_seconds(step), step_start(now, step), ready)
        for task, ready in sorted(depths.items())
        for step in (MINUTE, HOUR)
    ]


def cutoffs(now: datetime) -> dict[int, datetime]:
    """By step (seconds): rows older than this are deleted."""
    return {step_seconds(step): step_start(now, step) - kept for step, kept in KEEP.items()}


#: A task's samples, oldest first: (the step's start, the jobs ready then).
DepthSeries = list[tuple[datetime, int]]


def series_by_task(
    rows: Iterable[tuple[str, Any, int]], moment: Callable[[Any], datetime]
) -> dict[str, DepthSeries]:
    """A SQL store's rows (task, step start as stored, ready), ordered by task and
    time, as each task's series; ``moment`` reads a stored time."""
    found: dict[str, DepthSeries] = {}
    for task, at, ready in rows:
        found.setdefault(task, []).append((moment(at), ready))
    return found
