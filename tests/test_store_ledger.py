"""The ledger on every store, with fixed clocks: jobs recorded at their publish
(queued, scheduled), claims of such keys, cancel, reset for a replay, find's filters
and keyset paging, task summaries, outcome buckets, pruning cancelled jobs; and the version 2 -> 3
migration of SQLite and PostgreSQL.

The stores and their fixtures are those of ``tests/test_store.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker_jobs import Job
from broker_jobs.store import (
    ClaimOutcome,
    ExecutionOutcome,
    JobRecord,
    PostgresStore,
    SQLiteStore,
    Status,
    Store,
    StoreError,
    postgres_schema,
    sqlite_schema,
)
from broker_jobs.store import postgres as postgres_module
from broker_jobs.store import sqlite as sqlite_module
from broker_jobs.store.base import CancelOutcome, TaskSummary
from broker_jobs.store.ledger import Buckets
from tests import test_store as _store_tests
from tests.test_store import LEASE, A, B, Kit, _admin, at, durable_only, job
from tests.test_store_history import limited_role, summary

# The parametrised stores of tests/test_store.py (pytest finds fixtures by name here).
make_store = _store_tests.make_store
pg_schema = _store_tests.pg_schema
kit = _store_tests.kit
store = _store_tests.store

CLAIMED, DONE, CANCELLED = ClaimOutcome.CLAIMED, ClaimOutcome.DONE, ClaimOutcome.CANCELLED


def published(
    key: str = "key-1", *, due: datetime | None = None, task: str = "image.resize"
) -> Job:
    return Job(id=f"id-{key}", task=task, idempotency_key=key, due_at=due)


def keys(records: list[JobRecord]) -> list[str]:
    return [r.idempotency_key for r in records]


# --- record_published ---------------------------------------------------------------------


def test_published_jobs_are_queued_or_scheduled_by_their_due_time(store: Store) -> None:
    jobs = [published("now"), published("later", due=at(60)), published("past", due=at(-5))]
    assert store.record_published(jobs, now=at(0)) == [None, None, None]

    queued = store.get("now")
    assert queued is not None
    assert (queued.status, queued.attempts, queued.worker, queued.lease_until) == (
        Status.QUEUED,
        0,
        None,
        None,
    )
    assert (queued.job_id, queued.task, queued.due_at) == ("id-now", "image.resize", None)
    assert queued.created_at == queued.updated_at == at(0)
    later = store.get("later")
    assert later is not None
    assert (later.status, later.due_at) == (Status.SCHEDULED, at(60))
    past = store.get("past")  # due already: queued, no due time
    assert past is not None
    assert (past.status, past.due_at) == (Status.QUEUED, None)
    assert store.executions("now") == []  # nothing ran


def test_a_key_published_again_keeps_its_record_and_returns_it(store: Store) -> None:
    store.record_published([published()], now=at(0))
    first = store.get("key-1")

    again = store.record_published([published(due=at(100)), published("k2")], now=at(5))

    assert again == [first, None]
    assert store.get("key-1") == first  # not rescheduled, not re-created
    assert keys(store.find()) == ["k2", "key-1"]


def test_a_batch_with_a_key_twice_records_it_once(store: Store) -> None:
    assert store.record_published([], now=at(0)) == []
    first, second = published("twice"), published("twice", due=at(60))

    existing = store.record_published([first, published("k2"), second], now=at(0))

    recorded = store.get("twice")
    assert recorded is not None
    assert recorded.status is Status.QUEUED  # the first copy's
    assert existing == [None, None, recorded]  # the second copy finds the first's record


def _claimed(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))


def _retrying(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.retry("key-1", A, "flaky", due_at=at(30), now=at(1))


def _succeeded(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.succeed("key-1", A, now=at(1))


def _failed(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.fail("key-1", A, "bad", now=at(1))


def _dead(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.dead("key-1", A, "exhausted", now=at(1))


def _cancelled(store: Store) -> None:
    store.record_published([published()], now=at(0))
    store.cancel("key-1", now=at(1))


@pytest.mark.parametrize(
    "setup", [_claimed, _retrying, _succeeded, _failed, _dead, _cancelled], ids=lambda f: f.__name__
)
def test_publishing_never_overwrites_a_claim_or_an_outcome(
    store: Store, setup: Callable[[Store], None]
) -> None:
    setup(store)
    before = store.get("key-1")
    runs = store.executions("key-1")

    assert store.record_published([published()], now=at(10)) == [before]
    assert store.get("key-1") == before
    assert store.executions("key-1") == runs


# --- claims of waiting keys -------------------------------------------------------------


@pytest.mark.parametrize("due", [None, 60], ids=["queued", "scheduled"])
def test_a_waiting_key_is_claimed_as_a_new_one(store: Store, due: int | None) -> None:
    store.record_published([published(due=None if due is None else at(due))], now=at(0))

    claim = store.claim(job(), A, LEASE, now=at(5))

    assert claim.outcome is CLAIMED
    record = claim.record
    assert record == store.get("key-1")
    assert (record.status, record.attempts, record.worker, record.due_at) == (
        Status.RUNNING,
        1,
        A,
        None,
    )
    assert (record.created_at, record.updated_at, record.lease_until) == (at(0), at(5), at(35))
    assert summary(store) == [(1, A, 5, None, None, None)]
    store.succeed("key-1", A, now=at(7))
    assert summary(store) == [(1, A, 5, 7, ExecutionOutcome.SUCCEEDED, None)]
    assert store.claim(job(), B, LEASE, now=at(8)).outcome is DONE


def test_a_batch_claims_waiting_keys_as_new_ones(store: Store) -> None:
    store.record_published([published("k1"), published("k2", due=at(60))], now=at(0))
    batch = [(job("k1"), A), (job("k2"), B), (job("k3"), A)]

    claims = store.try_claim_many(batch, LEASE) or store.claim_many(batch, LEASE)

    assert [c.outcome for c in claims] == [CLAIMED] * 3
    assert [c.record.worker for c in claims] == [A, B, A]
    assert [c.record.created_at == at(0) for c in claims] == [True, True, False]
    assert [len(store.executions(k)) for k in ("k1", "k2", "k3")] == [1, 1, 1]


# --- cancel -------------------------------------------------------------------------------


def _queued(store: Store) -> None:
    store.record_published([published()], now=at(0))


def _scheduled(store: Store) -> None:
    store.record_published([published(due=at(60))], now=at(0))


def _released(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.release("key-1", A, now=at(1))


@pytest.mark.parametrize(
    "setup", [_queued, _scheduled, _retrying, _released], ids=lambda f: f.__name__
)
def test_a_job_that_has_not_started_is_cancelled(
    store: Store, setup: Callable[[Store], None]
) -> None:
    setup(store)
    before = store.get("key-1")
    assert before is not None
    runs = store.executions("key-1")

    result = store.cancel("key-1", now=at(20))

    assert result.outcome is CancelOutcome.CANCELLED
    assert result.record is not None
    assert result.record == store.get("key-1")
    assert (result.record.status, result.record.updated_at) == (Status.CANCELLED, at(20))
    assert (result.record.lease_until, result.record.due_at) == (None, None)
    assert (result.record.created_at, result.record.attempts) == (
        before.created_at,
        before.attempts,
    )
    assert store.executions("key-1") == runs  # closed before; none is opened
    # Every later delivery, of any attempt, is acked without running.
    for attempt, worker in [(1, A), (2, B), (9, B)]:
        claim = store.claim(job(attempt=attempt), worker, LEASE, now=at(21))
        assert (claim.outcome, claim.record) == (CANCELLED, result.record)
    assert store.executions("key-1") == runs
    again = store.cancel("key-1", now=at(30))
    assert (again.outcome, again.record) == (CancelOutcome.ALREADY_CANCELLED, result.record)


def test_a_released_job_is_found_and_counted_as_queued_not_running(store: Store) -> None:
    _released(store)  # key-1: given back unstarted, its delivery in the queue again
    store.claim(job("held"), B, LEASE, now=at(2))
    store.record_published([published("waiting")], now=at(3))
    record = store.get("key-1")
    assert record is not None
    assert (record.status, record.worker, record.released) == (Status.RUNNING, None, True)

    def keys(status: Status) -> list[str]:
        found = [r.idempotency_key for r in store.find(status=status.value)]
        assert store.count(status=status.value) == len(found)
        return sorted(found)

    assert keys(Status.QUEUED) == ["key-1", "waiting"]
    assert keys(Status.RUNNING) == ["held"]
    counts = store.task_summaries(now=at(4))["image.resize"].counts
    assert (counts[Status.QUEUED], counts[Status.RUNNING]) == (2, 1)
    assert store.counts()[Status.RUNNING] == 2  # the ledger's own statuses


def test_a_poison_message_of_one_task_never_marks_another_tasks_key_dead(store: Store) -> None:
    store.record_published([published("shared", task="b.task")], now=at(0))
    store.dead("shared", None, "json: not JSON", job_id="x-1", task="a.task", now=at(1))
    record = store.get("shared")
    assert record is not None
    assert (record.task, record.status) == ("b.task", Status.QUEUED)
    store.dead("shared", None, "json: not JSON", job_id="x-2", task="b.task", now=at(2))
    assert store.get("shared").status is Status.DEAD  # type: ignore[union-attr]


def test_a_running_job_is_not_cancelled(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    before = store.get("key-1")

    result = store.cancel("key-1", now=at(5))
    assert (result.outcome, result.record) == (CancelOutcome.RUNNING, before)
    # Its lease expired but no one took over: it still runs under A.
    late = store.cancel("key-1", now=at(LEASE + 10))
    assert (late.outcome, late.record) == (CancelOutcome.RUNNING, before)
    assert store.get("key-1") == before
    store.succeed("key-1", A, now=at(6))  # the holder finishes it as usual


@pytest.mark.parametrize("setup", [_succeeded, _failed, _dead], ids=lambda f: f.__name__)
def test_a_finished_job_is_not_cancelled(store: Store, setup: Callable[[Store], None]) -> None:
    setup(store)
    before = store.get("key-1")

    result = store.cancel("key-1", now=at(5))

    assert (result.outcome, result.record) == (CancelOutcome.FINISHED, before)
    assert store.get("key-1") == before


def test_cancel_of_an_unknown_job(store: Store) -> None:
    store.record_published([published()], now=at(0))
    result = store.cancel("nope", now=at(1))
    assert (result.outcome, result.record) == (CancelOutcome.UNKNOWN, None)


def test_cancel_by_job_id(store: Store) -> None:
    chosen = Job(id="job-7", task="image.resize", idempotency_key="order-7")
    store.record_published([chosen], now=at(0))

    result = store.cancel("job-7", now=at(1))

    assert result.outcome is CancelOutcome.CANCELLED
    assert result.record is not None
    assert result.record.idempotency_key == "order-7"
    assert store.claim(chosen, A, LEASE, now=at(2)).outcome is CANCELLED
    twice = Job(id="job-8", task="image.resize", idempotency_key="order-8")
    store.record_published([twice, twice.model_copy(update={"idempotency_key": "x"})], now=at(3))
    with pytest.raises(StoreError, match="job id 'job-8' has 2 records"):
        store.cancel("job-8", now=at(4))
    assert store.get("order-8") is not None
    assert store.counts()[Status.QUEUED] == 2  # neither was cancelled


# --- reset for a replay ----------------------------------------------------------------------


@pytest.mark.parametrize("setup", [_failed, _dead], ids=lambda f: f.__name__)
def test_a_failed_or_dead_job_is_reset_and_runs_again(
    store: Store, setup: Callable[[Store], None]
) -> None:
    setup(store)
    before = store.get("key-1")
    assert before is not None
    (first,) = summary(store)

    new = store.reset_for_replay("key-1", now=at(10))

    assert new is not None
    assert new == store.get("key-1")
    assert (new.status, new.attempts, new.worker, new.lease_until, new.due_at) == (
        Status.QUEUED,
        0,
        None,
        None,
        None,
    )
    assert (new.created_at, new.updated_at, new.last_error) == (
        before.created_at,
        at(10),
        before.last_error,  # what went wrong stays readable
    )
    assert summary(store) == [first]  # the history stays
    assert store.claim(job(), B, LEASE, now=at(11)).outcome is CLAIMED
    store.succeed("key-1", B, now=at(12))
    assert summary(store) == [first, (1, B, 11, 12, ExecutionOutcome.SUCCEEDED, None)]
    assert store.claim(job(), A, LEASE, now=at(13)).outcome is DONE


def test_a_job_replayed_twice_runs_once(store: Store) -> None:
    _dead(store)
    assert store.reset_for_replay("key-1", now=at(10)) is not None
    assert store.reset_for_replay("key-1", now=at(11)) is None  # queued already
    assert store.claim(job(), A, LEASE, now=at(12)).outcome is CLAIMED
    assert store.reset_for_replay("key-1", now=at(13)) is None  # running
    store.succeed("key-1", A, now=at(14))
    assert store.reset_for_replay("key-1", now=at(15)) is None  # succeeded
    # Both replays published the job: the second copy is a duplicate.
    assert store.claim(job(), B, LEASE, now=at(16)).outcome is DONE
    assert len(store.executions("key-1")) == 2


@pytest.mark.parametrize(
    "setup",
    [_succeeded, _queued, _scheduled, _claimed, _retrying, _released, _cancelled],
    ids=lambda f: f.__name__,
)
def test_other_states_are_not_reset(store: Store, setup: Callable[[Store], None]) -> None:
    setup(store)
    before = store.get("key-1")

    assert store.reset_for_replay("key-1", now=at(10)) is None
    assert store.get("key-1") == before


def test_a_missing_key_is_not_reset(store: Store) -> None:
    assert store.reset_for_replay("nope", now=at(0)) is None
    assert store.get("nope") is None


# --- find and page --------------------------------------------------------------------------


def _keyed_ledger(store: Store) -> None:
    """Keys with LIKE wildcards in them, published at 0..4, one task apart, two claimed."""
    store.record_published([published("a%b-1")], now=at(0))
    store.record_published([published("a_b-2")], now=at(1))
    store.record_published([published("axb-3", task="report.build")], now=at(2))
    store.record_published([published("a%bc")], now=at(3))
    store.record_published([published("b-5")], now=at(4))
    store.claim(job("a_b-2"), A, LEASE, now=at(5))
    store.claim(job("b-5"), A, LEASE, now=at(6))


def test_find_by_key_prefix_takes_wildcards_literally(store: Store) -> None:
    _keyed_ledger(store)

    assert keys(store.find(key="a%b")) == ["a%bc", "a%b-1"]
    assert keys(store.find(key="a_")) == ["a_b-2"]
    assert keys(store.find(key="a")) == ["a_b-2", "a%bc", "axb-3", "a%b-1"]
    assert keys(store.find(key="a%bc")) == ["a%bc"]
    assert keys(store.find(key="a%bcd")) == []
    assert keys(store.find(key="")) == keys(store.find())
    assert keys(store.find(key="A")) == []  # case-sensitive


def test_find_combines_every_filter(store: Store) -> None:
    _keyed_ledger(store)

    assert keys(store.find(until=at(3))) == ["axb-3", "a%b-1"]  # updated before 3
    assert keys(store.find(since=at(2), until=at(5))) == ["a%bc", "axb-3"]
    assert keys(store.find(status=Status.QUEUED)) == ["a%bc", "axb-3", "a%b-1"]
    assert keys(store.find(status=Status.RUNNING, key="a")) == ["a_b-2"]
    assert keys(store.find(task="report.build", key="a", until=at(10))) == ["axb-3"]
    assert keys(store.find(status=Status.QUEUED, task="image.resize", since=at(1))) == ["a%bc"]
    assert keys(store.find(after=(at(3), "a%bc"))) == ["axb-3", "a%b-1"]
    assert keys(store.find(status=Status.QUEUED, after=(at(3), "zzz"))) == [
        "a%bc",
        "axb-3",
        "a%b-1",
    ]
    assert keys(store.find(key="a", after=(at(5), "a_b-2"), limit=2)) == ["a%bc", "axb-3"]


def _ties(store: Store) -> list[str]:
    """Eleven queued keys published at three moments (ties on updated_at); their
    order in find: newest first, ties by key descending."""
    groups = {0: ["m", "c", "x", "a"], 1: ["k", "b", "z"], 2: ["q", "d", "e", "n"]}
    for moment, group in groups.items():
        store.record_published([published(k) for k in group], now=at(moment))
    return [k for moment in sorted(groups, reverse=True) for k in sorted(groups[moment])[::-1]]


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 11, 12])
def test_pages_cover_every_record_once_in_order(store: Store, limit: int) -> None:
    expected = _ties(store)
    assert keys(store.find()) == expected

    assert walk_pages(store, limit, len(expected)) == expected


def test_pages_of_a_filtered_listing(store: Store) -> None:
    expected = _ties(store)
    for key in ("x", "k", "e"):
        store.cancel(key, now=at(1))  # ties with "b" and "z" at 1, but cancelled

    first = store.page(status=Status.QUEUED, limit=3)
    assert keys(first.records) == [k for k in expected if k not in {"x", "k", "e"}][:3]
    second = store.page(status=Status.QUEUED, limit=3, after=first.after)
    assert keys(second.records) == ["z", "b", "m"]
    cancelled = store.page(status=Status.CANCELLED, key="x", limit=3)
    assert (keys(cancelled.records), cancelled.after) == (["x"], None)
    assert store.page(limit=0).records == []


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 11, 12])
def test_pages_oldest_first_cover_every_record_once_in_order(store: Store, limit: int) -> None:
    expected = _ties(store)[::-1]  # oldest updated first, ties by key ascending
    assert keys(store.find(oldest_first=True)) == expected

    assert walk_pages(store, limit, len(expected), oldest_first=True) == expected


def test_pages_oldest_first_of_a_filtered_listing(store: Store) -> None:
    expected = _ties(store)[::-1]
    for key in ("x", "k", "e"):
        store.cancel(key, now=at(1))  # ties with "b" and "z" at 1, but cancelled

    queued = [k for k in expected if k not in {"x", "k", "e"}]  # a c m b z d n q
    first = store.page(status=Status.QUEUED, limit=3, oldest_first=True)
    assert keys(first.records) == queued[:3] == ["a", "c", "m"]
    second = store.page(status=Status.QUEUED, limit=3, after=first.after, oldest_first=True)
    assert keys(second.records) == ["b", "z", "d"]
    third = store.page(status=Status.QUEUED, limit=3, after=second.after, oldest_first=True)
    assert (keys(third.records), third.after) == (["n", "q"], None)
    cancelled = store.page(status=Status.CANCELLED, limit=2, oldest_first=True)
    assert keys(cancelled.records) == ["e", "k"]  # cancelled at 1: then e, k, x by key
    assert keys(store.find(task="image.resize", since=at(1), until=at(2), oldest_first=True)) == [
        "b", "e", "k", "x", "z"
    ]  # fmt: skip
    # A cursor is a place in its order: the same one, the other way, goes back.
    mid = (at(1), "k")
    assert keys(store.find(after=mid, oldest_first=True)) == ["x", "z", "d", "n", "q"]
    assert keys(store.find(after=mid)) == ["e", "b", "m", "c", "a"]


def test_count_takes_the_filters_of_find(store: Store) -> None:
    expected = _ties(store)
    for key in ("x", "k", "e"):
        store.cancel(key, now=at(1))

    assert store.count() == len(expected) == 11
    assert store.count(status=Status.QUEUED) == 8
    assert store.count(status=Status.CANCELLED) == 3
    assert store.count(task="image.resize", since=at(1)) == 8
    assert store.count(until=at(1)) == 3
    assert store.count(key="x") == 1
    assert store.count(task="report.build") == 0
    # The order does not change it; a cursor counts what comes after it in its order.
    assert store.count(oldest_first=True) == 11
    assert store.count(after=(at(1), "k")) == len(store.find(after=(at(1), "k"))) == 5
    assert store.count(after=(at(1), "k"), oldest_first=True) == 5


# --- task summaries ---------------------------------------------------------------------------

NOW = at(7200)  # two hours after T0: the last hour starts at 3600, the last minute at 7140


def _run(store: Store, key: str, start: float, end: float, how: str, task: str) -> None:
    """One execution of ``key`` from ``start`` to ``end`` (seconds), ending ``how``."""
    the_job = job(key, task=task)
    store.claim(the_job, A, 10_000, now=at(start))
    if how == "succeed":
        store.succeed(key, A, now=at(end))
    elif how == "retry":
        store.retry(key, A, "flaky", due_at=at(7050), now=at(end))
    elif how == "fail":
        store.fail(key, A, "bad", now=at(end))
    elif how == "dead":
        store.dead(key, A, "exhausted", now=at(end))
    else:
        store.release(key, A, now=at(end))


def _summary_ledger(store: Store) -> None:
    resize, report = "image.resize", "report.build"
    for key, start, end, how in [
        ("ok-1", 7190, 7195, "succeed"),  # 5 s, last minute
        ("ok-2", 6000, 6010, "succeed"),  # 10 s, last hour
        ("edge-now", 7199, 7200, "succeed"),  # 1 s, at now: counted
        ("edge-old", 3590, 3600, "succeed"),  # at now - 1 h: not counted
        ("old", 0, 100, "succeed"),
        ("future", 7300, 7310, "succeed"),  # after now: not counted
        ("retried", 7000, 7010, "retry"),  # 10 s, last hour; due at 7050: waiting
        ("bad", 7150, 7170, "fail"),  # 20 s, last minute
        ("gone", 7140.5, 7180.5, "dead"),  # 40 s, last minute
        ("rel", 7100, 7110, "release"),  # released: not counted
    ]:
        _run(store, key, start, end, how, resize)
    store.claim(job("lost", task=resize), A, 30, now=at(7000))
    store.claim(job("lost", task=resize), B, 30, now=at(7100))  # A's execution: lost
    store.record_published([published("queued", task=resize)], now=at(7100))
    store.record_published([published("due", due=at(7150), task=resize)], now=at(6000))
    store.record_published([published("later", due=at(8000), task=resize)], now=at(6000))
    store.record_published([published("rep", task=report)], now=at(7150))
    store.record_published([published("rep-x", task=report)], now=at(7150))
    store.cancel("rep-x", now=at(7160))


def test_task_summaries_count_statuses_waits_and_executions(store: Store) -> None:
    _summary_ledger(store)

    summaries = store.task_summaries(now=NOW)

    assert list(summaries) == ["image.resize", "report.build"]
    counts = dict.fromkeys(Status, 0)
    resize = summaries["image.resize"]
    assert resize == TaskSummary(
        task="image.resize",
        counts={
            **counts,
            Status.QUEUED: 2,  # "queued", and "rel": released, it waits in its queue
            Status.SCHEDULED: 2,
            Status.RUNNING: 1,  # "lost": held by B
            Status.SUCCEEDED: 6,
            Status.RETRYING: 1,
            Status.FAILED: 1,
            Status.DEAD: 1,
        },
        oldest_waiting=at(7050),  # "retried" became due at 7050, before "queued" at 7100
        succeeded_last_minute=2,
        failed_last_minute=2,
        succeeded_last_hour=3,
        failed_last_hour=3,
        # 1, 5, 10, 10, 20, 40 s: p50 between 10 and 10, p99 at 4.95 of 0..5
        p50=timedelta(seconds=10),
        p99=timedelta(seconds=39),
    )
    assert summaries["report.build"] == TaskSummary(
        task="report.build",
        counts={**counts, Status.QUEUED: 1, Status.CANCELLED: 1},
        oldest_waiting=at(7150),
        succeeded_last_minute=0,
        failed_last_minute=0,
        succeeded_last_hour=0,
        failed_last_hour=0,
        p50=None,
        p99=None,
    )


def test_task_summaries_move_with_now(store: Store) -> None:
    _summary_ledger(store)

    minute_later = store.task_summaries(now=NOW + timedelta(seconds=30))["image.resize"]
    # (7170, 7230]: "bad" failed at 7170, no longer in the minute
    assert (minute_later.succeeded_last_minute, minute_later.failed_last_minute) == (2, 1)
    assert minute_later.succeeded_last_hour == 3
    later = store.task_summaries(now=at(7200 + 3 * 3600))["image.resize"]
    assert (later.succeeded_last_hour, later.failed_last_hour, later.p50, later.p99) == (
        0,
        0,
        None,
        None,
    )
    assert later.oldest_waiting == at(7050)
    early = store.task_summaries(now=at(7040))["image.resize"]
    assert early.oldest_waiting == at(7100)  # "queued" (nothing due yet)
    # (3440, 7040]: ok-2, edge-old and retried, 10 s each
    assert (early.succeeded_last_hour, early.failed_last_hour) == (2, 1)
    assert (early.p50, early.p99) == (timedelta(seconds=10), timedelta(seconds=10))


def test_task_summaries_of_an_empty_ledger(store: Store) -> None:
    assert store.task_summaries(now=NOW) == {}


def test_task_summaries_use_the_clock_by_default(store: Store) -> None:
    store.claim(job(), A, LEASE)
    store.succeed("key-1", A)
    (only,) = store.task_summaries().values()
    assert (only.succeeded_last_minute, only.succeeded_last_hour) == (1, 1)
    assert only.p50 is not None
    assert only.p50 >= timedelta(0)


def test_sqlite_percentiles_come_from_the_newest_executions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "MAX_SUMMARY_DURATIONS", 2)
    with SQLiteStore(tmp_path / "jobs.db") as sqlite_store:
        for key, start, end in [("slow", 6800, 6900), ("k1", 7000, 7001), ("k2", 7010, 7013)]:
            _run(sqlite_store, key, start, end, "succeed", "t")  # the slowest finished first
        (only,) = sqlite_store.task_summaries(now=NOW).values()
    assert only.succeeded_last_hour == 3  # the counts are of them all
    assert (only.p50, only.p99) == (timedelta(seconds=2), timedelta(seconds=2.98))


# --- outcome buckets ------------------------------------------------------------------------

FIVE_MINUTES = timedelta(minutes=5)
HOUR = timedelta(hours=1)
_US = timedelta(microseconds=1)


def _ran(store: Store, key: str, end: datetime, how: str = "succeed", task: str = "t") -> None:
    """One execution of ``key`` that started a second before ``end`` and ended ``how``."""
    store.claim(job(key, task=task), A, 10_000, now=end - timedelta(seconds=1))
    if how == "succeed":
        store.succeed(key, A, now=end)
    elif how == "fail":
        store.fail(key, A, "bad", now=end)
    else:
        store.release(key, A, now=end)


def test_outcome_buckets_split_the_hour_of_the_summaries(store: Store) -> None:
    _summary_ledger(store)

    buckets = store.outcome_buckets(since=NOW - HOUR, bucket=FIVE_MINUTES, now=NOW)

    # (6000, 6300]: ok-2 at 6010; (6900, 7200]: ok-1, edge-now; retried, bad, gone.
    # edge-old (at 3600, the window's start), future, rel (released), lost: none.
    # report.build ran nothing: absent.
    assert buckets == {"image.resize": [(0, 0)] * 8 + [(1, 0), (0, 0), (0, 0), (2, 3)]}
    for task, totals in store.task_summaries(now=NOW).items():
        ok, failed = map(sum, zip(*buckets.get(task, [(0, 0)]), strict=True))
        assert (ok, failed) == (totals.succeeded_last_hour, totals.failed_last_hour)


def test_outcome_buckets_hold_their_end_and_not_their_start(store: Store) -> None:
    since = at(1000)
    _ran(store, "at-since", since)  # outside: the first bucket starts after since
    _ran(store, "end-of-0", since + FIVE_MINUTES)
    _ran(store, "start-of-1", since + FIVE_MINUTES + _US, "fail")
    _ran(store, "in-2", at(1650), "fail", task="other")
    _ran(store, "at-now", at(1700))
    _ran(store, "after-now", at(1700) + _US)
    _ran(store, "released", at(1400), "release")  # neither succeeded nor failed

    buckets = store.outcome_buckets(since=since, bucket=FIVE_MINUTES, now=at(1700))

    # (1000, 1300], (1300, 1600], and (1600, 1700]: partial.
    assert buckets == {"other": [(0, 0), (0, 0), (0, 1)], "t": [(1, 0), (0, 1), (1, 0)]}
    later = store.outcome_buckets(since=since, bucket=FIVE_MINUTES, now=at(1700) + _US)
    assert later["t"] == [(1, 0), (0, 1), (2, 0)]
    whole = store.outcome_buckets(since=since, bucket=FIVE_MINUTES * 3, now=at(1900))
    assert whole == {"other": [(0, 1)], "t": [(3, 1)]}


def test_outcome_buckets_without_executions_or_buckets(store: Store) -> None:
    assert store.outcome_buckets(since=NOW - HOUR, bucket=FIVE_MINUTES, now=NOW) == {}
    _ran(store, "k", at(100))
    assert store.outcome_buckets(since=at(100), bucket=FIVE_MINUTES, now=at(100)) == {}
    assert store.outcome_buckets(since=at(200), bucket=FIVE_MINUTES, now=at(100)) == {}
    with pytest.raises(ValueError, match="positive"):
        store.outcome_buckets(since=at(0), bucket=timedelta(0), now=at(100))


def test_outcome_buckets_use_the_clock_by_default(store: Store) -> None:
    store.claim(job(), A, LEASE)
    store.succeed("key-1", A)
    since = datetime.now(UTC) - HOUR
    buckets = store.outcome_buckets(since=since, bucket=FIVE_MINUTES)
    assert len(buckets["image.resize"]) in (12, 13)  # 13: the clock moved on after since
    assert sum(ok for ok, _ in buckets["image.resize"]) == 1


def test_sqlite_outcome_buckets_are_one_range_over_the_finished_index(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "jobs.db") as sqlite_store:
        _ran(sqlite_store, "k", at(100))
    with sqlite3.connect(tmp_path / "jobs.db") as conn:
        params = Buckets.of(at(0), FIVE_MINUTES, at(3600)).params(sqlite_module._text)
        plan = conn.execute(f"EXPLAIN QUERY PLAN {sqlite_module._BUCKETS}", params).fetchall()
    steps = " | ".join(row[-1] for row in plan)
    assert "USING INDEX broker_jobs_executions_finished (finished_at>? AND finished_at<?)" in steps


# --- pruning ------------------------------------------------------------------------------------


def test_prune_deletes_cancelled_jobs_but_never_waiting_ones(store: Store) -> None:
    store.record_published(
        [published("gone"), published("q"), published("s", due=at(9))], now=at(0)
    )
    store.cancel("gone", now=at(10))
    _dead(store)
    store.reset_for_replay("key-1", now=at(2))

    assert store.prune(at(11)) == 1
    assert store.get("gone") is None
    assert sorted(keys(store.find())) == ["key-1", "q", "s"]
    assert store.prune(at(100_000)) == 0


# --- schema version 3 ---------------------------------------------------------------------------

#: How the executions' triggers of schema version 2 closed an execution: with any
#: status but running as its outcome; and how version 3 does (in sqlite.py).
_V2_OUTCOME = """outcome = CASE WHEN NEW.status <> 'running' THEN NEW.status
                WHEN NEW.worker IS NULL THEN 'released' ELSE 'lost' END,"""
_V3_OUTCOME = """outcome = CASE WHEN NEW.status IN ('succeeded', 'retrying', 'failed', 'dead')
                THEN NEW.status WHEN NEW.status = 'running' AND NEW.worker IS NOT NULL
                THEN 'lost' ELSE 'released' END,"""


@durable_only
def test_the_triggers_never_close_an_execution_with_a_ledger_status(kit: Kit) -> None:
    """No call leads a record with an open execution to queued or cancelled; should
    anything write one, the execution ends released, an outcome the executions hold."""
    assert kit.sql is not None
    kit.store.claim(job(), A, LEASE, now=at(0))
    kit.sql("UPDATE broker_jobs_records SET status = 'cancelled' WHERE idempotency_key = 'key-1'")
    assert summary(kit.store) == [(1, A, 0, 0, ExecutionOutcome.RELEASED, None)]


def _downgrade_sqlite_to_version_2(path: Path) -> None:
    """The file as version 2 left it: its triggers, version 2."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for name, text in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
        ).fetchall():
            old = text.replace(_V3_OUTCOME, _V2_OUTCOME)
            assert old != text
            conn.execute(f"DROP TRIGGER {name}")
            conn.execute(old)
        conn.execute("DROP TABLE broker_jobs_payloads")  # version 4's
        conn.execute("UPDATE broker_jobs_schema SET version = 2")
    finally:
        conn.close()


