"""The history page's buckets (broker_jobs.dashboard.history_buckets): whole minutes or
hours up to the current one, the same figures as one ``outcome_buckets`` over the
range, closed buckets read once and kept, the open ones read afresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from broker_jobs import Job
from broker_jobs.dashboard.chart import HISTORY_RANGES, depth_chart, history_chart
from broker_jobs.dashboard.history_buckets import HistoryBuckets
from broker_jobs.store import MemoryStore

NOW = datetime(2026, 12, 4, 10, 30, 20, tzinfo=UTC)


class SpiedStore(MemoryStore):
    """Remembers the start of each ``outcome_buckets`` read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[datetime] = []

    def outcome_buckets(self, *, since: datetime, **rest: Any) -> dict[str, list[tuple[int, int]]]:
        self.reads.append(since)
        return super().outcome_buckets(since=since, **rest)


def finished(store: MemoryStore, key: str, at: datetime, *, ok: bool = True) -> None:
    store.claim(Job(id=f"id-{key}", task="mail.send", idempotency_key=key), "w1", 60, now=at)
    if ok:
        store.succeed(key, "w1", now=at)
    else:
        store.dead(key, "w1", "PermanentError: no", now=at)


def test_the_buckets_are_whole_and_agree_with_one_read_of_the_range() -> None:
    store = SpiedStore()
    for minutes, ok in ((0.1, True), (5, True), (5.2, False), (59, True), (61, True)):
        finished(store, f"k{minutes}", NOW - timedelta(minutes=minutes), ok=ok)
    since, found = HistoryBuckets(store).read(HISTORY_RANGES["1h"], NOW)
    assert since == datetime(2026, 12, 4, 9, 31, tzinfo=UTC)  # 59 whole minutes + this one
    assert len(found["mail.send"]) == 60
    assert found == store.outcome_buckets(since=since, bucket=timedelta(minutes=1), now=NOW)
    assert sum(ok for ok, _ in found["mail.send"]) == 3  # 61 minutes ago is out
    assert sum(failed for _, failed in found["mail.send"]) == 1


def test_closed_buckets_are_read_once_and_the_open_ones_each_time() -> None:
    store = SpiedStore()
    history = HistoryBuckets(store)
    day = HISTORY_RANGES["24h"]
    finished(store, "old", NOW - timedelta(hours=5))
    history.read(day, NOW)
    finished(store, "new", NOW + timedelta(minutes=1))  # in the open hour
    later = NOW + timedelta(minutes=3)
    since, found = history.read(day, later)
    # The second read started at the open hour: every earlier one was closed and kept.
    assert store.reads == [since, datetime(2026, 12, 4, 10, 0, tzinfo=UTC)]
    assert found == store.outcome_buckets(since=since, bucket=timedelta(hours=1), now=later)
    assert sum(ok for ok, _ in found["mail.send"]) == 2


def test_a_shorter_range_keeps_what_a_longer_one_of_the_same_width_needs() -> None:
    store = SpiedStore()
    history = HistoryBuckets(store)
    finished(store, "days-ago", NOW - timedelta(days=3))
    week_since, week = history.read(HISTORY_RANGES["7d"], NOW)
    history.read(HISTORY_RANGES["24h"], NOW)
    again_since, again = history.read(HISTORY_RANGES["7d"], NOW)
    assert (again_since, again) == (week_since, week)
    assert sum(ok for ok, _ in again["mail.send"]) == 1
    assert store.reads[-1] == datetime(2026, 12, 4, 10, 0, tzinfo=UTC)  # the open hour only


def test_a_history_chart_writes_its_real_largest_value_zero_when_empty() -> None:
    hour = HISTORY_RANGES["1h"]
    assert history_chart([(0, 0)] * 4, hour).top == 0
    assert depth_chart([0, None, 0], hour).top == 0
    busy = history_chart([(3, 1), (0, 0), (1, 0)], hour)
    assert busy.top == 4
    assert min(rect.y for rect in busy.rects) == 0  # the tallest column fills the chart
    assert depth_chart([2, 7, None], hour).top == 7
