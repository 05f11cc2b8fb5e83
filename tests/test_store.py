"""The idempotency store: every claim outcome and transition on every store, with fixed
clocks (no sleeps), and real concurrency: SQLite shared by processes, PostgreSQL by
threads.

PostgreSQL is found in this order: a DSN in ``BROKER_JOBS_TEST_POSTGRES_URL``; a
testcontainers PostgreSQL when a Docker engine answers; a throwaway cluster started
from the installed server (``broker_jobs.testing.postgres_node``). Without any of
them, PostgreSQL tests skip locally and fail in CI. Each test gets a schema of its own.
"""

from __future__ import annotations

import multiprocessing
import random
import socket
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from broker_jobs import Job
from broker_jobs.errors import BrokerJobsError
from broker_jobs.store import (
    MAX_ERROR_BYTES,
    ClaimOutcome,
    LeaseLostError,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    Status,
    Store,
    StoreError,
    open_store,
)
from broker_jobs.store import postgres as postgres_module
from broker_jobs.store.base import LeaderRecord, mask_dsn
from tests.support import reports_of

POSTGRES_URL_VARIABLE = "BROKER_JOBS_TEST_POSTGRES_URL"

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LEASE = 30.0
A, B = "worker-a", "worker-b"

CLAIMED, DONE, BUSY, STALE = (
    ClaimOutcome.CLAIMED,
    ClaimOutcome.DONE,
    ClaimOutcome.BUSY,
    ClaimOutcome.STALE,
)


def at(seconds: float) -> datetime:
    """The fixed test clock: ``seconds`` after T0."""
    return T0 + timedelta(seconds=seconds)


def job(key: str = "key-1", attempt: int = 1, task: str = "image.resize") -> Job:
    return Job(id=f"id-{key}", task=task, idempotency_key=key, attempt=attempt)


# --- fixtures -----------------------------------------------------------------------------


def _admin(dsn: str) -> Any:
    import psycopg  # noqa: PLC0415

    return psycopg.connect(dsn, autocommit=True)


@dataclass
class Kit:
    """The store under test, and how to reach its data from elsewhere."""

    kind: str
    store: Store
    reopen: Callable[[], Store]  # another store on the same data (a second process's view)
    sql: Callable[[str], list[tuple[Any, ...]]] | None = None  # run SQL on the data (not memory)


@pytest.fixture
def make_store() -> Iterator[Callable[[Callable[[], Store]], Store]]:
    """Open stores through this, so they are closed after the test."""
    opened: list[Store] = []

    def make(factory: Callable[[], Store]) -> Store:
        store = factory()
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def pg_schema(postgres_dsn: str) -> Iterator[str]:
    """A fresh schema for one test, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield schema
    with _admin(postgres_dsn) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def kit(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    make_store: Callable[[Callable[[], Store]], Store],
) -> Kit:
    if request.param == "memory":
        memory = make_store(MemoryStore)
        return Kit("memory", memory, reopen=lambda: memory)
    if request.param == "sqlite":
        path = tmp_path / "jobs.db"

        def sqlite_sql(statement: str) -> list[tuple[Any, ...]]:
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                return conn.execute(statement).fetchall()
            finally:
                conn.close()

        return Kit(
            "sqlite",
            make_store(lambda: SQLiteStore(path)),
            reopen=lambda: make_store(lambda: SQLiteStore(path)),
            sql=sqlite_sql,
        )
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema: str = request.getfixturevalue("pg_schema")

    def pg_sql(statement: str) -> list[tuple[Any, ...]]:
        with _admin(dsn) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def open_pg() -> Store:
        return make_store(lambda: PostgresStore(dsn, schema=schema))

    return Kit(
        "postgres",
        open_pg(),
        reopen=open_pg,
        sql=pg_sql,
    )


#: For tests of what only a store on disk or in a database has (a MemoryStore is one
#: process's, with no schema or tables).
durable_only = pytest.mark.parametrize("kit", ["sqlite", "postgres"], indirect=True)


@pytest.fixture
def store(kit: Kit) -> Store:
    return kit.store


# --- claims -------------------------------------------------------------------------------


def test_first_claim_creates_a_running_record(store: Store) -> None:
    claim = store.claim(job(attempt=2), A, LEASE, now=at(0))

    assert claim.outcome is CLAIMED
    record = claim.record
    assert record == store.get("key-1")
    assert (record.idempotency_key, record.job_id, record.task) == (
        "key-1",
        "id-key-1",
        "image.resize",
    )
    assert (record.status, record.attempts, record.worker) == (Status.RUNNING, 2, A)
    assert record.created_at == record.updated_at == at(0)
    assert record.lease_until == at(LEASE)
    assert record.last_error is None
    assert record.due_at is None
    assert record.created_at.tzinfo is not None
    assert record.created_at.utcoffset() == timedelta(0)


def test_a_new_record_says_when_its_job_was_made_not_when_it_was_claimed(
    store: Store,
) -> None:
    # A job published without the ledger has no record until a worker claims it: its
    # record's created_at is the job's (the message's bj-created-at), never after the
    # claim (a publisher whose clock runs ahead).
    waited = job("waited").model_copy(update={"created_at": at(-3600)})
    ahead = job("ahead").model_copy(update={"created_at": at(60)})

    assert store.claim(waited, A, LEASE, now=at(0)).record.created_at == at(-3600)
    assert store.claim(ahead, A, LEASE, now=at(0)).record.created_at == at(0)
    assert store.get("waited").updated_at == at(0)  # type: ignore[union-attr]

    # claim_many (the worker's batch: SQLite's fresh-key insert, PostgreSQL's pipelined
    # upserts), on the store's own clock
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    batch = [job(key).model_copy(update={"created_at": hour_ago}) for key in ("b1", "b2")]
    claims = store.claim_many([(batch[0], A), (batch[1], B)], LEASE)
    assert [claim.record.created_at for claim in claims] == [hour_ago, hour_ago]
    assert [store.get(key).created_at for key in ("b1", "b2")] == [hour_ago, hour_ago]  # type: ignore[union-attr]

    # a poison message dead-lettered before any claim: its job's time too
    store.dead(
        "poison",
        A,
        "bad payload",
        job=job("poison").model_copy(update={"created_at": at(-60)}),
        now=at(0),
    )
    assert store.get("poison").created_at == at(-60)  # type: ignore[union-attr]


@pytest.mark.parametrize("outcome", ["succeed", "fail", "dead"])
def test_a_key_with_an_outcome_is_done(store: Store, outcome: str) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    if outcome == "succeed":
        store.succeed("key-1", A, now=at(1))
    elif outcome == "fail":
        store.fail("key-1", A, "ValueError: bad width", now=at(1))
    else:
        store.dead("key-1", A, "out of attempts", now=at(1))

    for worker in (A, B):  # the same worker too: a duplicate is never run again
        claim = store.claim(job(), worker, LEASE, now=at(2))
        assert claim.outcome is DONE
        assert (
            claim.record.status
            is {"succeed": Status.SUCCEEDED, "fail": Status.FAILED, "dead": Status.DEAD}[outcome]
        )
    # a later attempt of a finished job is a duplicate as well
    assert store.claim(job(attempt=5), B, LEASE, now=at(3)).outcome is DONE
    assert store.get("key-1").updated_at == at(1)  # type: ignore[union-attr]


def test_busy_under_another_workers_live_lease(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))

    claim = store.claim(job(), B, LEASE, now=at(LEASE - 0.001))

    assert claim.outcome is BUSY
    assert claim.record.worker == A
    assert store.get("key-1").worker == A  # type: ignore[union-attr]


def test_takeover_after_the_lease_expired(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))

    claim = store.claim(job(), B, LEASE, now=at(LEASE))  # lease_until <= now: expired

    assert claim.outcome is CLAIMED
    assert (claim.record.worker, claim.record.lease_until) == (B, at(2 * LEASE))
    assert claim.record.created_at == at(0)
    assert claim.record.updated_at == at(LEASE)
    assert store.claim(job(), A, LEASE, now=at(LEASE + 1)).outcome is BUSY


def test_the_same_worker_claims_its_own_running_job_again(store: Store) -> None:
    """Redelivery to the same worker after a channel reset."""
    store.claim(job(), A, LEASE, now=at(0))

    claim = store.claim(job(), A, LEASE, now=at(5))

    assert claim.outcome is CLAIMED
    assert claim.record.lease_until == at(5 + LEASE)


def test_retrying_then_the_next_attempt_is_claimed(store: Store) -> None:
    store.claim(job(attempt=1), A, LEASE, now=at(0))
    store.retry("key-1", A, "TimeoutError: upstream", at(60), now=at(1))

    record = store.get("key-1")
    assert record is not None
    assert (record.status, record.attempts, record.last_error) == (
        Status.RETRYING,
        1,
        "TimeoutError: upstream",
    )
    assert (record.due_at, record.lease_until, record.updated_at) == (at(60), None, at(1))

    claim = store.claim(job(attempt=2), B, LEASE, now=at(61))
    assert claim.outcome is CLAIMED
    assert (claim.record.status, claim.record.attempts, claim.record.worker) == (
        Status.RUNNING,
        2,
        B,
    )
    assert claim.record.due_at is None
    assert claim.record.last_error == "TimeoutError: upstream"  # kept for the ledger


@pytest.mark.parametrize("old_attempt", [1, 2])
def test_an_old_attempt_while_retrying_is_stale(store: Store, old_attempt: int) -> None:
    store.claim(job(attempt=2), A, LEASE, now=at(0))
    store.retry("key-1", A, "boom", at(60), now=at(1))

    claim = store.claim(job(attempt=old_attempt), B, LEASE, now=at(2))

    assert claim.outcome is STALE
    assert claim.record.status is Status.RETRYING
    assert store.get("key-1").status is Status.RETRYING  # type: ignore[union-attr]


def test_an_old_attempt_while_a_newer_one_runs_is_stale(store: Store) -> None:
    """Even for the lease holder or after expiry: the newer attempt's message owns the job."""
    store.claim(job(attempt=1), A, LEASE, now=at(0))
    store.retry("key-1", A, "boom", at(10), now=at(1))
    store.claim(job(attempt=2), A, LEASE, now=at(10))

    assert store.claim(job(attempt=1), A, LEASE, now=at(11)).outcome is STALE
    assert store.claim(job(attempt=1), B, LEASE, now=at(10 + LEASE)).outcome is STALE
    assert store.get("key-1").attempts == 2  # type: ignore[union-attr]


