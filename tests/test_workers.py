"""Workers you can see: each worker process keeps a heartbeat record in the ledger
(broker_jobs.observe.heartbeat) with what it runs, says when it stops, and a ledger
that cannot take it costs nothing but a line; ``broker-jobs workers`` shows them."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker_jobs import App, JobRequest, Publisher, Worker, WorkerSettings, __version__
from broker_jobs.cli import main
from broker_jobs.clock import utc_now
from broker_jobs.observe.heartbeat import Heartbeat, process_record
from broker_jobs.store import MemoryStore, SQLiteStore
from broker_jobs.store.errors import StoreError
from broker_jobs.store.processes import ProcessKind, ProcessRecord, ProcessState, RunningJob
from tests.support import Broker, wait_until
from tests.test_worker import Add


def test_a_running_worker_shows_its_jobs_in_its_heartbeat_and_says_when_it_stopped(
    broker: Broker, make_app: Callable[[], App]
) -> None:
    app = make_app()
    started = threading.Event()
    release = threading.Event()

    @app.task("slow.job")
    def slow(payload: Add) -> None:
        started.set()
        release.wait(timeout=30)

    with Publisher(broker.url, app) as publisher:
        [job] = publisher.publish_many([JobRequest("slow.job", {"key": "k1"})])
    store = MemoryStore()
    settings = WorkerSettings(concurrency=3, heartbeat_every=0.05, worker_id="w-seen")
    worker = Worker(broker.url, app, store, settings)

    def running_beat() -> ProcessRecord | None:
        beats = store.processes(app.namespace)
        return beats[0] if beats and beats[0].running else None

    async def scenario() -> tuple[ProcessRecord, ProcessRecord]:
        run = asyncio.create_task(worker.run())
        await asyncio.to_thread(started.wait, 30)
        beat = await asyncio.to_thread(
            wait_until, running_beat, within=30, what="a heartbeat with the running job"
        )
        worker.stop()
        release.set()
        await run
        [last] = store.processes(app.namespace)
        return beat, last

    beat, last = asyncio.run(scenario())
    assert (beat.id, beat.kind, beat.state) == ("w-seen", ProcessKind.WORKER, ProcessState.RUNNING)
    assert (beat.host, beat.pid, beat.version) == (socket.gethostname(), os.getpid(), __version__)
    assert (beat.tasks, beat.concurrency, beat.processes, beat.in_flight) == (
        ("slow.job",), 3, 1, 1
    )  # fmt: skip
    [running] = beat.running
    assert (running.job_id, running.task, running.key, running.attempt) == (
        job.id, "slow.job", job.idempotency_key, 1
    )  # fmt: skip
    assert beat.started_at <= running.started_at <= beat.seen_at
    assert (last.state, last.in_flight, last.running) == (ProcessState.STOPPED, 0, ())
    assert last.seen_at >= beat.seen_at


class RefusingStore(MemoryStore):
    """A ledger that refuses heartbeats while ``refuse`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = True

    def record_process(self, record: ProcessRecord) -> None:
        if self.refuse:
            raise StoreError("database is locked: free some disk space")
        super().record_process(record)


def test_a_ledger_that_refuses_heartbeats_is_said_once_and_again_when_it_takes_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RefusingStore()
    heartbeat = Heartbeat(store, process_record(ProcessKind.WORKER, "w1", "jobs"))

    async def beats() -> list[bool]:
        taken = [await heartbeat.beat() for _ in range(3)]
        store.refuse = False
        return [*taken, await heartbeat.beat(), await heartbeat.beat()]

    with caplog.at_level(logging.INFO, logger="broker_jobs.observe.heartbeat"):
        assert asyncio.run(beats()) == [False, False, False, True, True]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "worker w1: its heartbeat is not recorded (database is locked: free some disk"
        " space); `broker-jobs workers` shows it as lost until it is",
        "worker w1: its heartbeat is recorded again",
    ]
    assert [p.id for p in store.processes("jobs")] == ["w1"]


def test_a_ledger_that_hangs_does_not_hold_up_the_last_heartbeat() -> None:
    hang = threading.Event()

    class HangingStore(MemoryStore):
        def record_process(self, record: ProcessRecord) -> None:
            hang.wait(30)

    heartbeat = Heartbeat(HangingStore(), process_record(ProcessKind.BEAT, "b1", "jobs"))

    async def stop() -> None:
        try:
            await asyncio.wait_for(heartbeat.stopped(within=0.05), 10)
        finally:
            hang.set()  # before asyncio.run's end waits for the store's thread

    asyncio.run(stop())
    assert heartbeat.record.state is ProcessState.STOPPED


def test_the_workers_command_lists_the_live_the_lost_and_the_stopped(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    now = utc_now()
    alive = replace(
        process_record(
            ProcessKind.WORKER, "host-a:1:aaa", "jobs", tasks=["mail.send"], concurrency=8
        ),
        in_flight=2,
    )
    lost = replace(alive, id="host-b:2:bbb", host="host-b", seen_at=now - timedelta(minutes=5))
    stopped = replace(alive, id="host-c:3:ccc", state=ProcessState.STOPPED)
    replaced = replace(
        stopped,
        id="host-d:4:ddd",
        ended="exit 70: handler threads stuck past their time limit (j-1: " + "x" * 200,
    )
    beat = replace(process_record(ProcessKind.BEAT, "beat-1", "jobs"), role="leading")
    elsewhere = replace(alive, id="billing-1", namespace="billing")
    with SQLiteStore(path) as store:
        for record in (alive, lost, stopped, replaced, beat, elsewhere):
            store.record_process(record)
    runner = CliRunner()
    store_url = f"sqlite:///{path}"

    listed = runner.invoke(main, ["workers", "--namespace", "jobs", "--store", store_url, "--json"])
    assert listed.exit_code == 0, listed.output
    document = json.loads(listed.output)
    assert [(p["id"], p["state"]) for p in document["processes"]] == [
        ("beat-1", "alive"),
        ("host-a:1:aaa", "alive"),
        ("host-b:2:bbb", "lost"),
        ("host-c:3:ccc", "stopped"),
        ("host-d:4:ddd", "stopped"),
    ]
    assert [p["ended"] for p in document["processes"]][-2:] == [None, replaced.ended]
    assert document["counts"] == {
        "beat": {"alive": 1},
        "worker": {"alive": 1, "lost": 1, "stopped": 2},
    }
    assert document["processes"][1]["in_flight"] == 2

    shown = runner.invoke(main, ["workers", "--store", store_url])
    assert shown.exit_code == 0, shown.output
    assert "every namespace" in shown.output
    assert "billing-1" in shown.output
    assert "lost (5m00s)" in shown.output or "lost (4m59s)" in shown.output
    assert "beat (leading)" in shown.output
    assert "1 beat alive, 2 workers alive, 1 worker lost, 2 workers stopped" in shown.output
    # The exit code in the table, whose other columns the message had crowded out.
    assert "stopped (exit 70)" in shown.output
    assert "host-d:4:ddd" in shown.output
    assert "x" * 50 not in shown.output

    picked = runner.invoke(
        main, ["workers", "--namespace", "jobs", "--task", "image.resize", "--store", store_url]
    )
    assert picked.exit_code == 0, picked.output
    assert "host-a:1:aaa" not in picked.output
    assert "beat-1" in picked.output

    # A lost worker reads no request: not asked, said at once, exit 1.
    stop = runner.invoke(
        main,
        ["workers", "stop", "host-b:2:bbb", "--namespace", "jobs", "--store", store_url,
         "--wait", "30", "--json"],
    )  # fmt: skip
    assert stop.exit_code == 1, stop.output
    assert json.loads(stop.stdout)["lost"] == ["host-b:2:bbb"]
    assert json.loads(stop.stdout)["asked"] == []
    with SQLiteStore(path) as store:
        assert store.stop_requests("jobs") == {}
    said = runner.invoke(
        main, ["workers", "stop", "host-b:2:bbb", "--namespace", "jobs", "--store", store_url]
    )
    assert said.exit_code == 1
    assert "host-b:2:bbb is lost (no heartbeat for" in said.stderr


def test_a_worker_that_holds_its_deliveries_says_why(tmp_path: Path) -> None:
    """A worker holding its deliveries (the broker confirms none of its publishes, a
    handler stuck) says why in its heartbeat: the table marks it, a line under it
    gives the reason (escaped: it comes from the ledger), --json has it; a lost
    worker's last reason is not shown as current."""
    path = tmp_path / "jobs.db"
    reason = "the broker has confirmed none of this worker's publishes for 12 s\x1b[31m"
    held = replace(
        process_record(ProcessKind.WORKER, "host-a:1:aaa", "jobs", tasks=["mail.send"]),
        held=reason,
    )
    gone = replace(held, id="host-b:2:bbb", seen_at=utc_now() - timedelta(minutes=10))
    with SQLiteStore(path) as store:
        store.record_process(held)
        store.record_process(gone)
    store_url = f"sqlite:///{path}"
    runner = CliRunner()
    shown = runner.invoke(main, ["workers", "--namespace", "jobs", "--store", store_url])
    assert shown.exit_code == 0, shown.output
    assert "alive (held)" in shown.output
    assert "host-a:1:aaa holds its deliveries: the broker has confirmed none" in shown.output
    assert "\x1b" not in shown.output
    assert "host-b:2:bbb holds" not in shown.output
    listed = runner.invoke(main, ["workers", "--namespace", "jobs", "--store", store_url, "--json"])
    helds = {p["id"]: p["held"] for p in json.loads(listed.output)["processes"]}
    assert helds == {"host-a:1:aaa": reason, "host-b:2:bbb": None}


def test_a_lost_process_shows_no_running_jobs_and_no_role_it_still_has(tmp_path: Path) -> None:
    """A lost process's last heartbeat names jobs that ended or were taken over since,
    and a role another process has now (each killed beat leader read "beat
    (leading)" beside the real one; `--running` listed a dead worker's jobs for
    minutes after they succeeded elsewhere). The dashboard showed only the live
    workers' jobs already; now both say "was leading" of a process no longer there."""
    path = tmp_path / "jobs.db"
    now = utc_now()
    worker = process_record(ProcessKind.WORKER, "host-a:1:aaa", "jobs", tasks=["mail.send"])
    live = replace(worker, running=(RunningJob("j-live", "mail.send", "live-key", 1, now),))
    dead = replace(
        worker,
        id="host-b:2:bbb",
        seen_at=now - timedelta(minutes=10),
        running=(RunningJob("j-gone", "mail.send", "gone-key", 1, now - timedelta(minutes=10)),),
    )
    leader = replace(process_record(ProcessKind.BEAT, "beat-2", "jobs"), role="leading")
    killed_leader = replace(leader, id="beat-1", seen_at=now - timedelta(minutes=10))
    with SQLiteStore(path) as store:
        for record in (live, dead, leader, killed_leader):
            store.record_process(record)
    shown = CliRunner().invoke(
        main, ["workers", "--namespace", "jobs", "--store", f"sqlite:///{path}", "--running"]
    )
    assert shown.exit_code == 0, shown.output
    assert "live-key" in shown.output
    assert "gone-key" not in shown.output
    assert shown.output.count("beat (leading)") == 1
    assert "beat (was leading)" in shown.output


def test_the_workers_command_says_what_to_do_without_heartbeats_or_a_ledger(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    empty = tmp_path / "empty.db"
    SQLiteStore(empty).close()
    shown = runner.invoke(main, ["workers", "--store", f"sqlite:///{empty}"])
    assert shown.exit_code == 0, shown.output
    assert "no heartbeats in this ledger" in shown.output

    missing = runner.invoke(main, ["workers", "--store", f"sqlite:///{tmp_path / 'none.db'}"])
    assert missing.exit_code == 1
    assert missing.output.startswith("error: ")

    orphan = runner.invoke(main, ["workers", "--task", "mail.send", "--store", "memory://"])
    assert orphan.exit_code == 2
    assert "--task needs --app or --namespace" in orphan.output
