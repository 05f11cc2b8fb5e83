"""The overview's small chart, inline SVG (no script, no library): a task's last hour
as a sparkline of 5-minute buckets, each a column of its successes with its failures
stacked on top (:func:`sparkline`)."""

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


def _column(x: int, ok: int, bad: int, top: int) -> list[Rect]:
    """A bucket's successes from the baseline, its failures on top of them. Heights
    are rounded cumulatively, so a column never outgrows the chart; a value above 0
    keeps at least a visible pixel."""
    ok_height = _pixels(ok, top)
    whole = min(max(_pixels(ok + bad, top), ok_height + int(bad > 0)), HEIGHT)
    ok_height = min(ok_height, whole - int(bad > 0))
    rects = []
    if ok:
        rects.append(Rect(x, HEIGHT - ok_height, ok_height, "ok"))
    if bad:
        rects.append(Rect(x, HEIGHT - whole, whole - ok_height, "failed"))
    return rects


def _pixels(value: int, top: int) -> int:
    return max(round(HEIGHT * value / top), 1) if value else 0


def _minutes() -> int:
    return int(BUCKET.total_seconds() // 60)