# --- leases and outcomes --------------------------------------------------------------------


def test_renew_extends_the_lease(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))

    store.renew("key-1", A, LEASE, now=at(20))

    record = store.get("key-1")
    assert record is not None
    assert record.lease_until == at(20 + LEASE)
    assert record.updated_at == at(0)  # a renewal is not a change of status
    assert store.claim(job(), B, LEASE, now=at(LEASE + 5)).outcome is BUSY
    assert store.claim(job(), B, LEASE, now=at(20 + LEASE)).outcome is CLAIMED


def test_an_expired_lease_not_taken_over_is_still_ours(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))

    store.renew("key-1", A, LEASE, now=at(LEASE + 10))
    store.succeed("key-1", A, now=at(LEASE + 11))

    assert store.get("key-1").status is Status.SUCCEEDED  # type: ignore[union-attr]


def test_the_old_holder_loses_the_lease_after_a_takeover(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.claim(job(), B, LEASE, now=at(LEASE + 1))

    attempts: list[Callable[[], None]] = [
        lambda: store.renew("key-1", A, LEASE, now=at(LEASE + 2)),
        lambda: store.succeed("key-1", A, now=at(LEASE + 2)),
        lambda: store.retry("key-1", A, "e", at(99), now=at(LEASE + 2)),
        lambda: store.fail("key-1", A, "e", now=at(LEASE + 2)),
        lambda: store.dead("key-1", A, "e", now=at(LEASE + 2)),
    ]
    for attempt in attempts:
        with pytest.raises(LeaseLostError, match="worker-b") as caught:
            attempt()
        assert isinstance(caught.value, StoreError)
        assert isinstance(caught.value, BrokerJobsError)
        assert caught.value.record is not None
        assert caught.value.record.worker == B

    record = store.get("key-1")
    assert record is not None
    assert (record.status, record.worker, record.last_error) == (Status.RUNNING, B, None)
    store.succeed("key-1", B, now=at(LEASE + 3))
    with pytest.raises(LeaseLostError, match="succeeded"):
        store.succeed("key-1", A, now=at(LEASE + 4))


def test_record_methods_need_a_claim(store: Store) -> None:
    with pytest.raises(LeaseLostError, match="no record"):
        store.succeed("missing", A, now=at(0))
    with pytest.raises(LeaseLostError, match="no record"):
        store.renew("missing", A, LEASE, now=at(0))
    assert store.get("missing") is None


def test_fail_records_a_permanent_error(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.fail("key-1", A, "PermanentError: no such image", now=at(3))

    record = store.get("key-1")
    assert record is not None
    assert (record.status, record.worker, record.lease_until, record.due_at) == (
        Status.FAILED,
        A,
        None,
        None,
    )
    assert record.last_error == "PermanentError: no such image"


def test_long_errors_are_truncated(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.fail("key-1", A, "Traceback:\n" + "é" * 10_000 + "\x00tail", now=at(1))

    error = store.get("key-1").last_error  # type: ignore[union-attr]
    assert error is not None
    assert len(error.encode("utf-8")) <= MAX_ERROR_BYTES
    assert error.startswith("Traceback:\néé")
    assert error.endswith("[truncated by broker-jobs]")


# --- dead ---------------------------------------------------------------------------------


def test_dead_for_a_poison_message_that_never_got_a_claim(store: Store) -> None:
    store.dead(
        "poison-1",
        None,
        "not a valid job (json): body is not JSON",
        job_id="msg-1",
        task="image.resize",
        now=at(0),
    )
    store.dead("poison-2", "worker-a", "unknown task", job=job("poison-2", attempt=3), now=at(1))
    store.dead("poison-3", None, "no message id", now=at(2))

    first, second, third = (store.get(k) for k in ("poison-1", "poison-2", "poison-3"))
    assert first is not None
    assert (first.status, first.job_id, first.task, first.attempts, first.worker) == (
        Status.DEAD,
        "msg-1",
        "image.resize",
        0,
        None,
    )
    assert first.last_error == "not a valid job (json): body is not JSON"
    assert first.created_at == first.updated_at == at(0)
    assert second is not None
    assert (second.job_id, second.attempts, second.worker) == ("id-poison-2", 3, A)
    assert third is not None
    assert (third.job_id, third.task) == ("poison-3", "")
    assert store.claim(job("poison-1"), A, LEASE, now=at(3)).outcome is DONE


def test_dead_by_the_holder_and_from_retrying(store: Store) -> None:
    store.claim(job("k1"), A, LEASE, now=at(0))
    store.dead("k1", A, "out of attempts", now=at(1))
    store.claim(job("k2"), A, LEASE, now=at(0))
    store.retry("k2", A, "boom", at(50), now=at(1))
    store.dead("k2", None, "dead-lettered by the broker", now=at(2))

    k1, k2 = store.get("k1"), store.get("k2")
    assert k1 is not None
    assert (k1.status, k1.worker, k1.lease_until) == (Status.DEAD, A, None)
    assert k2 is not None
    assert (k2.status, k2.due_at, k2.last_error) == (
        Status.DEAD,
        None,
        "dead-lettered by the broker",
    )


def test_dead_without_a_worker_respects_a_live_lease(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))

    with pytest.raises(LeaseLostError):
        store.dead("key-1", None, "poison", now=at(1))
    assert store.get("key-1").status is Status.RUNNING  # type: ignore[union-attr]

    store.dead("key-1", None, "the holder died", now=at(LEASE))  # expired: allowed
    assert store.get("key-1").status is Status.DEAD  # type: ignore[union-attr]


def test_dead_never_overwrites_an_outcome(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.succeed("key-1", A, now=at(1))

    store.dead("key-1", None, "late poison", now=at(2))

    record = store.get("key-1")
    assert record is not None
    assert (record.status, record.last_error, record.updated_at) == (
        Status.SUCCEEDED,
        None,
        at(1),
    )


# --- release ------------------------------------------------------------------------------


def test_release_lets_the_next_claim_take_the_job_at_once(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))

    store.release("key-1", B, now=at(1))  # not B's: nothing happens
    assert store.claim(job(), B, LEASE, now=at(1)).outcome is BUSY

    store.release("key-1", A, now=at(1))
    record = store.get("key-1")
    assert record is not None
    assert (record.status, record.worker, record.lease_until) == (Status.RUNNING, None, at(1))
    with pytest.raises(LeaseLostError, match="released"):
        store.succeed("key-1", A, now=at(2))
    claim = store.claim(job(), B, LEASE, now=at(1))
    assert claim.outcome is CLAIMED
    assert claim.record.worker == B


def test_lapse_ends_a_dead_holders_lease_so_the_next_claim_takes_the_job_over(
    store: Store,
) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.lapse("key-1", B, now=at(1))  # not B's: nothing happens
    assert store.claim(job(), B, LEASE, now=at(1)).outcome is BUSY

    store.lapse("key-1", A, now=at(1))
    record = store.get("key-1")
    assert record is not None
    assert (record.status, record.worker, record.lease_until) == (Status.RUNNING, A, at(1))
    claim = store.claim(job(), B, LEASE, now=at(1))
    assert claim.outcome is CLAIMED
    assert claim.record.worker == B
    lost = [e for e in store.executions("key-1") if e.worker == A]
    assert [e.outcome.value for e in lost] == ["lost"]  # taken over, not given back


# --- batches (the worker's fast path) ------------------------------------------------------


def test_claim_many_decides_each_job_in_order(store: Store) -> None:
    store.claim(job("done"), A, LEASE, now=at(0))
    store.succeed("done", A, now=at(1))
    store.claim(job("lapsed"), A, LEASE, now=at(0))  # T0 is past: its lease lapsed
    store.claim(job("retried", attempt=2), A, LEASE, now=at(0))
    store.retry("retried", A, "later", at(1), now=at(1))

    claims = store.claim_many(
        [
            (job("new"), "a#1"),
            (job("new"), "a#2"),  # a second copy in the same batch: busy
            (job("done"), "a#3"),
            (job("lapsed"), "a#4"),
            (job("retried", attempt=1), "a#5"),  # older than the retrying attempt
            (job("retried", attempt=3), "a#6"),
            (job("other"), "a#7"),
        ],
        LEASE,
    )

    assert [claim.outcome for claim in claims] == [
        CLAIMED, BUSY, DONE, CLAIMED, STALE, CLAIMED, CLAIMED
    ]  # fmt: skip
    assert claims[1].record.worker == "a#1"
    for claim, holder in zip(
        [claims[0], claims[3], claims[5], claims[6]], ["a#1", "a#4", "a#6", "a#7"], strict=True
    ):
        assert claim.record == store.get(claim.record.idempotency_key)
        assert (claim.record.status, claim.record.worker) == (Status.RUNNING, holder)
        assert claim.record.lease_until is not None
        assert claim.record.lease_until > datetime.now(UTC) + timedelta(seconds=LEASE - 5)
    assert claims[3].record.created_at == at(0)  # taken over, not recreated
    assert claims[5].record.attempts == 3
    assert claims[5].record.last_error == "later"


def test_succeed_many_records_all_and_names_the_lost_leases(store: Store) -> None:
    store.claim_many([(job(f"k{i}"), f"a#{i}") for i in range(4)], LEASE)
    store.release("k2", "a#2")  # its lease is gone: given back

    lost = store.succeed_many([("k0", "a#0"), ("k1", "a#1"), ("k2", "a#2"), ("k3", "b#9")])

    assert sorted(lost) == ["k2", "k3"]
    statuses = {key: store.get(key).status for key in ("k0", "k1", "k2", "k3")}  # type: ignore[union-attr]
    assert statuses == {
        "k0": Status.SUCCEEDED,
        "k1": Status.SUCCEEDED,
        "k2": Status.RUNNING,
        "k3": Status.RUNNING,
    }
    assert store.succeed_many([]) == []


def test_try_claim_many_claims_new_keys_at_once_or_leaves_it_to_claim_many(
    kit: Kit,
) -> None:
    store = kit.store
    claims = store.try_claim_many([(job("k1"), "a#1"), (job("k2"), "a#2")], LEASE)
    if kit.kind == "postgres":  # a network round trip: never at once on the worker's loop
        assert claims is None
        return
    assert claims is not None
    assert [(c.outcome, c.record.worker) for c in claims] == [(CLAIMED, "a#1"), (CLAIMED, "a#2")]
    assert [store.get(k) for k in ("k1", "k2")] == [c.record for c in claims]

    if kit.kind == "memory":  # a dict: everything is decided at once
        assert store.try_claim_many([(job("k1"), "a#3")], LEASE) is not None
        return
    # SQLite: a key seen before, or two copies of one key, is claim_many's to decide.
    assert store.try_claim_many([(job("k3"), "a#3"), (job("k1"), "a#4")], LEASE) is None
    assert store.try_claim_many([(job("k5"), "a#5"), (job("k5"), "a#6")], LEASE) is None
    decided = store.claim_many([(job("k3"), "a#3"), (job("k1"), "a#4")], LEASE)
    # k3 was inserted by the try under a#3: claim_many finds it ours
    assert [c.outcome for c in decided] == [CLAIMED, BUSY]
    assert store.get("k3").worker == "a#3"  # type: ignore[union-attr]
    assert store.get("k5") is None


def test_try_succeed_many_records_at_once_only_in_memory(kit: Kit) -> None:
    """The memory store records successes on the caller's thread (the worker's loop);
    the durable stores leave it to succeed_many, whose commit may wait for the disk."""
    store = kit.store
    store.claim_many([(job("k1"), "a#1"), (job("k2"), "a#2")], LEASE)
    lost = store.try_succeed_many([("k1", "a#1"), ("k2", "someone else")])
    if kit.kind != "memory":
        assert lost is None
        assert store.get("k1").status is Status.RUNNING  # type: ignore[union-attr]
        return
    assert lost == ["k2"]
    assert store.get("k1").status is Status.SUCCEEDED  # type: ignore[union-attr]
    assert store.get("k2").status is Status.RUNNING  # type: ignore[union-attr]


def test_sqlite_try_claim_many_never_waits_for_another_writer(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with SQLiteStore(path, busy_timeout=60) as store:
        store.claim(job("warm"), A, LEASE)  # tables made, connections open
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction
        try:
            answers: list[Any] = []
            trying = threading.Thread(
                target=lambda: answers.append(store.try_claim_many([(job("k1"), A)], LEASE))
            )
            trying.start()
            trying.join(timeout=20)  # it would wait 60 s in SQLite's busy handler
            assert not trying.is_alive(), "try_claim_many waited for the other writer"
            assert answers == [None]
        finally:
            other.execute("ROLLBACK")
            other.close()
        (claim,) = store.claim_many([(job("k1"), A)], LEASE)  # the long way, once free
        assert claim.outcome is CLAIMED


def test_sqlite_claims_queued_together_are_decided_in_queue_order(
    tmp_path: Path, make_store: Callable[[Callable[[], Store]], Store]
) -> None:
    """The store thread serves queued claims as one batch (and before the outcomes
    queued with them); a copy queued later loses to the one queued first."""
    import asyncio  # noqa: PLC0415

    store = make_store(lambda: SQLiteStore(tmp_path / "jobs.db"))
    assert isinstance(store, SQLiteStore)
    store.claim(job("done"), A, LEASE)  # now: its lease is live

    entered, gate = threading.Event(), threading.Event()

    def hold(_: object) -> None:  # keeps the store thread busy while the rest queue
        entered.set()
        gate.wait(10)

    async def together() -> list[Any]:
        holding = store.submit("claim_many", [(job("gate"), "g#1")], LEASE, after=hold)
        assert await asyncio.to_thread(entered.wait, 10)
        queued = [
            store.submit("succeed", "done", A),
            store.submit("claim_many", [(job("k"), "a#1")], LEASE),
            store.submit("claim_many", [(job("k"), "a#2"), (job("done"), "a#3")], LEASE),
            store.submit("claim_many", [(job("k"), "a#4")], LEASE * 2),  # other lease
        ]
        gate.set()
        await holding
        return list(await asyncio.gather(*queued))

    succeeded, first, second, third = asyncio.run(together())

    assert succeeded is None
    assert [c.outcome for c in first] == [CLAIMED]
    # served before the success queued ahead of them: "done" was still running
    assert [c.outcome for c in second] == [BUSY, BUSY]
    assert [c.outcome for c in third] == [BUSY]
    assert store.get("k").worker == "a#1"  # type: ignore[union-attr]
    assert store.get("done").status is Status.SUCCEEDED  # type: ignore[union-attr]


def test_sqlite_starts_what_follows_a_claim_on_the_store_thread(
    tmp_path: Path, make_store: Callable[[Callable[[], Store]], Store]
) -> None:
    """``after`` runs on the store's thread once the claim is committed (visible to
    another connection), before the caller's loop resumes."""
    import asyncio  # noqa: PLC0415

    store = make_store(lambda: SQLiteStore(tmp_path / "jobs.db"))
    assert isinstance(store, SQLiteStore)
    seen: list[tuple[str, Any, Any]] = []

    def after(claims: list[Any]) -> None:
        other = sqlite3.connect(tmp_path / "jobs.db")
        try:
            row = other.execute("SELECT worker FROM broker_jobs_records").fetchone()
        finally:
            other.close()
        seen.append((threading.current_thread().name, [c.outcome for c in claims], row))

    async def claim() -> Any:
        return await store.submit("claim_many", [(job(), A)], LEASE, after=after)

    claims = asyncio.run(claim())

    assert [c.outcome for c in claims] == [CLAIMED]
    assert seen == [("broker-jobs-store", [CLAIMED], (A,))]


# --- the ledger ---------------------------------------------------------------------------


def _ledger(store: Store) -> None:
    """k0 succeeded, k1 failed, k2 retrying, k3 running, k4 dead, k5 running (another task)."""
    for i in range(6):
        store.claim(
            job(f"k{i}", task="report.build" if i == 5 else "image.resize"), A, LEASE, now=at(i)
        )
    store.succeed("k0", A, now=at(10))
    store.fail("k1", A, "bad", now=at(11))
    store.retry("k2", A, "later", at(100), now=at(12))
    store.dead("k4", A, "poison", now=at(14))


def test_find_counts_and_get_by_job_id(store: Store) -> None:
    _ledger(store)

    assert store.counts() == {
        Status.QUEUED: 0,
        Status.SCHEDULED: 0,
        Status.RUNNING: 2,
        Status.SUCCEEDED: 1,
        Status.RETRYING: 1,
        Status.FAILED: 1,
        Status.DEAD: 1,
        Status.CANCELLED: 0,
    }
    keys = [r.idempotency_key for r in store.find()]
    assert keys == ["k4", "k2", "k1", "k0", "k5", "k3"]  # newest updated first
    assert [r.idempotency_key for r in store.find(limit=2)] == ["k4", "k2"]
    assert store.find(limit=0) == []
    assert [r.idempotency_key for r in store.find(status=Status.RUNNING)] == ["k5", "k3"]
    assert store.find(status="running") == store.find(status=Status.RUNNING)  # type: ignore[arg-type]
    assert [r.idempotency_key for r in store.find(task="report.build")] == ["k5"]
    assert [r.idempotency_key for r in store.find(since=at(11))] == ["k4", "k2", "k1"]
    assert [
        r.idempotency_key
        for r in store.find(status=Status.FAILED, task="image.resize", since=at(11))
    ] == ["k1"]
    assert store.find(status=Status.FAILED, task="report.build") == []

    assert [r.idempotency_key for r in store.get_by_job_id("id-k2")] == ["k2"]
    assert store.get_by_job_id("nope") == []
    store.claim(Job(id="plain", task="image.resize"), A, LEASE, now=at(20))  # key = id
    assert [r.idempotency_key for r in store.get_by_job_id("plain")] == ["plain"]
    store.claim(Job(id="plain", task="image.resize", idempotency_key="k9"), A, LEASE, now=at(21))
    assert [r.idempotency_key for r in store.get_by_job_id("plain")] == ["k9", "plain"]


def test_find_orders_ties_by_key_descending(store: Store) -> None:
    for key in ("b", "c", "a"):
        store.claim(job(key), A, LEASE, now=at(0))
    assert [r.idempotency_key for r in store.find()] == ["c", "b", "a"]


def test_prune_deletes_old_outcomes_only(store: Store) -> None:
    _ledger(store)

    assert store.prune(at(11)) == 1  # k0 (succeeded at 10); k1 failed at 11 is not before
    assert store.get("k0") is None
    assert store.prune(at(1000)) == 2  # k1 failed, k4 dead
    assert sorted(r.idempotency_key for r in store.find()) == ["k2", "k3", "k5"]
    assert store.counts()[Status.RETRYING] == 1
    assert store.counts()[Status.RUNNING] == 2
    assert store.prune(at(1000)) == 0


# --- beat records ---------------------------------------------------------------------------


def fire(minutes: int, micros: int = 0) -> datetime:
    """A fire time on the test clock, with microseconds that must survive the store."""
    return T0 + timedelta(minutes=minutes, microseconds=micros)


def test_a_fire_round_trips_with_microseconds(store: Store) -> None:
    assert store.last_fire("shop/report") is None

    store.record_fire("shop/report", fire(5, 123_456))
    paris = timezone(timedelta(hours=1))
    store.record_fire("shop/paris", datetime(2026, 3, 1, 13, 0, 0, 1, tzinfo=paris))

    last = store.last_fire("shop/report")
    assert last == fire(5, 123_456)
    assert last is not None
    assert last.microsecond == 123_456
    assert last.tzinfo is not None
    assert last.utcoffset() == timedelta(0)
    stored_as_utc = store.last_fire("shop/paris")
    assert stored_as_utc == fire(0, 1)
    assert stored_as_utc is not None
    assert stored_as_utc.tzinfo == UTC
    assert store.last_fires() == {"shop/paris": fire(0, 1), "shop/report": fire(5, 123_456)}


def test_fires_never_move_backwards(store: Store) -> None:
    store.record_fire("shop/s", fire(60))

    store.record_fire("shop/s", fire(30))  # older: ignored
    assert store.last_fire("shop/s") == fire(60)
    store.record_fire("shop/s", fire(60))  # the same again: nothing changes
    assert store.last_fire("shop/s") == fire(60)
    store.record_fire("shop/s", fire(60, 1))  # one microsecond newer: moves
    assert store.last_fire("shop/s") == fire(60, 1)
    store.record_fire("shop/s", fire(60))
    assert store.last_fires("shop/") == {"shop/s": fire(60, 1)}


def test_fires_are_kept_per_schedule(store: Store) -> None:
    store.record_fire("a/x", fire(1))
    store.record_fire("a/y", fire(2))
    store.record_fire("b/x", fire(3))
    store.record_fire("a/x", fire(10))
    store.record_fire("b/x", fire(0))  # older for b/x; must not touch a/x

    assert store.last_fire("a/x") == fire(10)
    assert store.last_fire("a/y") == fire(2)
    assert store.last_fire("b/x") == fire(3)
    assert store.last_fire("a") is None  # a key, not a prefix
    assert store.last_fire("A/x") is None


def test_last_fires_lists_the_keys_with_a_prefix(store: Store) -> None:
    keys = ["shop/nightly", "shop/hourly", "shop/é", "shopping/x", "Shop/upper", "x/shop/z"]
    keys += ["shop%/_x", "shop_/y"]  # LIKE wildcards must match only themselves
    for n, key in enumerate(keys):
        store.record_fire(key, fire(n, n))
    every = {key: fire(n, n) for n, key in enumerate(keys)}

    assert store.last_fires("shop/") == {
        k: every[k] for k in ("shop/nightly", "shop/hourly", "shop/é")
    }
    assert set(store.last_fires("shop")) == {
        "shop/nightly",
        "shop/hourly",
        "shop/é",
        "shopping/x",
        "shop%/_x",
        "shop_/y",
    }
    assert store.last_fires("shop%") == {"shop%/_x": every["shop%/_x"]}
    assert store.last_fires("shop_") == {"shop_/y": every["shop_/y"]}
    assert store.last_fires("shop/é") == {"shop/é": every["shop/é"]}
    assert store.last_fires("shop/nightly/") == {}
    assert store.last_fires("nothing/") == {}
    assert store.last_fires() == every
    assert store.last_fires("") == every


def test_the_leader_is_the_last_writer(store: Store) -> None:
    assert store.leader("shop") is None

    store.record_leader("shop", "host-1:101", at(0), now=at(0.5))
    assert store.leader("shop") == LeaderRecord("shop", "host-1:101", at(0), at(0.5))
    store.record_leader("shop", "host-1:101", at(0), now=at(10.25))  # announces again
    assert store.leader("shop") == LeaderRecord("shop", "host-1:101", at(0), at(10.25))

    store.record_leader("shop", "host-2:202", at(20), now=at(20.000001))
    store.record_leader("other", "host-3:303", at(5), now=at(5))
    assert store.leader("shop") == LeaderRecord("shop", "host-2:202", at(20), at(20.000001))
    # the last writer wins, even with older times: the broker decides who leads
    store.record_leader("shop", "host-1:101", at(0), now=at(15))
    assert store.leader("shop") == LeaderRecord("shop", "host-1:101", at(0), at(15))
    assert store.leader("other") == LeaderRecord("other", "host-3:303", at(5), at(5))
    assert store.leader("nobody") is None


def test_the_leader_record_keeps_the_leaders_schedules(store: Store) -> None:
    digests = {"nightly": "0123456789ab", "hourly/é": "ba9876543210"}
    store.record_leader("shop", "host-1:101", at(0), now=at(1), schedules=digests)
    assert store.leader("shop") == LeaderRecord("shop", "host-1:101", at(0), at(1), digests)

    store.record_leader("shop", "host-1:101", at(0), now=at(2), schedules={})
    found = store.leader("shop")
    assert found is not None
    assert found.schedules == {}  # a leader without schedules says so

    store.record_leader("shop", "host-2:202", at(3), now=at(3))  # one that does not say
    found = store.leader("shop")
    assert found is not None
    assert found.schedules is None


def test_the_leader_is_seen_now_by_default(store: Store) -> None:
    before = datetime.now(UTC) - timedelta(seconds=5)
    store.record_leader("shop", "host-1:101", T0)
    after = datetime.now(UTC) + timedelta(seconds=5)

    leader = store.leader("shop")
    assert leader is not None
    assert leader.since == T0
    assert before <= leader.seen_at <= after
    assert leader.seen_at.tzinfo is not None
    assert leader.seen_at.utcoffset() == timedelta(0)


def test_prune_keeps_the_beat_records(store: Store) -> None:
    _ledger(store)
    store.record_fire("shop/s", fire(-10_000))
    store.record_leader("shop", "host-1:101", at(0), now=at(0))

    assert store.prune(at(100_000)) == 3

    assert store.last_fire("shop/s") == fire(-10_000)
    assert store.last_fires() == {"shop/s": fire(-10_000)}
    assert store.leader("shop") is not None


def test_beat_times_must_be_timezone_aware(store: Store) -> None:
    naive = datetime(2026, 3, 1, 12, 0)
    with pytest.raises(ValueError, match="timezone-aware"):
        store.record_fire("shop/s", naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        store.record_leader("shop", "host-1:101", naive, now=at(0))
    with pytest.raises(ValueError, match="timezone-aware"):
        store.record_leader("shop", "host-1:101", at(0), now=naive)
    assert store.last_fires() == {}
    assert store.leader("shop") is None


def test_concurrent_fires_end_with_the_newest(store: Store) -> None:
    """Threads record fires of one schedule in orders of their own: the newest stays."""
    threads, per_thread = 6, 40
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        mine = [fire(i * threads + n, n) for i in range(per_thread)]
        random.Random(n).shuffle(mine)
        try:
            barrier.wait(timeout=30)
            for moment in mine:
                store.record_fire("shop/race", moment)
                last = store.last_fire("shop/race")
                assert last is not None
                assert last >= moment  # never behind a fire already recorded
        except BaseException as error:
            errors.append(error)

    pool = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=60)
    assert errors == []
    assert store.last_fire("shop/race") == fire((per_thread - 1) * threads + threads - 1, 5)


def test_a_closed_store_refuses_beat_calls(kit: Kit) -> None:
    kit.store.close()
    calls: list[Callable[[], object]] = [
        lambda: kit.store.record_fire("shop/s", fire(0)),
        lambda: kit.store.last_fire("shop/s"),
        lambda: kit.store.last_fires("shop/"),
        lambda: kit.store.record_leader("shop", "host-1:101", at(0)),
        lambda: kit.store.leader("shop"),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="closed"):
            call()


@durable_only
def test_beat_records_persist_and_are_shared(kit: Kit) -> None:
    kit.store.record_fire("shop/s", fire(1, 999_999))
    kit.store.record_leader("shop", "host-1:101", at(0), now=at(1))
    with kit.reopen() as other:  # another process's view, while the first is open
        assert other.last_fire("shop/s") == fire(1, 999_999)
        other.record_fire("shop/s", fire(2))
    assert kit.store.last_fire("shop/s") == fire(2)
    kit.store.close()

    with kit.reopen() as reopened:
        assert reopened.last_fire("shop/s") == fire(2)
        assert reopened.last_fires("shop/") == {"shop/s": fire(2)}
        assert reopened.leader("shop") == LeaderRecord("shop", "host-1:101", at(0), at(1))


@durable_only
def test_a_database_from_before_the_beat_gains_its_tables(kit: Kit) -> None:
    assert kit.sql is not None
    kit.store.claim(job(), A, LEASE, now=at(0))
    kit.store.close()
    kit.sql("DROP TABLE broker_jobs_beat_fires")
    kit.sql("DROP TABLE broker_jobs_beat_leaders")

    with kit.reopen() as reopened:
        assert reopened.get("key-1") is not None  # the ledger is untouched
        reopened.record_fire("shop/s", fire(3))
        reopened.record_leader("shop", "host-1:101", at(0), now=at(1))
        assert reopened.last_fire("shop/s") == fire(3)
        assert reopened.leader("shop") is not None
    assert kit.sql("SELECT version FROM broker_jobs_schema") == [(4,)]  # the ledger: 4


# --- arguments, lifecycle, schema -------------------------------------------------------------


def test_bad_arguments_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        store.claim(job(), A, LEASE, now=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="lease"):
        store.claim(job(), A, 0)
    with pytest.raises(ValueError, match="limit"):
        store.find(limit=-1)


def test_times_in_other_zones_are_stored_as_utc(store: Store) -> None:
    paris = datetime(2026, 3, 1, 13, 0, tzinfo=timezone(timedelta(hours=1)))  # T0 in UTC
    store.claim(job(), A, LEASE, now=paris)
    record = store.get("key-1")
    assert record is not None
    assert record.created_at == T0
    assert record.created_at.tzinfo == UTC


def test_real_clock_when_now_is_not_given(store: Store) -> None:
    before = datetime.now(UTC) - timedelta(seconds=5)
    claim = store.claim(job(), A, LEASE)
    after = datetime.now(UTC) + timedelta(seconds=5)

    assert before <= claim.record.updated_at <= after
    assert claim.record.lease_until == claim.record.updated_at + timedelta(seconds=LEASE)
    store.renew("key-1", A, LEASE)
    store.succeed("key-1", A)
    assert store.claim(job(), B, LEASE).outcome is DONE


def test_a_closed_store_says_so(kit: Kit) -> None:
    kit.store.close()
    kit.store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        kit.store.claim(job(), A, LEASE, now=at(0))


@durable_only
def test_records_are_shared_by_every_store_on_the_same_data(kit: Kit) -> None:
    kit.store.claim(job(), A, LEASE, now=at(0))

    with kit.reopen() as other:
        assert other.claim(job(), B, LEASE, now=at(1)).outcome is BUSY
        other.claim(job("k2"), B, LEASE, now=at(1))
    assert kit.store.get("k2") is not None


@durable_only
def test_a_schema_from_a_newer_version_is_refused(kit: Kit) -> None:
    assert kit.sql is not None
    kit.store.close()
    kit.sql("UPDATE broker_jobs_schema SET version = 99")

    with pytest.raises(StoreError, match=r"newer broker-jobs.*version 99"):
        kit.reopen()


@durable_only
def test_the_tables_are_indexed_for_the_ledger(kit: Kit) -> None:
    assert kit.sql is not None
    if kit.kind == "sqlite":
        rows = kit.sql("SELECT name FROM sqlite_master WHERE type = 'index'")
    else:
        rows = kit.sql("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
    names = {row[0] for row in rows}
    # SQLite indexes the job ids of the records whose key is not their id (the others
    # are found by key): a claim of a job keyed by its id writes no entry there.
    job_id = (
        "broker_jobs_records_other_job_id" if kit.kind == "sqlite" else "broker_jobs_records_job_id"
    )
    assert {"broker_jobs_records_status", "broker_jobs_records_task", job_id} <= names


def test_sqlite_swaps_a_version_1_job_id_index_for_the_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    with SQLiteStore(path) as store:
        store.claim(Job(id="plain", task="image.resize"), A, LEASE, now=at(0))
        store.claim(job("k1"), A, LEASE, now=at(1))
    with sqlite3.connect(path) as conn:  # the index as version 1 created it
        conn.execute("DROP INDEX broker_jobs_records_other_job_id")
        conn.execute("CREATE INDEX broker_jobs_records_job_id ON broker_jobs_records (job_id)")
    conn.close()

    with SQLiteStore(path) as reopened:
        assert [r.idempotency_key for r in reopened.get_by_job_id("plain")] == ["plain"]
        assert [r.idempotency_key for r in reopened.get_by_job_id("id-k1")] == ["k1"]
    with sqlite3.connect(path) as conn:
        indexes = {
            row[0]: row[1]
            for row in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index'"
                " AND name LIKE 'broker_jobs_records%job_id'"
            )
        }
    conn.close()
    assert list(indexes) == ["broker_jobs_records_other_job_id"]
    assert "WHERE job_id <> idempotency_key" in indexes["broker_jobs_records_other_job_id"]


# --- concurrency ------------------------------------------------------------------------------

RACE_KEYS = 500


def _race_job(i: int) -> Job:
    return Job(id=f"race-{i}", task="race.run", idempotency_key=f"race-{i}")


def _race_order(worker: str) -> list[int]:
    """Every key, in an order of the worker's own: in one shared order, the process
    holding the write lock keeps winning (SQLite's busy handler sleeps) and barely races."""
    order = list(range(RACE_KEYS))
    random.Random(worker).shuffle(order)
    return order


def _claim_all_in_process(path: str, worker: str, barrier: Any, results: Any) -> None:
    """Child process: open the store (racing to create it), then claim every key."""
    try:
        with SQLiteStore(path) as store:
            barrier.wait(timeout=60)
            claimed = [
                i
                for i in _race_order(worker)
                if store.claim(_race_job(i), worker, 300, now=T0).outcome is CLAIMED
            ]
        results.put((worker, claimed, None))
    except Exception as error:  # report to the parent rather than die silently
        results.put((worker, [], repr(error)))


def test_sqlite_processes_claim_each_key_exactly_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    path = str(tmp_path / "race.db")
    workers = [f"proc-{n}" for n in range(4)]
    barrier, results = context.Barrier(len(workers)), context.Queue()
    processes = [
        context.Process(target=_claim_all_in_process, args=(path, w, barrier, results))
        for w in workers
    ]
    started = time.monotonic()
    reports = reports_of(processes, results)
    elapsed = time.monotonic() - started

    assert [error for _, _, error in reports if error] == []
    claims = Counter(i for _, claimed, _ in reports for i in claimed)
    assert sum(claims.values()) == RACE_KEYS, f"{sum(claims.values())} claims in {elapsed:.1f} s"
    assert set(claims) == set(range(RACE_KEYS))
    assert max(claims.values()) == 1
    with SQLiteStore(path) as store:
        assert store.counts()[Status.RUNNING] == RACE_KEYS
        holders = Counter(r.worker for r in store.find(limit=RACE_KEYS))
    assert holders == Counter({w: len(c) for w, c, _ in reports if c})


def _race_threads(store: Store, threads: int) -> Counter[int]:
    barrier = threading.Barrier(threads)
    claimed: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(worker: str) -> None:
        try:
            barrier.wait(timeout=30)
            mine = [
                i
                for i in _race_order(worker)
                if store.claim(_race_job(i), worker, 300, now=T0).outcome is CLAIMED
            ]
            with lock:
                claimed.extend(mine)
        except BaseException as error:
            errors.append(error)

    pool = [threading.Thread(target=run, args=(f"thread-{n}",)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=100)
    assert errors == []
    return Counter(claimed)


def test_sqlite_threads_claim_each_key_exactly_once(
    tmp_path: Path, make_store: Callable[[Callable[[], Store]], Store]
) -> None:
    store = make_store(lambda: SQLiteStore(tmp_path / "race.db"))

    claims = _race_threads(store, 8)

    assert set(claims) == set(range(RACE_KEYS))
    assert max(claims.values()) == 1


def test_postgres_threads_claim_each_key_exactly_once(
    postgres_dsn: str, pg_schema: str, make_store: Callable[[Callable[[], Store]], Store]
) -> None:
    store = make_store(lambda: PostgresStore(postgres_dsn, schema=pg_schema, max_connections=8))

    claims = _race_threads(store, 8)

    assert set(claims) == set(range(RACE_KEYS))
    assert max(claims.values()) == 1
    assert store.counts()[Status.RUNNING] == RACE_KEYS


def test_postgres_stores_starting_together_create_the_tables_once(
    postgres_dsn: str, pg_schema: str
) -> None:
    stores: list[Store] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def start() -> None:
        try:
            barrier.wait(timeout=30)
            stores.append(PostgresStore(postgres_dsn, schema=pg_schema, max_connections=1))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for opened in stores:
        opened.close()
    assert errors == []
    assert len(stores) == 6


def _record_fires_in_process(
    path: str, n: int, per_worker: int, barrier: Any, results: Any
) -> None:
    """Child process: two threads record increasing fires of one schedule, one of them
    through the store thread (``SQLiteStore.call``), checking they never see one older
    than their own."""
    import asyncio  # noqa: PLC0415

    errors: list[str] = []

    def moments(thread: int) -> list[datetime]:
        return [fire(i * 4 + n * 2 + thread, i) for i in range(per_worker)]

    def direct(store: SQLiteStore) -> None:
        for moment in moments(0):
            store.record_fire("shop/race", moment)
            last = store.last_fire("shop/race")
            if last is None or last < moment:
                errors.append(f"{moment} recorded, then read {last}")

    async def through_the_store_thread(store: SQLiteStore) -> None:
        for moment in moments(1):
            await store.call("record_fire", "shop/race", moment)
            last = await store.call("last_fire", "shop/race")
            if last is None or last < moment:
                errors.append(f"{moment} recorded, then read {last}")

    try:
        with SQLiteStore(path) as store:
            barrier.wait(timeout=60)
            thread = threading.Thread(target=direct, args=(store,))
            thread.start()
            asyncio.run(through_the_store_thread(store))
            thread.join(timeout=60)
        results.put(errors)
    except Exception as error:  # report to the parent rather than die silently
        results.put([repr(error)])


def test_sqlite_processes_recording_fires_end_with_the_newest(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    path = str(tmp_path / "beat.db")
    per_worker = 60
    barrier, results = context.Barrier(2), context.Queue()
    processes = [
        context.Process(
            target=_record_fires_in_process, args=(path, n, per_worker, barrier, results)
        )
        for n in range(2)
    ]
    reports = reports_of(processes, results)

    assert reports == [[], []]
    with SQLiteStore(path) as store:
        newest = fire((per_worker - 1) * 4 + 3, per_worker - 1)
        assert store.last_fire("shop/race") == newest
        assert store.last_fires() == {"shop/race": newest}


def test_sqlite_beat_calls_group_commit_on_the_store_thread(
    tmp_path: Path, make_store: Callable[[Callable[[], Store]], Store]
) -> None:
    import asyncio  # noqa: PLC0415

    store = make_store(lambda: SQLiteStore(tmp_path / "jobs.db"))
    assert isinstance(store, SQLiteStore)

    async def together() -> list[Any]:
        return list(
            await asyncio.gather(
                store.call("claim", job(), A, LEASE, now=at(0)),
                store.call("record_fire", "shop/s", fire(2)),
                store.call("record_fire", "shop/s", fire(1)),  # older, in the same batch
                store.call("record_fire", "shop/bad", datetime(2026, 3, 1)),  # naive: refused
                store.call("record_leader", "shop", "host-1:101", at(0), now=at(1)),
                store.call("record_fire", "shop/t", fire(3)),
                return_exceptions=True,
            )
        )

    results = asyncio.run(together())

    assert results[0].outcome is CLAIMED
    assert results[1:3] == [None, None]
    assert isinstance(results[3], ValueError)
    assert results[4:] == [None, None]  # one refused call leaves the others of its batch
    assert store.last_fires() == {"shop/s": fire(2), "shop/t": fire(3)}
    assert store.leader("shop") == LeaderRecord("shop", "host-1:101", at(0), at(1))

    async def read() -> tuple[Any, Any, Any]:
        return (
            await store.call("last_fire", "shop/s"),
            await store.call("last_fires", "shop/"),
            await store.call("leader", "shop"),
        )

    assert asyncio.run(read()) == (
        fire(2),
        {"shop/s": fire(2), "shop/t": fire(3)},
        LeaderRecord("shop", "host-1:101", at(0), at(1)),
    )


def test_postgres_a_role_without_create_opens_a_database_from_before_the_beat(
    postgres_dsn: str, pg_schema: str
) -> None:
    """A worker upgraded with a role that may not create tables keeps working; the
    beat's calls say what to do until the tables exist."""
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415

    PostgresStore(postgres_dsn, schema=pg_schema).close()
    role = f"r_{uuid.uuid4().hex[:12]}"
    limited_dsn = make_conninfo(postgres_dsn, options=f"-c role={role}")
    with _admin(postgres_dsn) as conn:
        conn.execute(f'DROP TABLE "{pg_schema}".broker_jobs_beat_fires')
        conn.execute(f'DROP TABLE "{pg_schema}".broker_jobs_beat_leaders')
        conn.execute(f'CREATE ROLE "{role}"')
        conn.execute(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO "{role}"')
        conn.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{pg_schema}".broker_jobs_records TO "{role}"'
        )
        conn.execute(f'GRANT SELECT ON "{pg_schema}".broker_jobs_schema TO "{role}"')
    try:
        with PostgresStore(limited_dsn, schema=pg_schema) as limited:
            assert limited.claim(job(), A, LEASE, now=at(0)).outcome is CLAIMED
            with pytest.raises(StoreError, match="beat's tables are missing"):
                limited.record_fire("shop/s", fire(1))
            with pytest.raises(StoreError, match="beat's tables are missing"):
                limited.leader("shop")

        PostgresStore(postgres_dsn, schema=pg_schema).close()  # a role that may create them
        with PostgresStore(limited_dsn, schema=pg_schema) as limited:
            with pytest.raises(StoreError, match="Grant the beat's user"):
                limited.record_fire("shop/s", fire(1))
            with _admin(postgres_dsn) as conn:
                conn.execute(
                    f'GRANT SELECT, INSERT, UPDATE ON "{pg_schema}".broker_jobs_beat_fires,'
                    f' "{pg_schema}".broker_jobs_beat_leaders TO "{role}"'
                )
            limited.record_fire("shop/s", fire(1))
            assert limited.last_fire("shop/s") == fire(1)
    finally:
        with _admin(postgres_dsn) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def _sqlite_statements(path: Path, *statements: str) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            db.execute(statement)
    finally:
        db.close()


def test_an_sqlite_file_from_before_the_leaders_schedules_gets_the_column(tmp_path: Path) -> None:
    path = tmp_path / "beat.db"
    _sqlite_statements(  # the leaders' table as an older broker-jobs made it, with its record
        path,
        "CREATE TABLE broker_jobs_beat_leaders (group_name TEXT PRIMARY KEY,"
        " identity TEXT NOT NULL, since TEXT NOT NULL, seen_at TEXT NOT NULL) WITHOUT ROWID",
        "INSERT INTO broker_jobs_beat_leaders VALUES"
        " ('shop', 'old:1', '2026-03-01T12:00:00.000000Z', '2026-03-01T12:00:00.000000Z')",
    )
    with SQLiteStore(path) as store:
        assert store.leader("shop") == LeaderRecord("shop", "old:1", at(0), at(0))
        store.record_leader("shop", "new:2", at(0), now=at(1), schedules={"nightly": "ab"})
        assert store.leader("shop") == LeaderRecord(
            "shop", "new:2", at(0), at(1), {"nightly": "ab"}
        )
    _sqlite_statements(  # an older beat rewriting the record names its four columns
        path,
        "INSERT OR REPLACE INTO broker_jobs_beat_leaders (group_name, identity, since,"
        " seen_at) VALUES ('shop', 'old:1', '2026-03-01T12:00:05.000000Z',"
        " '2026-03-01T12:00:05.000000Z')",
    )
    with SQLiteStore(path) as store:
        assert store.leader("shop") == LeaderRecord("shop", "old:1", at(5), at(5))


def test_postgres_leaders_from_before_the_schedules_get_the_column_or_do_without(
    postgres_dsn: str, pg_schema: str
) -> None:
    """The owner adds the column when it opens the database; a role that may not
    records and reads the leader without schedules; an older beat's upsert, which
    leaves the column as it was, is not read as its own."""
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415

    PostgresStore(postgres_dsn, schema=pg_schema).close()
    leaders = f'"{pg_schema}".broker_jobs_beat_leaders'
    role = f"r_{uuid.uuid4().hex[:12]}"
    limited_dsn = make_conninfo(postgres_dsn, options=f"-c role={role}")
    with _admin(postgres_dsn) as conn:
        conn.execute(f"ALTER TABLE {leaders} DROP COLUMN schedules")  # as an older one has it
        conn.execute(f'CREATE ROLE "{role}"')
        conn.execute(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO "{role}"')
        conn.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{pg_schema}".broker_jobs_records,'
            f' "{pg_schema}".broker_jobs_beat_fires, {leaders} TO "{role}"'
        )
        conn.execute(f'GRANT SELECT ON "{pg_schema}".broker_jobs_schema TO "{role}"')
    try:
        with PostgresStore(limited_dsn, schema=pg_schema) as limited:
            limited.record_leader("shop", "b:1", at(0), now=at(1), schedules={"nightly": "ab"})
            assert limited.leader("shop") == LeaderRecord("shop", "b:1", at(0), at(1))

        with PostgresStore(postgres_dsn, schema=pg_schema) as owner:  # adds the column
            owner.record_leader("shop", "b:1", at(0), now=at(2), schedules={"nightly": "ab"})
            assert owner.leader("shop") == LeaderRecord(
                "shop", "b:1", at(0), at(2), {"nightly": "ab"}
            )
            with _admin(postgres_dsn) as conn:  # an older beat's upsert of its four columns
                conn.execute(
                    f"INSERT INTO {leaders} (group_name, identity, since, seen_at)"
                    " VALUES ('shop', 'old:9', now(), now()) ON CONFLICT (group_name) DO UPDATE"
                    " SET identity = excluded.identity, since = excluded.since,"
                    " seen_at = excluded.seen_at"
                )
            found = owner.leader("shop")
            assert found is not None
            assert (found.identity, found.schedules) == ("old:9", None)
    finally:
        with _admin(postgres_dsn) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


# --- PostgreSQL: exactly-once effects -------------------------------------------------------------


@pytest.fixture
def pg(
    postgres_dsn: str, pg_schema: str, make_store: Callable[[Callable[[], Store]], Store]
) -> PostgresStore:
    """A PostgresStore plus an ``effects`` table beside its records."""
    store = PostgresStore(postgres_dsn, schema=pg_schema)
    make_store(lambda: store)
    with _admin(postgres_dsn) as conn:
        conn.execute(f'CREATE TABLE "{pg_schema}".effects (key text PRIMARY KEY)')
    return store


def _effects_rows(dsn: str, schema: str) -> list[str]:
    with _admin(dsn) as conn:
        return [row[0] for row in conn.execute(f'SELECT key FROM "{schema}".effects')]


def _write_effect(schema: str, key: str) -> Callable[[Any], None]:
    def effects(conn: Any) -> None:
        conn.execute(f'INSERT INTO "{schema}".effects (key) VALUES (%s)', (key,))

    return effects


def test_succeed_with_commits_effects_and_success_together(
    pg: PostgresStore, postgres_dsn: str, pg_schema: str
) -> None:
    pg.claim(job(), A, LEASE, now=at(0))

    pg.succeed_with("key-1", A, _write_effect(pg_schema, "key-1"), now=at(1))

    assert _effects_rows(postgres_dsn, pg_schema) == ["key-1"]
    record = pg.get("key-1")
    assert record is not None
    assert (record.status, record.updated_at, record.lease_until) == (
        Status.SUCCEEDED,
        at(1),
        None,
    )


def test_succeed_with_rolls_back_when_the_lease_was_lost(
    pg: PostgresStore, postgres_dsn: str, pg_schema: str
) -> None:
    pg.claim(job(), A, LEASE, now=at(0))
    pg.claim(job(), B, LEASE, now=at(LEASE + 1))  # B took over

    with pytest.raises(LeaseLostError, match="worker-b"):
        pg.succeed_with("key-1", A, _write_effect(pg_schema, "key-1"), now=at(LEASE + 2))

    assert _effects_rows(postgres_dsn, pg_schema) == []
    assert pg.get("key-1").status is Status.RUNNING  # type: ignore[union-attr]


def test_succeed_with_rolls_back_when_the_effects_fail(
    pg: PostgresStore, postgres_dsn: str, pg_schema: str
) -> None:
    import psycopg  # noqa: PLC0415

    pg.claim(job(), A, LEASE, now=at(0))

    def half_done(conn: Any) -> None:
        _write_effect(pg_schema, "first")(conn)
        _write_effect(pg_schema, "first")(conn)  # duplicate key: the handler's own error

    with pytest.raises(psycopg.errors.UniqueViolation):
        pg.succeed_with("key-1", A, half_done, now=at(1))

    assert _effects_rows(postgres_dsn, pg_schema) == []
    record = pg.get("key-1")
    assert record is not None
    assert (record.status, record.worker) == (Status.RUNNING, A)
    pg.succeed_with("key-1", A, _write_effect(pg_schema, "second"), now=at(2))  # still ours
    assert _effects_rows(postgres_dsn, pg_schema) == ["second"]


def test_a_takeover_waits_for_succeed_with_and_sees_done(
    pg: PostgresStore, postgres_dsn: str, pg_schema: str
) -> None:
    pg.claim(job(), A, LEASE, now=at(0))
    outcomes: list[ClaimOutcome] = []

    def effects(conn: Any) -> None:
        _write_effect(pg_schema, "key-1")(conn)
        # A's lease has expired by B's clock: B's claim must wait for our transaction.
        taker = threading.Thread(
            target=lambda: outcomes.append(pg.claim(job(), B, LEASE, now=at(LEASE + 5)).outcome)
        )
        taker.start()
        _await_lock_wait(postgres_dsn)
        assert outcomes == []
        effects.taker = taker  # type: ignore[attr-defined]

    pg.succeed_with("key-1", A, effects, now=at(LEASE + 1))
    effects.taker.join(timeout=30)  # type: ignore[attr-defined]

    assert outcomes == [DONE]
    assert _effects_rows(postgres_dsn, pg_schema) == ["key-1"]


def _await_lock_wait(dsn: str, within: float = 10.0) -> None:
    """Until some session waits for a lock (the taker's claim on our locked row)."""
    deadline = time.monotonic() + within
    with _admin(dsn) as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ).fetchone()[0]
            if waiting:
                return
            time.sleep(0.01)
    pytest.fail("the concurrent claim never waited for the row lock")


# --- PostgreSQL: errors ---------------------------------------------------------------------


def test_an_unreachable_database_is_a_store_error_without_the_password() -> None:
    dsn = f"postgresql://shop:s3cret-pw@127.0.0.1:{closed_port()}/jobs?connect_timeout=2"
    with pytest.raises(StoreError, match="reachable") as caught:
        PostgresStore(dsn)
    assert "s3cret-pw" not in str(caught.value)
    assert "shop:***@127.0.0.1" in str(caught.value)


def test_the_store_reconnects_after_its_connections_were_killed(
    postgres_dsn: str, pg_schema: str, make_store: Callable[[Callable[[], Store]], Store]
) -> None:
    store = make_store(lambda: PostgresStore(postgres_dsn, schema=pg_schema))
    store.claim(job(), A, LEASE, now=at(0))
    with _admin(postgres_dsn) as conn:
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'broker-jobs' AND pid <> pg_backend_pid()"
        ).fetchone()[0]
    assert killed >= 1

    with pytest.raises(StoreError, match="reachable"):  # the call that meets the break
        store.get("key-1")
    assert store.get("key-1") is not None  # a new connection
    assert store.claim(job(), B, LEASE, now=at(1)).outcome is BUSY


def test_without_psycopg_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgres_module, "_MISSING", ImportError("No module named 'psycopg'"))
    with pytest.raises(StoreError, match=r"pip install 'broker-jobs\[postgres\]'"):
        PostgresStore("postgresql://localhost/db")


def test_an_invalid_dsn_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="invalid PostgreSQL DSN") as caught:
        PostgresStore("host=localhost password=hunter2 bogus_option=1")
    assert "hunter2" not in str(caught.value)


def closed_port() -> int:
    """A local TCP port nobody listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- SQLite: errors -----------------------------------------------------------------------


def test_sqlite_in_a_missing_directory_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="Create the directory"):
        SQLiteStore(tmp_path / "missing" / "jobs.db")


def test_sqlite_on_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("this is not a database, " * 100)
    with pytest.raises(StoreError, match="not a"):
        SQLiteStore(path)


def test_sqlite_refuses_an_in_memory_database() -> None:
    with pytest.raises(StoreError, match="memory://"):
        SQLiteStore(":memory:")


def test_sqlite_uses_wal_and_a_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT version FROM broker_jobs_schema").fetchall() == [(4,)]
    finally:
        conn.close()


def test_sqlite_waits_for_another_writer_then_gives_up(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with SQLiteStore(path, busy_timeout=0.2) as store:
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreError, match="locked by another process"):
                store.claim(job(), A, LEASE, now=at(0))
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        assert store.claim(job(), A, LEASE, now=at(0)).outcome is CLAIMED


# --- URLs ---------------------------------------------------------------------------------


def test_open_store_from_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store("memory://") as memory:
        assert isinstance(memory, MemoryStore)
    with open_store("sqlite:///relative.db") as relative:
        assert isinstance(relative, SQLiteStore)
        assert relative.path == Path("relative.db")
    assert (tmp_path / "relative.db").exists()
    absolute = tmp_path / "sub" / "abs.db"
    absolute.parent.mkdir()
    with open_store(f"sqlite:///{absolute}") as opened:  # f"sqlite:///" + "/tmp/..."
        assert isinstance(opened, SQLiteStore)
        assert opened.path == absolute
    assert absolute.exists()


@pytest.mark.parametrize(
    "url", ["redis://localhost/0", "sqlite://host/x.db", "sqlite://", "jobs.db", "memory://x"]
)
def test_open_store_refuses_other_urls(url: str) -> None:
    with pytest.raises(StoreError, match=r"sqlite:///|memory://"):
        open_store(url)


def test_open_store_postgres_urls_and_schema(postgres_dsn: str, pg_schema: str) -> None:
    separator = "&" if "?" in postgres_dsn else "?"
    for url in (postgres_dsn, postgres_dsn.replace("postgresql://", "postgres://", 1)):
        with open_store(f"{url}{separator}schema={pg_schema}") as store:
            assert isinstance(store, PostgresStore)
            assert store.schema == pg_schema
            store.claim(job(), A, LEASE, now=at(0))
            assert store.get("key-1") is not None


def test_mask_dsn() -> None:
    assert mask_dsn("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert mask_dsn("error at postgres://u:p%40ss@h/db now") == "error at postgres://u:***@h/db now"
    assert mask_dsn("host=h password=secret user=u") == "host=h password=*** user=u"
    assert mask_dsn("host=h password='se cret' user=u") == "host=h password=*** user=u"
    assert mask_dsn("postgresql://h/db?password=secret&x=1") == "postgresql://h/db?password=***&x=1"
    assert mask_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


def test_sqlite_creates_its_ledger_readable_by_its_owner_only(tmp_path: Path) -> None:
    """The ledger holds payloads, results and errors: not for every local user. A file
    that exists keeps the mode its operator gave it."""
    path = tmp_path / "ledger.db"
    with SQLiteStore(path) as store:
        store.claim(job(), A, LEASE, now=at(0))
        modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes["ledger.db"] == 0o600
    assert all(mode == 0o600 for mode in modes.values()), modes  # -wal, -shm alike
    shared = tmp_path / "shared.db"
    shared.touch(mode=0o640)
    shared.chmod(0o640)
    with SQLiteStore(shared) as store:
        store.claim(job(), A, LEASE, now=at(0))
    assert shared.stat().st_mode & 0o777 == 0o640
