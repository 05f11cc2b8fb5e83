"""What a success keeps beside its record (docs/store.md, "Results and follow-ups"):
the handler's result and the follow-up jobs, written in the same atomic step as the
success, replacing any kept before, capped in size, marked sent, pruned with the
record; on every store, with fixed clocks. And reading them: ``result``, ``wait``;
and the table added to a file or database of an older layout when a store opens it."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from broker_jobs import Job
from broker_jobs.store import MemoryStore, PostgresStore, SQLiteStore, Status, Store
from broker_jobs.store import postgres as postgres_module
from broker_jobs.store import sqlite as sqlite_module
from broker_jobs.store.base import MAX_PAYLOAD_BYTES, LeaseLostError, Output, json_text
from broker_jobs.store.errors import StoreError
from tests.test_store import LEASE, A, B, Kit, _admin, at, durable_only

RESULTS: list[Any] = [{"n": 1, "text": "é\x00<b>"}, [1, 2.5, None], "done", 42, True, None]


def claimed(store: Store, key: str = "key-1", worker: str = A) -> Job:
    job = Job(id=f"id-{key}", task="notes.write", idempotency_key=key)
    store.claim(job, worker, LEASE, now=at(0))
    return job


def child(key: str) -> Job:
    return Job(task="notes.next", payload={"from": key}, idempotency_key=f"{key}>1")


def forget_record(kit: Kit, key: str) -> None:
    """Delete ``key``'s record and leave its output, as the prune of a broker-jobs
    older than the outputs table does (it ignores the table)."""
    if kit.sql is None:
        assert isinstance(kit.store, MemoryStore)
        del kit.store._records[key]
        kit.store._finished.pop(key, None)
    else:
        kit.sql(f"DELETE FROM broker_jobs_records WHERE idempotency_key = '{key}'")


@pytest.mark.parametrize("value", RESULTS, ids=["dict", "list", "str", "int", "bool", "null"])
def test_a_success_keeps_its_result(store: Store, value: Any) -> None:
    claimed(store)
    store.succeed("key-1", A, now=at(1), output=Output(json_text(value)))

    kept = store.output("key-1")
    assert kept is not None
    assert (kept.result, kept.kept_at, kept.result_too_large) == (value, at(1), False)
    assert kept.follow_ups == ()
    assert store.result("key-1") == value
    assert store.result("id-key-1") == value  # by job id too


def test_a_result_too_large_keeps_only_its_size(store: Store) -> None:
    claimed(store)
    store.succeed("key-1", A, output=Output(json_text("x" * MAX_PAYLOAD_BYTES)))
    kept = store.output("key-1")
    assert kept is not None
    assert kept.result is None
    assert kept.result_too_large
    assert kept.result_size == MAX_PAYLOAD_BYTES + 2


def test_follow_ups_round_trip_in_order_until_marked_sent(store: Store) -> None:
    claimed(store)
    jobs = (child("key-1"), Job(task="notes.other", payload={"k": [1]}, idempotency_key="x"))
    store.succeed("key-1", A, now=at(1), output=Output(None, jobs))

    kept = store.output("key-1")
    assert kept is not None
    assert kept.follow_ups == jobs
    assert kept.result_size is None
    assert kept.follow_ups_pending
    assert kept.kept_at.utcoffset() == timedelta(0)
    store.mark_follow_ups_sent("key-1", now=at(2))
    sent = store.output("key-1")
    assert sent is not None
    assert (sent.sent_at, sent.follow_ups_pending) == (at(2), False)
    assert sent.sent_at is not None
    assert sent.sent_at.utcoffset() == timedelta(0)
    assert (sent.follow_ups, sent.kept_at) == (jobs, at(1))  # only sent_at changed
    store.mark_follow_ups_sent("never-seen")  # nothing to mark: nothing happens


def test_no_output_keeps_nothing_and_a_lost_lease_writes_nothing(store: Store) -> None:
    claimed(store, "plain")
    store.succeed("plain", A)
    assert store.output("plain") is None
    assert store.result("plain") is None
    claimed(store, "empty")
    store.succeed("empty", A, output=Output())  # nothing to keep: no row
    assert store.output("empty") is None

    claimed(store, "taken")
    with pytest.raises(LeaseLostError):
        store.succeed("taken", B, output=Output(json_text({"a": 1})))
    assert store.output("taken") is None
    assert store.get("taken").status is Status.RUNNING  # type: ignore[union-attr]


def test_succeed_with_keeps_the_effects_output_in_its_transaction(store: Store) -> None:
    claimed(store, "tx")
    store.succeed_with("tx", A, lambda db: Output(json_text({"wrote": 1})), now=at(1))
    assert store.result("tx") == {"wrote": 1}
    kept = store.output("tx")
    assert kept is not None
    assert kept.kept_at == at(1)
    claimed(store, "none")
    store.succeed_with("none", A, lambda db: None)
    assert store.get("none").status is Status.SUCCEEDED  # type: ignore[union-attr]
    assert store.output("none") is None

    claimed(store, "failing")

    def fail(db: object) -> Output:
        raise RuntimeError("the handler failed")

    with pytest.raises(RuntimeError):
        store.succeed_with("failing", A, fail)
    assert store.output("failing") is None
    record = store.get("failing")
    assert record is not None
    assert (record.status, record.worker) == (Status.RUNNING, A)  # still ours, unrecorded
    with pytest.raises(LeaseLostError):  # not held: effects never run, nothing kept
        store.succeed_with("failing", B, lambda db: Output(json_text("no")))
    assert store.output("failing") is None


def test_prune_deletes_the_output_with_its_record(store: Store) -> None:
    claimed(store)
    store.succeed("key-1", A, now=at(1), output=Output(json_text(1)))
    assert store.prune(at(10)) == 1
    assert store.output("key-1") is None


def test_wait_returns_the_ended_record_or_says_the_status(store: Store) -> None:
    claimed(store, "running")
    with pytest.raises(
        TimeoutError, match=r"job 'running' did not end within 0.05 s \(status running\)"
    ):
        store.wait("running", timeout=0.05, poll=0.01)
    # A second publish of a key is never recorded under its own id: the error says to
    # wait by the key (the guide's script failed so on its second run).
    with pytest.raises(
        TimeoutError, match=r"\(no record: .* duplicate .* wait by the idempotency key\)"
    ):
        store.wait("never-seen", timeout=0.01, poll=0.01)
    store.succeed("running", A)
    assert store.wait("id-running", timeout=5).status is Status.SUCCEEDED
    claimed(store, "failed")
    store.fail("failed", A, "ValueError: bad")
    assert store.wait("failed", timeout=0).status is Status.FAILED  # ended: no wait


# --- replacing, batching, reading ---------------------------------------------------------


@pytest.mark.parametrize("way", ["succeed", "succeed_with", "succeed_many_keeping"])
def test_a_later_success_of_the_key_replaces_its_output(kit: Kit, way: str) -> None:
    store = kit.store
    claimed(store)
    first = Output(json_text("first"), (child("key-1"),))
    store.succeed("key-1", A, now=at(1), output=first)
    store.mark_follow_ups_sent("key-1", now=at(2))
    forget_record(kit, "key-1")
    claimed(store)  # the key runs again; the row left behind is no result of this run
    assert store.output("key-1") is not None
    assert store.result("key-1") is None

    later = Job(task="notes.later", idempotency_key="later")
    second = Output(json_text({"second": 2}), (later,))
    if way == "succeed":
        store.succeed("key-1", A, now=at(5), output=second)
    elif way == "succeed_with":
        store.succeed_with("key-1", A, lambda db: second, now=at(5))
    else:
        assert store.succeed_many_keeping([("key-1", A, second)]) == []
    kept = store.output("key-1")
    assert kept is not None
    assert (kept.result, kept.follow_ups, kept.sent_at) == ({"second": 2}, (later,), None)
    assert kept.follow_ups_pending  # the new follow-ups still go out
    if way != "succeed_many_keeping":  # it takes the store's time
        assert kept.kept_at == at(5)


def test_a_later_success_that_keeps_nothing_does_not_read_the_output_left_behind(
    kit: Kit,
) -> None:
    store = kit.store
    claimed(store)
    store.succeed("key-1", A, now=at(1), output=Output(json_text("first"), (child("key-1"),)))
    forget_record(kit, "key-1")  # its follow-ups were never marked sent
    claimed(store)
    store.succeed("key-1", A, now=at(5))  # the common success: no output written

    record = store.get("key-1")
    assert record is not None
    assert store.output("key-1") is not None  # the row is still there...
    assert store.output_of(record) is None  # ...but it is no output of this success
    assert store.result("key-1") is None


def test_succeed_many_keeping_keeps_each_output_and_says_which_were_lost(store: Store) -> None:
    for key in ("a", "b", "c"):
        claimed(store, key)
    outputs = [("b", A, Output(json_text("b"))), ("a", A, Output(json_text("a")))]
    lost = store.succeed_many_keeping([*outputs, ("c", B, Output(json_text("c")))])
    assert lost == ["c"]
    assert [store.result(key) for key in ("a", "b")] == ["a", "b"]
    assert store.output("c") is None
    assert store.get("c").status is Status.RUNNING  # type: ignore[union-attr]


def test_result_is_none_for_a_job_not_succeeded(store: Store) -> None:
    claimed(store, "running")
    claimed(store, "failed")
    store.fail("failed", A, "ValueError: bad")
    assert [store.result(ref) for ref in ("running", "failed", "id-failed", "unknown")] == [
        None
    ] * 4


def test_a_memory_store_forgets_the_output_with_the_finished_job() -> None:
    with MemoryStore(max_finished=1) as store:
        for key in ("old", "new"):
            claimed(store, key)
            store.succeed(key, A, output=Output(json_text(key)))
        assert (store.get("old"), store.output("old")) == (None, None)
        assert store.result("new") == "new"


@durable_only
def test_outputs_live_in_their_own_table(kit: Kit) -> None:
    assert kit.sql is not None
    follow_up = child("f")
    claimed(kit.store, "r")
    kit.store.succeed("r", A, now=at(1), output=Output(json_text({"é": 1})))
    claimed(kit.store, "f")
    kit.store.succeed("f", A, now=at(1), output=Output(None, (follow_up,)))
    rows = kit.sql(
        "SELECT idempotency_key, result, result_bytes, follow_ups IS NULL, sent_at"
        " FROM broker_jobs_outputs ORDER BY idempotency_key"
    )
    assert [tuple(row) for row in rows] == [
        ("f", None, None, False, None),
        ("r", '{"é":1}', 8, True, None),  # UTF-8 bytes
    ]
    with kit.reopen() as other:  # another process's view
        kept = other.output("f")
        assert kept is not None
        assert kept.follow_ups == (follow_up,)


def test_sqlite_keeps_outputs_in_the_store_threads_batch(tmp_path: Path) -> None:
    """Successes queued together commit in one transaction, outputs included; a lost
    lease among them writes nothing and leaves the others intact."""
    with SQLiteStore(tmp_path / "jobs.db") as store:
        for key in ("a", "b", "c"):
            claimed(store, key)

        async def succeed_together() -> list[Any]:
            return await asyncio.gather(
                store.call("succeed", "a", A, output=Output(json_text("a"))),
                store.call("succeed_many_keeping", [("b", A, Output(json_text("b")))]),
                store.call("succeed", "c", B, output=Output(json_text("c"))),
                return_exceptions=True,
            )

        results = asyncio.run(succeed_together())
        assert results[:2] == [None, []]
        assert isinstance(results[2], LeaseLostError)
        assert [store.result(key) for key in ("a", "b")] == ["a", "b"]
        assert store.output("c") is None


def test_sqlite_keeps_successes_with_outputs_all_or_none(tmp_path: Path) -> None:
    """Several successes with outputs are one transaction: one that fails to write
    (a full disk, here a trigger) leaves none recorded, so the call held and tried
    again finds every key still running under its holder, none "lost"."""
    with SQLiteStore(tmp_path / "jobs.db") as store:
        for key in ("a", "b", "c"):
            claimed(store, key)
        failing = (
            "CREATE TRIGGER full_disk BEFORE UPDATE ON broker_jobs_records"
            " WHEN NEW.idempotency_key = 'c' BEGIN SELECT RAISE(FAIL, 'disk is full'); END"
        )
        db = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
        db.execute(failing)
        finished = [(key, A, Output(json_text(key))) for key in ("a", "b", "c")]
        with pytest.raises(StoreError):
            store.succeed_many_keeping(finished)
        assert [store.get(key).status for key in ("a", "b", "c")] == [Status.RUNNING] * 3  # type: ignore[union-attr]
        assert store.output("a") is None

        db.execute("DROP TRIGGER full_disk")
        db.close()
        assert store.succeed_many_keeping(finished) == []
        assert [store.result(key) for key in ("a", "b", "c")] == ["a", "b", "c"]


# --- the table in an older layout ------------------------------------------------------------


def test_an_sqlite_file_without_the_outputs_table_gets_it_on_open(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with SQLiteStore(path):
        pass
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("DROP TABLE broker_jobs_outputs")  # as a file of an older broker-jobs has it
    finally:
        db.close()
    with SQLiteStore(path) as store:
        claimed(store)
        store.succeed("key-1", A, output=Output(json_text("kept")))
        assert store.result("key-1") == "kept"
    db = sqlite3.connect(path)
    try:  # an addition without a version: older code keeps sharing the file
        assert db.execute("SELECT version FROM broker_jobs_schema").fetchall() == [
            (sqlite_module.SCHEMA_VERSION,)
        ]
    finally:
        db.close()


def test_a_postgres_database_without_the_outputs_table_gets_it_on_open(
    postgres_dsn: str, pg_schema: str
) -> None:
    PostgresStore(postgres_dsn, schema=pg_schema).close()
    with _admin(postgres_dsn) as conn:  # as a database of an older broker-jobs has it
        conn.execute(f'DROP TABLE "{pg_schema}".broker_jobs_outputs')
    with PostgresStore(postgres_dsn, schema=pg_schema) as store:
        claimed(store)
        store.succeed("key-1", A, output=Output(json_text("kept")))
        assert store.result("key-1") == "kept"
    with _admin(postgres_dsn) as conn:
        row = conn.execute(f'SELECT max(version) FROM "{pg_schema}".broker_jobs_schema').fetchone()
    assert row == (postgres_module.SCHEMA_VERSION,)
