"""The payloads the ledger keeps (schema version 4): with a record published with the
ledger, with a failure (retry, fail, dead), the first one for a key only, pruned with
its record, capped in size; on every store, with fixed clocks. And the version 3 -> 4
migration of SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from broker_jobs import Job
from broker_jobs.store import PostgresStore, SQLiteStore, Status, Store
from broker_jobs.store import postgres as postgres_module
from broker_jobs.store import sqlite as sqlite_module
from broker_jobs.store.base import MAX_PAYLOAD_BYTES, LeaseLostError
from tests.test_store import LEASE, A, B, Kit, _admin, at, durable_only

NOTE = {"text": "<script>alert(1)</script>", "nul": "a\x00b", "n": [1, 2.5, None]}


def job(key: str = "key-1", payload: dict[str, Any] | None = None, attempt: int = 1) -> Job:
    return Job(
        id=f"id-{key}",
        task="notes.write",
        idempotency_key=key,
        attempt=attempt,
        payload=NOTE if payload is None else payload,
    )


def claimed(store: Store, key: str = "key-1", worker: str = A) -> Job:
    found = job(key)
    store.claim(found, worker, LEASE, now=at(0))
    return found


# --- when it is kept ------------------------------------------------------------------------


def test_record_published_keeps_each_created_records_payload(store: Store) -> None:
    store.record_published([job("a"), job("b", {"other": True})], now=at(0))

    assert store.payload("a") == NOTE  # NUL and markup are data, as given
    assert store.payload("b") == {"other": True}
    kept = store.kept_payload("a")
    assert kept is not None
    assert (kept.kept_at, kept.too_large) == (at(0), False)
    assert store.payload("never-seen") is None
    assert store.kept_payload("never-seen") is None


def test_a_key_with_a_record_already_keeps_no_published_payload(store: Store) -> None:
    claimed(store, "running")  # claimed before the publisher recorded it: not its record
    store.record_published([job("running", {"late": 1})], now=at(1))
    assert store.payload("running") is None


def test_a_claim_and_a_success_keep_no_payload(store: Store) -> None:
    claimed(store)
    store.succeed("key-1", A, now=at(1))
    assert store.payload("key-1") is None


@pytest.mark.parametrize("outcome", ["retry", "fail", "dead"])
def test_a_failure_keeps_the_payload(store: Store, outcome: str) -> None:
    claimed(store)
    if outcome == "retry":
        store.retry("key-1", A, "boom", at(10), now=at(1), payload=NOTE)
    elif outcome == "fail":
        store.fail("key-1", A, "boom", now=at(1), payload=NOTE)
    else:
        store.dead("key-1", A, "boom", job=job(), now=at(1), payload=NOTE)

    assert store.payload("key-1") == NOTE
    record = store.get("key-1")
    assert record is not None
    assert record.last_error == "boom"


def test_the_first_payload_kept_wins(store: Store) -> None:
    store.record_published([job(payload={"v": "published"})], now=at(0))
    store.claim(job(), A, LEASE, now=at(1))
    store.retry("key-1", A, "boom", at(10), now=at(2), payload={"v": "retried"})
    store.claim(job(attempt=2), A, LEASE, now=at(10))
    store.dead("key-1", A, "boom", job=job(attempt=2), now=at(11), payload={"v": "dead"})

    kept = store.kept_payload("key-1")
    assert kept is not None
    assert (kept.payload, kept.kept_at) == ({"v": "published"}, at(0))


def test_a_lost_lease_keeps_no_payload(store: Store) -> None:
    claimed(store, worker=B)
    with pytest.raises(LeaseLostError):
        store.retry("key-1", A, "boom", at(10), now=at(1), payload=NOTE)
    with pytest.raises(LeaseLostError):
        store.fail("key-1", A, "boom", now=at(1), payload=NOTE)
    assert store.payload("key-1") is None


def test_a_poison_message_dead_lettered_unclaimed_keeps_its_payload(store: Store) -> None:
    store.dead("poison", None, "schema: bad", job=job("poison"), now=at(0), payload=NOTE)
    assert store.payload("poison") == NOTE
    store.dead("no-job", None, "json: bad", job_id="m-1", task="notes.write", now=at(0))
    assert store.payload("no-job") is None


def test_an_outcome_never_overwritten_keeps_no_payload(store: Store) -> None:
    claimed(store)
    store.succeed("key-1", A, now=at(1))
    store.dead("key-1", None, "late", job=job(), now=at(2), payload=NOTE)  # unchanged
    assert store.payload("key-1") is None


# --- size, pruning -------------------------------------------------------------------------


def test_a_payload_larger_than_the_cap_is_kept_as_its_size_only(store: Store) -> None:
    # {"blob":"..."} is 11 bytes around the blob.
    fits, too_big = "x" * (MAX_PAYLOAD_BYTES - 11), "x" * (MAX_PAYLOAD_BYTES - 10)
    store.record_published([job("fits", {"blob": fits}), job("big", {"blob": too_big})], now=at(0))

    assert store.payload("fits") == {"blob": fits}
    big = store.kept_payload("big")
    assert big is not None
    assert (big.payload, big.too_large, big.size) == (None, True, MAX_PAYLOAD_BYTES + 1)
    assert store.payload("big") is None
    # Too large counts as kept: a failure does not try again.
    store.claim(job("big", {"blob": too_big}), A, LEASE, now=at(1))
    store.fail("big", A, "boom", now=at(2), payload={"blob": too_big})
    assert store.kept_payload("big") == big


def test_prune_deletes_the_payloads_with_their_records(store: Store) -> None:
    store.record_published([job("old"), job("waiting")], now=at(0))
    store.claim(job("old"), A, LEASE, now=at(1))
    store.fail("old", A, "boom", now=at(2))
    store.claim(job("retrying"), A, LEASE, now=at(1))
    store.retry("retrying", A, "boom", at(100), now=at(2), payload=NOTE)

    assert store.prune(at(50)) == 1
    assert store.kept_payload("old") is None
    assert store.payload("waiting") == NOTE  # not terminal: kept
    assert store.payload("retrying") == NOTE
    store.record_published([job("old", {"again": 1})], now=at(60))  # a pruned key anew
    assert store.payload("old") == {"again": 1}


@durable_only
def test_payloads_live_in_their_own_table(kit: Kit) -> None:
    assert kit.sql is not None
    kit.store.record_published([job()], now=at(0))
    (row,) = kit.sql("SELECT idempotency_key, payload, bytes FROM broker_jobs_payloads")
    assert row[0] == "key-1"
    assert row[2] == len(row[1].encode("utf-8"))
    columns = (
        kit.sql("SELECT name FROM pragma_table_info('broker_jobs_records')")
        if kit.kind == "sqlite"
        else kit.sql(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = 'broker_jobs_records'"
        )
    )
    assert "payload" not in {name for (name,) in columns}  # the hot table stays narrow
    with kit.reopen() as other:
        assert other.payload("key-1") == NOTE


def test_sqlite_keeps_payloads_in_the_store_threads_batch(tmp_path: Path) -> None:
    """Outcomes queued together commit in one transaction, payloads included."""
    with SQLiteStore(tmp_path / "jobs.db") as store:
        for key in ("a", "b", "c"):
            store.claim(job(key), A, LEASE, now=at(0))

        async def fail_together() -> list[Any]:
            return await asyncio.gather(
                store.call("retry", "a", A, "boom", at(10), payload={"k": "a"}),
                store.call("fail", "b", A, "boom", payload={"k": "b"}),
                store.call("fail", "c", B, "not ours", payload={"k": "c"}),
                return_exceptions=True,
            )

        results = asyncio.run(fail_together())
        assert results[:2] == [None, None]
        assert isinstance(results[2], LeaseLostError)
        assert [store.payload(k) for k in ("a", "b", "c")] == [{"k": "a"}, {"k": "b"}, None]


# --- schema version 3 -> 4 -----------------------------------------------------------------


def _downgrade_sqlite_to_version_3(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("DROP TABLE broker_jobs_payloads")
        conn.execute("UPDATE broker_jobs_schema SET version = 3")
    finally:
        conn.close()


def test_sqlite_migrates_a_version_3_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "v3.sqlite3"
    with SQLiteStore(path) as old:
        old.record_published([job("queued")], now=at(0))
        old.claim(job("done"), A, LEASE, now=at(0))
        old.succeed("done", A, now=at(1))
    _downgrade_sqlite_to_version_3(path)

    caplog.set_level("INFO", logger=sqlite_module.__name__)
    with SQLiteStore(path) as migrated:
        assert "migrated from schema version 3 to 4 (payloads)" in caplog.text
        queued, done = migrated.get("queued"), migrated.get("done")
        assert queued is not None
        assert done is not None
        assert (queued.status, done.status) == (Status.QUEUED, Status.SUCCEEDED)
        assert len(migrated.executions("done")) == 1
        assert migrated.payload("queued") is None  # kept before: none
        migrated.record_published([job("new")], now=at(2))
        assert migrated.payload("new") == NOTE
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("SELECT version FROM broker_jobs_schema").fetchall()
    finally:
        conn.close()
    assert version == [(4,)] == [(sqlite_module.SCHEMA_VERSION,)]


def test_postgres_migrates_a_version_3_database(postgres_dsn: str, pg_schema: str) -> None:
    with PostgresStore(postgres_dsn, schema=pg_schema) as old:
        old.record_published([job("queued")], now=at(0))
        old.claim(job("held"), A, LEASE, now=at(1))
    with _admin(postgres_dsn) as conn:
        conn.execute(f'DROP TABLE "{pg_schema}".broker_jobs_payloads')
        conn.execute(f'UPDATE "{pg_schema}".broker_jobs_schema SET version = 3')

    with PostgresStore(postgres_dsn, schema=pg_schema) as migrated:
        queued = migrated.get("queued")
        assert queued is not None
        assert queued.status is Status.QUEUED
        assert migrated.payload("queued") is None
        migrated.retry("held", A, "boom", at(10), now=at(2), payload=NOTE)
        assert migrated.payload("held") == NOTE
        assert migrated.prune(at(100)) == 0
    with _admin(postgres_dsn) as conn:
        row = conn.execute(f'SELECT max(version) FROM "{pg_schema}".broker_jobs_schema').fetchone()
    assert row is not None
    assert row[0] == 4 == postgres_module.SCHEMA_VERSION
