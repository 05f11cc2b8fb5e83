"""Workers you can steer: ``broker-jobs pause TASK`` stops every worker from starting
the task's jobs (running ones finish, those in hand go back to the queue), a worker
started meanwhile starts paused, ``resume`` consumes again; the pause is a row in the
ledger, followed by each worker and said in its heartbeat."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
from click.testing import CliRunner

from broker_jobs import App, JobRequest, Publisher, Worker, WorkerSettings
from broker_jobs.cli import main
from broker_jobs.store import SQLiteStore, Status
from tests.support import Broker, wait_until
from tests.test_worker import Add
from topology.priority import Priority

TASK = "slow.job"


def depth(connection: pika.BlockingConnection, queue: str) -> tuple[int, int]:
    """The queue's ready messages and consumers."""
    channel = connection.channel()
    try:
        method = channel.queue_declare(queue, passive=True).method
        return method.message_count, method.consumer_count
    finally:
        channel.close()


@contextmanager
def running(worker: Worker) -> Iterator[list[Counter[str]]]:
    """``worker`` running on a thread of its own; stopped (and joined) afterwards."""
    outcome: list[Counter[str]] = []
    thread = threading.Thread(target=lambda: outcome.append(asyncio.run(worker.run())))
    thread.start()
    try:
        yield outcome
    finally:
        worker.stop()
        thread.join(60)


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_a_pause_lets_the_running_job_finish_starts_no_other_and_resume_runs_them(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    tmp_path: Path,
) -> None:
    app = make_app()
    started: list[str] = []
    first_started, release = threading.Event(), threading.Event()

    @app.task(TASK)
    def slow(payload: Add) -> None:
        started.append(payload.key)
        first_started.set()
        release.wait(60)

    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest(TASK, {"key": f"k{n}"}) for n in range(5)])
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path)
    url = f"sqlite:///{path}"
    settings = WorkerSettings(concurrency=1, heartbeat_every=0.1, worker_id="w-paused")
    worker = Worker(broker.url, app, store, settings)
    queue = app.names.task_queue(TASK)
    with running(worker):
        assert first_started.wait(30)
        code, output = cli(
            "pause", TASK, "--namespace", app.namespace, "--store", url, "--wait", "30"
        )
        assert code == 0, output
        assert f"paused {TASK} in namespace" in output
        release.set()  # the running job finishes...
        wait_until(
            lambda: store.counts().get(Status.SUCCEEDED) == 1 or None, within=30, what="its success"
        )
        # ...and the four it held go back to the queue, none started.
        wait_until(
            lambda: depth(connection, queue) == (4, 0) or None,
            within=30,
            what="4 back, no consumer",
        )
        [beat] = store.processes(app.namespace)
        assert beat.paused == (TASK,)
        wait_until(
            lambda: store.processes(app.namespace)[0].in_flight == 0 or None,
            within=30,
            what="none in hand",
        )
        assert started == ["k0"]
        code, shown = cli(
            "status", "--url", broker.url, "--namespace", app.namespace, "--task", TASK,
            "--store", url,
        )  # fmt: skip
        assert code == 0, shown
        assert f"{TASK} (paused)" in shown
        assert f"paused: {TASK} since" in shown
        listed = json.loads(
            cli("workers", "--namespace", app.namespace, "--store", url, "--json")[1]
        )
        assert listed["processes"][0]["paused"] == [TASK]

        code, output = cli(
            "resume", TASK, "--namespace", app.namespace, "--store", url, "--wait", "30"
        )
        assert code == 0, output
        wait_until(
            lambda: store.counts().get(Status.SUCCEEDED) == 5 or None,
            within=60,
            what="all five run",
        )
    assert sorted(started) == [f"k{n}" for n in range(5)]
    assert store.pauses(app.namespace) == {}
    store.close()


