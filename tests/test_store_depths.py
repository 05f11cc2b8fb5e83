"""Queue depths over time (broker_jobs.store.depths) on every store: a minute's row
takes the newest sample and an hour's the largest, rows are listed by task oldest
first from a time, namespaces are apart, old rows go, a second store reads them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker_jobs.store import Store
from broker_jobs.store.depths import HOUR, KEEP_HOURS, KEEP_MINUTES, MINUTE, depth_rows
from tests.test_store import Kit

T0 = datetime(2026, 12, 4, 10, 30, 15, tzinfo=UTC)


def later(**delta: float) -> datetime:
    return T0 + timedelta(**delta)


def test_a_minute_keeps_its_newest_sample_and_an_hour_its_largest(store: Store) -> None:
    store.record_depths("jobs", {"mail.send": 5, "image.resize": 0}, now=T0)
    store.record_depths("jobs", {"mail.send": 3}, now=later(seconds=20))
    store.record_depths("jobs", {"mail.send": 9}, now=later(minutes=1))
    store.record_depths("jobs", {"mail.send": 2}, now=later(minutes=2))

    minutes = store.depth_history("jobs", step=MINUTE, since=T0 - timedelta(hours=1))
    assert minutes == {
        "image.resize": [(datetime(2026, 12, 4, 10, 30, tzinfo=UTC), 0)],
        "mail.send": [
            (datetime(2026, 12, 4, 10, 30, tzinfo=UTC), 3),
            (datetime(2026, 12, 4, 10, 31, tzinfo=UTC), 9),
            (datetime(2026, 12, 4, 10, 32, tzinfo=UTC), 2),
        ],
    }
    hours = store.depth_history("jobs", step=HOUR, since=T0 - timedelta(hours=1))
    assert hours == {
        "image.resize": [(datetime(2026, 12, 4, 10, 0, tzinfo=UTC), 0)],
        "mail.send": [(datetime(2026, 12, 4, 10, 0, tzinfo=UTC), 9)],
    }


def test_rows_are_read_from_a_time_and_by_namespace(store: Store) -> None:
    store.record_depths("jobs", {"a": 1}, now=T0)
    store.record_depths("jobs", {"a": 2}, now=later(minutes=5))
    store.record_depths("billing", {"a": 7}, now=later(minutes=5))
    since = later(minutes=3)
    assert store.depth_history("jobs", step=MINUTE, since=since) == {
        "a": [(datetime(2026, 12, 4, 10, 35, tzinfo=UTC), 2)]
    }
    assert store.depth_history("billing", step=MINUTE, since=T0)["a"][0][1] == 7
    assert store.depth_history("nobody", step=MINUTE, since=T0) == {}


def test_old_rows_go_and_the_ledger_stays_bounded(store: Store) -> None:
    store.record_depths("jobs", {"a": 1}, now=T0)
    store.record_depths("billing", {"a": 1}, now=T0)
    # Hours later: the first minute is gone, its hour is kept (for a week's chart).
    store.record_depths("jobs", {"a": 4}, now=T0 + KEEP_MINUTES + timedelta(minutes=2))
    since = T0 - timedelta(days=30)
    assert [at for at, _ in store.depth_history("jobs", step=MINUTE, since=since)["a"]] == [
        datetime(2026, 12, 4, 12, 32, tzinfo=UTC)
    ]
    assert len(store.depth_history("jobs", step=HOUR, since=since)["a"]) == 2
    # A week and more later: only the newest hour is left.
    store.record_depths("jobs", {"a": 6}, now=T0 + KEEP_HOURS + timedelta(hours=3))
    assert store.depth_history("jobs", step=HOUR, since=since) == {
        "a": [(datetime(2026, 12, 12, 13, 0, tzinfo=UTC), 6)]
    }
    # Another namespace's rows are pruned by its own sampler, not this one's.
    assert store.depth_history("billing", step=MINUTE, since=since) != {}


def test_a_second_store_on_the_same_data_reads_the_depths(kit: Kit) -> None:
    kit.store.record_depths("jobs", {"a": 3}, now=T0)
    reopened = kit.reopen()
    assert reopened.depth_history("jobs", step=HOUR, since=T0 - timedelta(hours=1)) == {
        "a": [(datetime(2026, 12, 4, 10, 0, tzinfo=UTC), 3)]
    }


def test_a_step_is_a_minute_or_an_hour(store: Store) -> None:
    with pytest.raises(ValueError, match="a minute or an hour"):
        store.depth_history("jobs", step=timedelta(minutes=5), since=T0)
    assert len(depth_rows({"a": 1, "b": 2}, T0)) == 4  # a minute's and an hour's each
