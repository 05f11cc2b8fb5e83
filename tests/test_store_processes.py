"""The daemons' heartbeat records (broker_jobs.store.processes) and the paused tasks
(broker_jobs.store.controls) on every store. Heartbeats: one
per process id, the last write wins, listed by namespace with the most recently
seen first, forgotten by age, seen by a second store on the same data; and what a
reader makes of them (broker_jobs.ops.processes: alive, stopping, stopped, lost)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from broker_jobs.ops.processes import process_views
from broker_jobs.store import Store
from broker_jobs.store.errors import StoreError
from broker_jobs.store.processes import (
    Liveness,
    ProcessKind,
    ProcessRecord,
    ProcessState,
    RunningJob,
    liveness,
    lost_after,
    process_document,
    process_of,
)
from tests.test_store import Kit

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def record(
    id: str, *, seconds: float = 0, namespace: str = "jobs", **changes: object
) -> ProcessRecord:
    base = ProcessRecord(
        id=id,
        kind=ProcessKind.WORKER,
        namespace=namespace,
        host="host-a",
        pid=4242,
        version="0.1.0",
        started_at=T0,
        seen_at=T0 + timedelta(seconds=seconds),
        every=5.0,
        tasks=("mail.send",),
        concurrency=8,
        processes=2,
        in_flight=1,
        running=(RunningJob("job-1", "mail.send", "key-1", 2, T0),),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_record_is_kept_whole_and_the_last_write_wins(store: Store) -> None:
    first = record("w1")
    store.record_process(first)
    assert store.processes("jobs") == [first]

    later = replace(first, seen_at=T0 + timedelta(seconds=5), in_flight=0, running=())
    store.record_process(later)
    assert store.processes("jobs") == [later]


def test_records_list_by_namespace_the_most_recently_seen_first(store: Store) -> None:
    store.record_process(record("w1", seconds=0))
    store.record_process(record("w2", seconds=10))
    store.record_process(record("b1", seconds=5, kind=ProcessKind.BEAT, role="leading"))
    store.record_process(record("other", seconds=20, namespace="billing"))

    assert [p.id for p in store.processes("jobs")] == ["w2", "b1", "w1"]
    assert [p.id for p in store.processes()] == ["other", "w2", "b1", "w1"]
    assert store.processes("nobody") == []


def test_old_records_are_forgotten_by_their_last_heartbeat(store: Store) -> None:
    store.record_process(record("old", seconds=0))
    store.record_process(record("new", seconds=100))

    assert store.forget_processes(T0 + timedelta(seconds=50)) == 1
    assert [p.id for p in store.processes()] == ["new"]
    assert store.forget_processes(T0) == 0


def test_a_second_store_on_the_same_data_reads_the_heartbeats(kit: Kit) -> None:
    kit.store.record_process(record("w1"))
    assert [p.id for p in kit.reopen().processes("jobs")] == ["w1"]


def test_a_document_of_a_newer_version_reads_and_a_broken_one_is_a_store_error() -> None:
    text = process_document(record("w1"))
    newer = text[:-1] + ',"controls":{"x":1}}'  # a field this version does not know
    assert process_of(newer) == record("w1")
    with pytest.raises(StoreError, match="heartbeat record"):
        process_of('{"id": "w1"}')


@pytest.mark.parametrize(
    ("state", "silent", "expected"),
    [
        (ProcessState.RUNNING, 14.0, Liveness.ALIVE),  # under 3 beats of 5 s: 15 s
        (ProcessState.RUNNING, 16.0, Liveness.LOST),
        (ProcessState.STOPPING, 1.0, Liveness.STOPPING),
        (ProcessState.STOPPING, 60.0, Liveness.LOST),  # killed while stopping
        (ProcessState.STOPPED, 3600.0, Liveness.STOPPED),  # said so: never lost
    ],
)
def test_a_process_is_lost_after_three_silent_heartbeats(
    state: ProcessState, silent: float, expected: Liveness
) -> None:
    beat = record("w1", state=state)
    assert liveness(beat, T0 + timedelta(seconds=silent)) is expected


def test_the_threshold_is_at_least_fifteen_seconds_and_the_operator_may_set_it() -> None:
    assert lost_after(record("w1", every=0.2)) == 15.0
    assert lost_after(record("w1", every=60.0)) == 180.0
    assert liveness(record("w1"), T0 + timedelta(seconds=3), override=2.0) is Liveness.LOST


def test_views_put_the_live_first_and_filter_workers_by_task(store: Store) -> None:
    store.record_process(record("lost", seconds=-100))
    store.record_process(record("alive"))
    store.record_process(record("other-task", tasks=("image.resize",)))
    store.record_process(record("beat", kind=ProcessKind.BEAT, tasks=()))
    store.record_process(record("gone", state=ProcessState.STOPPED))

    views = process_views(store, "jobs", now=T0 + timedelta(seconds=1))
    assert [(v.record.id, v.liveness) for v in views] == [
        ("beat", Liveness.ALIVE),
        ("alive", Liveness.ALIVE),
        ("other-task", Liveness.ALIVE),
        ("lost", Liveness.LOST),
        ("gone", Liveness.STOPPED),
    ]
    picked = process_views(store, "jobs", tasks=["mail.send"], now=T0)
    assert [v.record.id for v in picked] == ["beat", "alive", "lost", "gone"]
    assert views[3].document()["silent_s"] == 101.0


# --- paused tasks -------------------------------------------------------------------------


def test_a_pause_holds_until_resumed_and_a_second_pause_keeps_the_first(kit: Kit) -> None:
    store = kit.store
    first = store.pause("jobs", "mail.send", "ops@host-a", now=T0)
    assert (first.task, first.since, first.by) == ("mail.send", T0, "ops@host-a")
    again = store.pause("jobs", "mail.send", "someone-else", now=T0 + timedelta(minutes=5))
    assert again == first
    store.pause("billing", "mail.send", "ops", now=T0)  # another namespace's own
    assert list(store.pauses("jobs")) == ["mail.send"]
    assert kit.reopen().pauses("jobs") == {"mail.send": first}  # every worker reads it

    assert store.resume("jobs", "mail.send") is True
    assert store.resume("jobs", "mail.send") is False
    assert store.pauses("jobs") == {}
    assert list(store.pauses("billing")) == ["mail.send"]


def test_a_stop_request_holds_until_cleared_and_a_second_keeps_the_first(kit: Kit) -> None:
    store = kit.store
    first = store.request_stop("jobs", "w1", "ops@host-a", now=T0)
    assert (first.worker_id, first.at, first.by) == ("w1", T0, "ops@host-a")
    assert store.request_stop("jobs", "w1", "again", now=T0 + timedelta(seconds=9)) == first
    store.request_stop("billing", "b1", "ops", now=T0)
    assert kit.reopen().stop_requests("jobs") == {"w1": first}
    assert store.clear_stop("w1") is True
    assert store.clear_stop("w1") is False
    assert store.stop_requests("jobs") == {}
    assert list(store.stop_requests("billing")) == ["b1"]