def test_a_worker_started_while_its_task_is_paused_starts_paused(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    tmp_path: Path,
) -> None:
    app = make_app()
    ran: list[str] = []

    @app.task(TASK)
    def quick(payload: Add) -> None:
        ran.append(payload.key)

    @app.task("other.job")
    def other(payload: Add) -> None:
        ran.append(payload.key)

    store = SQLiteStore(tmp_path / "ledger.db")
    store.pause(app.namespace, TASK, "ops@test")
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest(TASK, {"key": f"k{n}"}) for n in range(3)])
        publisher.publish("other.job", {"key": "other"})
    settings = WorkerSettings(concurrency=2, heartbeat_every=0.1)
    with running(Worker(broker.url, app, store, settings)):
        # The other task runs: the worker consumes, but not the paused one.
        wait_until(lambda: ran == ["other"] or None, within=30, what="the other task's job")
        beat = wait_until(
            lambda: next(iter(store.processes(app.namespace)), None), within=30, what="a heartbeat"
        )
        assert beat.paused == (TASK,)
        assert depth(connection, app.names.task_queue(TASK)) == (3, 0)
        assert depth(connection, app.names.task_queue("other.job"))[1] == 1
        store.resume(app.namespace, TASK)
        wait_until(lambda: len(ran) == 4 or None, within=30, what="the paused jobs after resume")
    assert sorted(ran) == ["k0", "k1", "k2", "other"]
    store.close()


def test_pause_names_only_tasks_it_knows_and_says_when_nothing_was_paused(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    SQLiteStore(tmp_path / "ledger.db").close()
    code, output = cli("pause", "Bad Name!", "--namespace", "jobs", "--store", url)
    assert code == 2
    assert "TASK" in output or "task" in output
    code, output = cli("pause", "mail.send", "--store", url)
    assert code == 2
    assert "--namespace" in output
    code, output = cli("resume", "mail.send", "--namespace", "jobs", "--store", url)
    assert code == 0
    assert "was not paused: nothing to do" in output
    code, output = cli("pause", "mail.send", "--namespace", "jobs", "--store", url, "--json")
    assert code == 0, output
    document = json.loads(output)
    assert [p["task"] for p in document["paused"]] == ["mail.send"]
    assert document["not_following"] == []


def test_workers_stop_asks_a_worker_through_the_ledger_and_it_stops_gracefully(
    broker: Broker, make_app: Callable[[], App], tmp_path: Path
) -> None:
    app = make_app()
    started, release = threading.Event(), threading.Event()

    @app.task(TASK)
    def slow(payload: Add) -> None:
        started.set()
        release.wait(60)

    with Publisher(broker.url, app) as publisher:
        publisher.publish(TASK, {"key": "k1"})
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path)
    url = f"sqlite:///{path}"
    settings = WorkerSettings(heartbeat_every=0.1, worker_id="w-stop", grace=30)
    worker = Worker(broker.url, app, store, settings)
    with running(worker) as outcome:
        assert started.wait(30)
        code, output = cli(
            "workers", "stop", "nobody", "--namespace", app.namespace, "--store", url
        )
        assert code == 2
        assert "no worker 'nobody'" in output
        code, output = cli(
            "workers", "stop", "w-stop", "--namespace", app.namespace, "--store", url
        )
        assert code == 0, output
        assert "asked w-stop to stop" in output
        wait_until(
            lambda: store.processes(app.namespace)[0].state.value == "stopping" or None,
            within=30,
            what="the worker stopping",
        )
        release.set()  # its running job finishes within the grace period
        code, output = cli(
            "workers", "stop", "w-stop", "--namespace", app.namespace, "--store", url,
            "--wait", "30", "--json",
        )  # fmt: skip
        assert code == 0, output
        document = json.loads(output)
        assert document["not_stopped"] == []
        # Stopping already: not asked again (a request written after it exited would
        # be left for its next start).
        assert document["asked"] == []
        assert document["already"] in ({"w-stop": "stopping"}, {"w-stop": "stopped"})
    assert outcome == [Counter({"succeeded": 1})]
    assert store.stop_requests(app.namespace) == {}  # done: deleted as it exited
    store.close()


