"""The dashboard's charts, inline SVG (no script, no library): the overview's
sparkline of a task's last hour in 5-minute buckets (:func:`sparkline`), and the
history page's charts of the last hour, day or week (:func:`history_chart`); each
bucket a column of its successes with its failures stacked on top."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

#: The sparkline's buckets: twelve of five minutes, the hour of the summaries' totals.
BUCKET = timedelta(minutes=5)
BUCKETS = 12
COLUMN = 10  # pixels of a bucket's column, and of the gap after it
GAP = 2
HEIGHT = 24  # pixels of the tallest column


@dataclass(frozen=True)
class Rect:
    x: int
    y: int
    height: int
    kind: str  # the CSS class: ok or failed


@dataclass(frozen=True)
class Sparkline:
    rects: list[Rect]
    title: str  # the totals, for a screen reader or a hover
    width: int = BUCKETS * (COLUMN + GAP)
    height: int = HEIGHT
    column: int = COLUMN


def sparkline(
    buckets: Sequence[tuple[int, int]], succeeded: int, failed: int, scale: int = 0
) -> Sparkline:
    """The columns of ``buckets`` (oldest first, (succeeded, failed) each), scaled to
    ``scale`` (the largest bucket of the page, so tasks compare; their own largest
    when 0); ``succeeded`` and ``failed``: the totals of the title."""
    top = max([scale, 1, *(ok + bad for ok, bad in buckets)])
    rects: list[Rect] = []
    for index, (ok, bad) in enumerate(buckets):
        rects.extend(_column(index * (COLUMN + GAP), ok, bad, top))
    title = f"last hour: {succeeded} succeeded, {failed} failed ({_minutes()}-minute buckets)"
    return Sparkline(rects, title)


def _column(x: int, ok: int, bad: int, top: int, height: int = HEIGHT) -> list[Rect]:
    """A bucket's successes from the baseline, its failures on top of them, in a
    chart ``height`` pixels tall. Heights are rounded cumulatively, so a column never
    outgrows the chart; a value above 0 keeps at least a visible pixel."""

    def pixels(value: int) -> int:
        return max(round(height * value / top), 1) if value else 0

    ok_height = pixels(ok)
    whole = min(max(pixels(ok + bad), ok_height + int(bad > 0)), height)
    ok_height = min(ok_height, whole - int(bad > 0))
    rects = []
    if ok:
        rects.append(Rect(x, height - ok_height, ok_height, "ok"))
    if bad:
        rects.append(Rect(x, height - whole, whole - ok_height, "failed"))
    return rects


def _minutes() -> int:
    return int(BUCKET.total_seconds() // 60)


# --- the history page's charts: larger, with their scale and time span written out ---


@dataclass(frozen=True)
class HistoryRange:
    """A span the history page shows: ``buckets`` of ``bucket`` up to now."""

    name: str  # as in ?range=
    label: str
    bucket: timedelta
    buckets: int

    @property
    def span(self) -> timedelta:
        return self.bucket * self.buckets


#: What ``?range=`` takes: the last hour by minute, the last day and week by hour.
HISTORY_RANGES = {
    r.name: r
    for r in (
        HistoryRange("1h", "last hour, per minute", timedelta(minutes=1), 60),
        HistoryRange("24h", "last 24 hours, per hour", timedelta(hours=1), 24),
        HistoryRange("7d", "last 7 days, per hour", timedelta(hours=1), 168),
    )
}
HISTORY_WIDTH = 840  # pixels of a history chart's columns and gaps
HISTORY_HEIGHT = 120


@dataclass(frozen=True)
class BarChart:
    """A history chart: stacked columns (successes, failures on top), the largest
    column's value (``top``: 0 for an empty chart), totals for the title."""

    rects: list[Rect]
    title: str
    top: int
    succeeded: int
    failed: int
    column: int
    width: int = HISTORY_WIDTH
    height: int = HISTORY_HEIGHT


def history_chart(buckets: Sequence[tuple[int, int]], chosen: HistoryRange) -> BarChart:
    """The columns of ``buckets`` (oldest first, (succeeded, failed) each) in a chart
    of :data:`HISTORY_WIDTH` by :data:`HISTORY_HEIGHT` pixels, scaled to its largest."""
    step = HISTORY_WIDTH // max(len(buckets), 1)
    column = max(step - max(step // 5, 1), 1)
    top = max([0, *(ok + bad for ok, bad in buckets)])
    rects: list[Rect] = []
    for index, (ok, bad) in enumerate(buckets):
        rects.extend(_column(index * step, ok, bad, max(top, 1), HISTORY_HEIGHT))
    succeeded, failed = sum(ok for ok, _ in buckets), sum(bad for _, bad in buckets)
    title = f"{chosen.label}: {succeeded} succeeded, {failed} failed"
    return BarChart(rects, title, top, succeeded, failed, column)


@dataclass(frozen=True)
class DepthChart:
    """A history chart of a queue's depth: a column per bucket with a sample (its
    ready jobs; a sampled 0 as a thin grey line), nothing where none was taken."""

    rects: list[Rect]
    title: str
    top: int  # the largest sample (0: none above 0)
    sampled: int  # buckets with a sample
    column: int
    width: int = HISTORY_WIDTH
    height: int = HISTORY_HEIGHT


def depth_chart(values: Sequence[int | None], chosen: HistoryRange) -> DepthChart:
    """The columns of ``values`` (oldest first; None: no sample in that bucket) in a
    chart of :data:`HISTORY_WIDTH` by :data:`HISTORY_HEIGHT` pixels, scaled to the
    largest."""
    step = HISTORY_WIDTH // max(len(values), 1)
    column = max(step - max(step // 5, 1), 1)
    sampled = [value for value in values if value is not None]
    top = max([0, *sampled])
    rects: list[Rect] = []
    for index, value in enumerate(values):
        if value is None:
            continue
        height = max(round(HISTORY_HEIGHT * value / max(top, 1)), 1)
        rects.append(
            Rect(index * step, HISTORY_HEIGHT - height, height, "depth" if value else "empty")
        )
    peak = "largest" if chosen.bucket >= timedelta(hours=1) else "last"
    title = (
        f"{chosen.label}: jobs ready in the queue ({peak} sample of each bucket), at most"
        f" {max(sampled, default=0)}; {len(sampled)} of {len(values)} buckets sampled"
    )
    return DepthChart(rects, title, top, len(sampled), column)
