"""The ledger's verdict on a delivery at its quorum queue's delivery limit
(broker_jobs/worker/delivery_limit.py): a crash loop is dead-lettered, a job whose
workers died while it only waited is rescued. No broker: the decision is pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker_jobs.store.base import JobRecord, Status
from broker_jobs.worker.dead_letters import DeathCause
from broker_jobs.worker.delivery_limit import LEASE_MARGIN, Rescue, judge_last_delivery

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
LIMIT = 10


def record(
    status: Status, *, worker: str | None = "w#1", lease_s: float | None = None
) -> JobRecord:
    return JobRecord(
        idempotency_key="k",
        job_id="j",
        task="t",
        status=status,
        attempts=1,
        created_at=NOW - timedelta(minutes=5),
        updated_at=NOW - timedelta(minutes=1),
        worker=worker,
        lease_until=None if lease_s is None else NOW + timedelta(seconds=lease_s),
        last_error=None,
        due_at=None,
    )


def judge(found: JobRecord | None, crashes_before: int = 0) -> DeathCause | Rescue | None:
    return judge_last_delivery(
        count=LIMIT, limit=LIMIT, attempt=1, record=found, crashes_before=crashes_before, now=NOW
    )


@pytest.mark.parametrize("status", [Status.SUCCEEDED, Status.FAILED, Status.DEAD, Status.CANCELLED])
def test_a_finished_job_is_left_to_the_claim_which_acks_it(status: Status) -> None:
    assert judge(record(status)) is None


@pytest.mark.parametrize(
    "found",
    [
        None,  # its workers died before they claimed it
        record(Status.QUEUED, worker=None),
        record(Status.RETRYING),
        record(Status.RUNNING, worker=None),  # given back on a graceful stop
    ],
)
def test_a_job_that_was_not_running_when_its_workers_died_is_rescued_at_once(
    found: JobRecord | None,
) -> None:
    assert judge(found) == Rescue(None, "it was not running when its workers died", LIMIT)


def test_a_job_whose_runs_killed_as_many_workers_as_the_limit_is_a_crash_loop() -> None:
    verdict = judge(record(Status.RUNNING, lease_s=-1), crashes_before=LIMIT - 1)
    assert isinstance(verdict, DeathCause)
    assert verdict.reason == "crash-loop"
    assert f"{LIMIT} runs ended by their worker's death" in verdict.error
    assert "last holder w#1" in verdict.error


def test_a_job_with_fewer_crashes_than_the_limit_under_a_lapsed_lease_is_rescued_at_once() -> None:
    verdict = judge(record(Status.RUNNING, lease_s=-1), crashes_before=LIMIT - 2)
    assert isinstance(verdict, Rescue)
    assert verdict.delay is None


def test_a_job_waiting_for_a_live_lease_is_rescued_due_when_the_lease_lapses() -> None:
    verdict = judge(record(Status.RUNNING, lease_s=42))
    assert verdict == Rescue(42 + LEASE_MARGIN, "it waits for the lease of w#1", LIMIT)


def test_a_live_lease_whose_lapse_would_be_the_last_crash_allowed_is_waited_for_here() -> None:
    # Re-judged at each re-check: once the lease lapses, the job is a crash loop.
    assert judge(record(Status.RUNNING, lease_s=42), crashes_before=LIMIT - 1) is None
