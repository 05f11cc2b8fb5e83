"""What a success keeps beside its record (docs/store.md, "Results and follow-ups"):
the handler's result and the follow-up jobs, written in the same atomic step as the
success, capped in size, marked sent, pruned with the
record; on every store, with fixed clocks. And reading them: ``result``, ``wait``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from broker_jobs import Job
from broker_jobs.store import SQLiteStore, Status, Store
from broker_jobs.store.base import MAX_PAYLOAD_BYTES, LeaseLostError, Output, json_text
from tests.test_store import LEASE, A, B, at

RESULTS: list[Any] = [{"n": 1, "text": "é\x00<b>"}, [1, 2.5, None], "done", 42, True]


def claimed(store: Store, key: str = "key-1", worker: str = A) -> Job:
    job = Job(id=f"id-{key}", task="notes.write", idempotency_key=key)
    store.claim(job, worker, LEASE, now=at(0))
    return job


def child(key: str) -> Job:
    return Job(task="notes.next", payload={"from": key}, idempotency_key=f"{key}>1")


@pytest.mark.parametrize("value", RESULTS, ids=["dict", "list", "str", "int", "bool"])
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
    store.mark_follow_ups_sent("key-1", now=at(2))
    sent = store.output("key-1")
    assert sent is not None
    assert (sent.sent_at, sent.follow_ups_pending) == (at(2), False)
    store.mark_follow_ups_sent("never-seen")  # nothing to mark: nothing happens


def test_no_output_keeps_nothing_and_a_lost_lease_writes_nothing(store: Store) -> None:
    claimed(store, "plain")
    store.succeed("plain", A)
    assert store.output("plain") is None
    assert store.result("plain") is None

    claimed(store, "taken")
    with pytest.raises(LeaseLostError):
        store.succeed("taken", B, output=Output(json_text({"a": 1})))
    assert store.output("taken") is None
    assert store.get("taken").status is Status.RUNNING  # type: ignore[union-attr]


def test_succeed_with_keeps_the_effects_output_in_its_transaction(store: Store) -> None:
    claimed(store, "tx")
    store.succeed_with("tx", A, lambda db: Output(json_text({"wrote": 1})))
    assert store.result("tx") == {"wrote": 1}

    claimed(store, "failing")

    def fail(db: object) -> Output:
        raise RuntimeError("the handler failed")

    with pytest.raises(RuntimeError):
        store.succeed_with("failing", A, fail)
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
    with pytest.raises(TimeoutError, match=r"\(no record\)"):
        store.wait("never-seen", timeout=0.01, poll=0.01)
    store.succeed("running", A)
    assert store.wait("id-running", timeout=5).status is Status.SUCCEEDED


def test_an_sqlite_file_without_the_outputs_table_gets_it_on_open(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with SQLiteStore(path):
        pass
    with sqlite3.connect(path) as db:  # as a file of an older broker-jobs has it
        db.execute("DROP TABLE broker_jobs_outputs")
    with SQLiteStore(path) as store:
        claimed(store)
        store.succeed("key-1", A, output=Output(json_text("kept")))
        assert store.result("key-1") == "kept"
