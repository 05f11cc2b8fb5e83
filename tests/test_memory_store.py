"""The memory store keeps a bounded number of finished jobs, so a long-running worker
with it does not grow without end; unfinished jobs are never dropped."""

from __future__ import annotations

import pytest

from broker_jobs.envelope import Job
from broker_jobs.store.base import ClaimOutcome, Status, StoreError
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.urls import open_store


def _run(store: MemoryStore, count: int, *, finish: bool = True) -> list[Job]:
    jobs = [Job(task="bench.noop", payload={"n": n}) for n in range(count)]
    store.claim_many([(job, "w1") for job in jobs], 60)
    if finish:
        store.succeed_many([(job.idempotency_key, "w1") for job in jobs])
    return jobs


def test_the_oldest_finished_jobs_go_first_beyond_the_bound() -> None:
    store = MemoryStore(max_finished=10)
    running = _run(store, 3, finish=False)
    finished = _run(store, 25)
    assert store.get(finished[0].idempotency_key) is None  # dropped, with its history
    assert store.executions(finished[0].idempotency_key) == []
    kept = [job for job in finished if store.get(job.idempotency_key) is not None]
    assert kept == finished[-10:]
    assert all(store.get(job.idempotency_key).status is Status.RUNNING for job in running)  # type: ignore[union-attr]
    assert store.counts()[Status.SUCCEEDED] == 10
    # A dropped key is unknown again: delivered once more, it runs (as after prune).
    again = store.claim(finished[0], "w2", 60)
    assert again.outcome is ClaimOutcome.CLAIMED


def test_a_replayed_job_is_unfinished_again_and_never_dropped() -> None:
    store = MemoryStore(max_finished=2)
    (failed,) = _run(store, 1, finish=False)
    store.fail(failed.idempotency_key, "w1", "boom")
    assert store.reset_for_replay(failed.idempotency_key) is not None  # queued again
    _run(store, 3)
    assert store.get(failed.idempotency_key).status is Status.QUEUED  # type: ignore[union-attr]
    assert store.counts()[Status.SUCCEEDED] == 2


def test_the_url_sets_the_bound_and_refuses_nonsense() -> None:
    with open_store("memory://?max_finished=5") as store:
        assert isinstance(store, MemoryStore)
        assert store.max_finished == 5
    for url in ("memory://?max_finished=0", "memory://?max_finished=x", "memory://?size=3"):
        with pytest.raises(StoreError, match="max_finished"):
            open_store(url)
    with pytest.raises(StoreError, match="whole number"):
        MemoryStore(max_finished=0)