def _sqlite_version(path: Path) -> list[tuple[int]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT version FROM broker_jobs_schema").fetchall()
    finally:
        conn.close()


def test_sqlite_migrates_a_version_2_file(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite3"
    with SQLiteStore(path) as old:
        old.claim(job("done"), A, LEASE, now=at(0))
        old.succeed("done", A, now=at(1))
        old.claim(job("held"), A, LEASE, now=at(2))
    _downgrade_sqlite_to_version_2(path)

    with SQLiteStore(path) as migrated:
        assert summary(migrated, "done") == [(1, A, 0, 1, ExecutionOutcome.SUCCEEDED, None)]
        migrated.record_published([published("new")], now=at(3))
        assert migrated.cancel("new", now=at(4)).outcome is CancelOutcome.CANCELLED
        migrated.succeed("held", A, now=at(5))
    assert _sqlite_version(path) == [(sqlite_module.SCHEMA_VERSION,)]  # 2 -> 3 -> 4
    conn = sqlite3.connect(path, isolation_level=None)
    try:  # the version 3 triggers: a ledger status is never an outcome
        conn.execute("UPDATE broker_jobs_records SET status = 'running', worker = 'w'")
        conn.execute("UPDATE broker_jobs_records SET status = 'queued'")
        outcomes = conn.execute("SELECT DISTINCT outcome FROM broker_jobs_executions").fetchall()
    finally:
        conn.close()
    assert sorted(outcomes) == [("released",), ("succeeded",)]


def test_older_code_refuses_a_version_4_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v4.sqlite3"
    with SQLiteStore(path) as store:
        store.record_published([published()], now=at(0))
    monkeypatch.setattr(sqlite_schema, "SCHEMA_VERSION", 3)  # the code of version 3
    with pytest.raises(StoreError, match=r"newer broker-jobs \(schema version 4"):
        SQLiteStore(path)


#: The same in PostgreSQL's trigger function.
_PG_V2_OUTCOME = (
    "outcome = CASE WHEN NEW.status <> 'running' THEN NEW.status"
    "    WHEN NEW.worker IS NULL THEN 'released' ELSE 'lost' END,"
)
_PG_V3_OUTCOME = (
    "outcome = CASE WHEN NEW.status IN ('succeeded', 'retrying', 'failed',"
    "    'dead') THEN NEW.status WHEN NEW.status = 'running' AND NEW.worker"
    "    IS NOT NULL THEN 'lost' ELSE 'released' END,"
)


def _downgrade_postgres_to_version_2(dsn: str, schema: str, check: str) -> None:
    """The database as version 2 left it: the status CHECK without the ledger's
    statuses (named ``check``), the trigger function of version 2, version 2."""
    import psycopg  # noqa: PLC0415

    records = f'"{schema}".broker_jobs_records'
    statuses = "'running', 'succeeded', 'retrying', 'failed', 'dead'"
    with _admin(dsn) as conn:
        conn.execute(f"ALTER TABLE {records} DROP CONSTRAINT broker_jobs_records_status_check")
        conn.execute(
            f'ALTER TABLE {records} ADD CONSTRAINT "{check}" CHECK (status IN ({statuses}))'
        )
        function = f'"{schema}".broker_jobs_track_executions'
        row = conn.execute("SELECT pg_get_functiondef(%s::regproc)", (function,)).fetchone()
        assert row is not None
        assert _PG_V3_OUTCOME in row[0]
        conn.execute(row[0].replace(_PG_V3_OUTCOME, _PG_V2_OUTCOME))
        conn.execute(f'DROP TABLE "{schema}".broker_jobs_payloads')  # version 4's
        conn.execute(f'UPDATE "{schema}".broker_jobs_schema SET version = 2')
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                f"INSERT INTO {records} (idempotency_key, job_id, task, status, attempts,"
                " created_at, updated_at) VALUES ('probe', 'probe', 't', 'queued', 0, now(), now())"
            )


def _pg_checks(dsn: str, schema: str) -> tuple[int, list[tuple[str, bool]]]:
    """The schema version, and the records' CHECK constraints (name, validated)."""
    with _admin(dsn) as conn:
        row = conn.execute(f'SELECT max(version) FROM "{schema}".broker_jobs_schema').fetchone()
        assert row is not None
        checks = conn.execute(
            "SELECT conname, convalidated FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'c'",
            (f'"{schema}".broker_jobs_records',),
        ).fetchall()
    return row[0], checks


def test_postgres_migrates_a_version_2_database(postgres_dsn: str, pg_schema: str) -> None:
    with PostgresStore(postgres_dsn, schema=pg_schema) as old:
        old.claim(job("held"), A, LEASE, now=at(2))
        old.claim(job("other"), A, LEASE, now=at(2))
    # Named otherwise than CREATE TABLE names it: the migration finds it by its column.
    _downgrade_postgres_to_version_2(postgres_dsn, pg_schema, "records_status_v2")

    with PostgresStore(postgres_dsn, schema=pg_schema) as migrated:
        migrated.record_published([published("new")], now=at(3))
        assert migrated.cancel("new", now=at(4)).outcome is CancelOutcome.CANCELLED
        migrated.succeed("held", A, now=at(5))
        assert summary(migrated, "held") == [(1, A, 2, 5, ExecutionOutcome.SUCCEEDED, None)]
    assert _pg_checks(postgres_dsn, pg_schema) == (
        postgres_module.SCHEMA_VERSION,
        [("broker_jobs_records_status_check", True)],
    )
    with _admin(postgres_dsn) as conn:  # the version 3 function: never such an outcome
        conn.execute(
            f"UPDATE \"{pg_schema}\".broker_jobs_records SET status = 'queued'"
            " WHERE idempotency_key = 'other'"
        )
    with PostgresStore(postgres_dsn, schema=pg_schema) as again:
        assert summary(again, "other") == [(1, A, 2, 2, ExecutionOutcome.RELEASED, None)]


def test_postgres_a_role_that_cannot_migrate_to_version_3_is_told_what_to_do(
    postgres_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker's role may not alter the tables: it opens a version 2 database and
    claims as before; recording published jobs says how to migrate."""
    PostgresStore(postgres_dsn, schema=pg_schema).close()
    _downgrade_postgres_to_version_2(postgres_dsn, pg_schema, "broker_jobs_records_status_check")
    with limited_role(postgres_dsn, pg_schema) as (_, limited_dsn):
        with PostgresStore(limited_dsn, schema=pg_schema) as limited:
            assert "schema version 2 -> 3" in caplog.text
            assert limited.claim(job(), A, LEASE, now=at(0)).outcome is CLAIMED
            with pytest.raises(
                StoreError, match=r"schema version 2.*open the store once as the owner"
            ):
                limited.record_published([published("new")], now=at(1))
        assert _pg_checks(postgres_dsn, pg_schema)[0] == 2
        with PostgresStore(postgres_dsn, schema=pg_schema) as owner:
            owner.record_published([published("new")], now=at(1))
        assert _pg_checks(postgres_dsn, pg_schema)[0] == postgres_module.SCHEMA_VERSION


def test_postgres_older_code_refuses_a_version_4_database(
    postgres_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    PostgresStore(postgres_dsn, schema=pg_schema).close()
    monkeypatch.setattr(postgres_schema, "SCHEMA_VERSION", 3)
    with pytest.raises(StoreError, match=r"newer broker-jobs \(schema version 4"):
        PostgresStore(postgres_dsn, schema=pg_schema)


def walk_pages(store: Store, limit: int, most: int, *, oldest_first: bool = False) -> list[str]:
    """The keys of every page of the listing, each ``after`` its last record, in
    order; fails if it has not ended after ``most`` + 1 pages."""
    seen: list[str] = []
    after = None
    for _ in range(most + 1):
        page = store.page(limit=limit, after=after, oldest_first=oldest_first)
        assert len(page.records) <= limit
        seen += keys(page.records)
        if page.after is None:
            return seen
        last = page.records[-1]
        assert page.after == (last.updated_at, last.idempotency_key)
        after = page.after
    raise AssertionError(f"the listing did not end after {most + 1} pages")


def test_a_key_prefix_is_a_range_of_keys_in_code_point_order() -> None:
    from broker_jobs.store.ledger import prefix_range  # noqa: PLC0415

    assert prefix_range("inv-4") == ("inv-4", "inv-5")
    assert prefix_range("a\U0010ffff") == ("a\U0010ffff", "b")
    assert prefix_range("\U0010ffff") == ("\U0010ffff", None)
    assert prefix_range("x\ud7ff") == ("x\ud7ff", "x\ue000")
    assert prefix_range("") == ("", None)


@pytest.mark.parametrize("few_keys", [0, 10_000])
def test_sqlite_lists_a_key_prefix_alike_by_either_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, few_keys: int
) -> None:
    import broker_jobs.store.sqlite  # noqa: PLC0415

    # 0: every prefix has "many" keys (the updated_at walk); else few (the primary key).
    monkeypatch.setattr(broker_jobs.store.sqlite, "FEW_KEYS", few_keys)
    with SQLiteStore(tmp_path / "ledger.db") as store:
        for moment, key in enumerate(["ab", "a\U0010ffffz", "abd", "b", "abc", "aa", "a"]):
            store.record_published([published(key)], now=at(moment))
        assert keys(store.find(key="ab")) == ["abc", "abd", "ab"]  # newest first
        assert keys(store.find(key="ab", oldest_first=True)) == ["ab", "abd", "abc"]
        assert keys(store.find(key="a\U0010ffff")) == ["a\U0010ffffz"]
        assert keys(store.find(key="a", limit=2)) == ["a", "aa"]
        assert store.count(key="ab") == 3
        assert store.count(key="a") == 6