def test_a_stop_request_older_than_the_worker_is_deleted_unheeded(
    broker: Broker, make_app: Callable[[], App], tmp_path: Path
) -> None:
    from datetime import timedelta  # noqa: PLC0415

    from broker_jobs.clock import utc_now  # noqa: PLC0415

    app = make_app()

    @app.task(TASK)
    def quick(payload: Add) -> None:
        pass

    store = SQLiteStore(tmp_path / "ledger.db")
    store.request_stop(app.namespace, "w-again", "ops", now=utc_now() - timedelta(minutes=5))
    with Publisher(broker.url, app) as publisher:
        publisher.publish(TASK, {"key": "k1"})
    settings = WorkerSettings(heartbeat_every=0.1, worker_id="w-again")
    with running(Worker(broker.url, app, store, settings)):
        wait_until(
            lambda: store.counts().get(Status.SUCCEEDED) == 1 or None, within=30, what="the job run"
        )
        wait_until(
            lambda: store.stop_requests(app.namespace) == {} or None, within=30, what="deleted"
        )
        assert store.processes(app.namespace)[0].state.value == "running"
    store.close()


def test_jobs_purge_counts_asks_then_deletes_the_queue_and_cancels_the_waiting(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    tmp_path: Path,
) -> None:
    app = make_app()

    @app.task(TASK)
    def never(payload: Add) -> None:
        raise AssertionError("a purged job ran")

    store = SQLiteStore(tmp_path / "ledger.db")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Publisher(broker.url, app, ledger=store) as publisher:
        publisher.publish_many([JobRequest(TASK, {"key": f"k{n}"}) for n in range(3)])
        later = publisher.publish(TASK, {"key": "later"}, delay=3600)
    wait_until(lambda: depth(connection, app.names.task_queue(TASK))[0] == 3 or None, within=30,
               what="three ready")  # fmt: skip
    base = [
        "jobs",
        "purge",
        TASK,
        "--url",
        broker.url,
        "--namespace",
        app.namespace,
        "--store",
        url,
    ]
    code, output = cli(*base)  # no terminal to ask on
    assert code == 1
    assert "add --yes" in output
    assert depth(connection, app.names.task_queue(TASK))[0] == 3  # nothing taken

    code, output = cli(*base, "--yes", "--json")
    assert code == 0, output
    assert json.loads(output) == {"task": TASK, "purged": 3, "cancelled": 4}
    assert depth(connection, app.names.task_queue(TASK))[0] == 0
    assert store.counts().get(Status.CANCELLED) == 4
    record = store.get(later.idempotency_key)
    assert record is not None
    assert record.status is Status.CANCELLED  # its message in the ladder is skipped when due
    store.close()


def test_jobs_purge_by_namespace_takes_every_lane_and_refuses_an_unknown_task(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    tmp_path: Path,
) -> None:
    """Without the app, the task's priority queues are found on the broker: a purge
    that took only the normal queue would leave high and low jobs to run."""
    app = make_app()
    app.declare(TASK, Add, priorities="strict")
    store_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    SQLiteStore(tmp_path / "ledger.db").close()
    with Publisher(broker.url, app) as publisher:
        for level in ("high", "normal", "low"):
            publisher.publish(TASK, {"key": level}, priority=level)
    queues = [app.names.task_queue(TASK, level) for level in Priority]
    wait_until(lambda: all(depth(connection, queue)[0] == 1 for queue in queues) or None,
               within=30, what="one job in each level's queue")  # fmt: skip
    base = ["jobs", "purge", "--url", broker.url, "--namespace", app.namespace]
    code, output = cli(*base, TASK, "--store", store_url, "--yes", "--json")
    assert code == 0, output
    assert json.loads(output) == {"task": TASK, "purged": 3, "cancelled": 0}
    assert [depth(connection, queue)[0] for queue in queues] == [0, 0, 0]

    code, output = cli(*base, "no.such", "--store", store_url, "--yes")
    assert code == 1
    assert f"no queue '{app.names.task_queue('no.such')}'" in output
    assert "Traceback" not in output
