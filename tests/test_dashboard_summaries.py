"""The dashboard's ledger summaries: exact on a quick ledger, kept and refreshed
behind on a slow one (a million records), never two computations at once."""

from __future__ import annotations

import threading
from datetime import datetime

from broker_jobs import Job
from broker_jobs.dashboard.summaries import LedgerSummaries
from broker_jobs.store import MemoryStore
from broker_jobs.store.base import Status, TaskSummary
from tests.support import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CountingStore(MemoryStore):
    """task_summaries counted; ``cost`` seconds of the test's clock each; ``gate``
    holds a computation until the test releases it."""

    def __init__(self, clock: Clock, cost: float) -> None:
        super().__init__()
        self.clock, self.cost, self.calls = clock, cost, 0
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def task_summaries(self, *, now: datetime | None = None) -> dict[str, TaskSummary]:
        self.calls += 1
        self.started.set()
        self.gate.wait(timeout=10)
        self.clock.now += self.cost
        return super().task_summaries(now=now)


def publish(store: MemoryStore, count: int) -> None:
    store.record_published([Job(task="mail.send") for _ in range(count)])


def queued(summaries: dict[str, TaskSummary]) -> int:
    return summaries["mail.send"].counts[Status.QUEUED] if summaries else 0


def test_a_quick_ledger_is_read_afresh_by_every_request() -> None:
    clock = Clock()
    store = CountingStore(clock, cost=0.01)
    summaries = LedgerSummaries(store, slow=0.1, max_age=5, clock=clock)
    publish(store, 2)
    assert queued(summaries.get()[0]) == 2
    publish(store, 1)
    assert queued(summaries.get()[0]) == 3
    assert store.calls == 2


def test_a_slow_ledger_is_served_from_the_last_figures_and_refreshed_behind() -> None:
    clock = Clock()
    store = CountingStore(clock, cost=1.5)
    summaries = LedgerSummaries(store, slow=0.1, max_age=5, clock=clock)
    publish(store, 2)
    first, taken_at = summaries.get()  # the first request computes
    assert queued(first) == 2
    publish(store, 1)
    clock.now += 1
    again, again_at = summaries.get()  # kept: fresh enough, no computation
    assert (queued(again), again_at, store.calls) == (2, taken_at, 1)

    clock.now += 5  # stale: served at once, one refresh starts behind
    store.gate.clear()
    store.started.clear()
    stale, _ = summaries.get()
    assert queued(stale) == 2
    assert store.started.wait(timeout=10)
    assert queued(summaries.get()[0]) == 2  # still the old ones, no second refresh
    assert store.calls == 2
    store.gate.set()
    wait_until(lambda: queued(summaries.get()[0]) == 3, within=10, what="the refreshed figures")
    assert store.calls == 2


def test_figures_kept_past_their_serving_time_are_computed_afresh_not_served() -> None:
    """A dashboard left idle for minutes showed the figures of its last request on the
    next one (20,500 dead read as 14,474). Past SERVED_FOR the request waits for a
    fresh computation, as the first one does."""
    clock = Clock()
    store = CountingStore(clock, cost=1.5)
    summaries = LedgerSummaries(store, slow=0.1, max_age=5, served_for=30, clock=clock)
    publish(store, 2)
    assert queued(summaries.get()[0]) == 2
    publish(store, 1)
    clock.now += 300  # idle
    fresh, _ = summaries.get()
    assert queued(fresh) == 3
    assert store.calls == 2
