"""``broker-jobs worker --processes N``: a supervisor and its worker processes, run as an
operator runs them (the CLI in a process of its own) against the session's broker.
Children are killed for real; nothing here sleeps to synchronise: the tests wait for
log lines, ledger rows and exits.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker_jobs import JobRequest, Publisher
from broker_jobs.cli import main
from broker_jobs.cli.worker import worker_command
from broker_jobs.ops.processes import process_views
from broker_jobs.store.urls import open_store
from broker_jobs.worker.supervisor import (
    CRASH_LOOP_EXITS,
    FIRST_BACKOFF,
    MAX_BACKOFF,
    STABLE_AFTER,
    Child,
    Verdict,
    judge_exit,
    parse_processes,
)
from tests.support import Broker, wait_until
from tests.test_worker import EffectsDatabase
from tests.test_worker_recovery import (
    StartWorker,
    WorkerProcess,
    declared_app,
    no_tracebacks,
    starting_worker_processes,
    write_app,
)
from topology import Topology

STARTED = re.compile(r"worker process (\d+) started \(pid (\d+)\)")


def child_pids(worker: WorkerProcess) -> list[tuple[int, int]]:
    """(index, pid) of every child start the supervisor logged, in order."""
    return [(int(index), int(pid)) for index, pid in STARTED.findall(worker.log)]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def kill_children(supervisor: WorkerProcess) -> None:
    """Kill the children ``supervisor`` started: each is in a process group of its
    own, so killing the supervisor leaves them running."""
    for _index, pid in child_pids(supervisor):
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def supervisors() -> Iterator[StartWorker]:
    """Start ``broker-jobs worker`` processes; killed afterwards, children included."""
    with starting_worker_processes(after_kill=kill_children) as start:
        yield start


# -- the rules, without processes ------------------------------------------------------------


def test_exit_rules() -> None:
    assert judge_exit(0, 0.5, stopping=False, burst=True) is Verdict.DONE  # --burst drained
    assert judge_exit(69, 100, stopping=False, burst=True) is Verdict.DONE  # its queue was deleted
    assert judge_exit(1, 2, stopping=False, burst=True) is Verdict.STOP_ALL  # configuration error
    assert judge_exit(1, 600, stopping=False, burst=True) is Verdict.RESTART  # a late crash
    assert (
        judge_exit(75, 600, stopping=False, burst=True) is Verdict.RESTART
    )  # no broker for a while
    assert judge_exit(137, 3, stopping=False, burst=True) is Verdict.RESTART  # kill -9, OOM killer
    assert judge_exit(137, 3, stopping=True, burst=True) is Verdict.DONE


def test_backoff_doubles_to_its_cap_and_a_stable_run_resets_it() -> None:
    child = Child(0)
    pauses = [child.next_backoff(ran_for=0.1) for _ in range(7)]
    assert pauses == [FIRST_BACKOFF, 2, 4, 8, 16, MAX_BACKOFF, MAX_BACKOFF]
    assert child.next_backoff(ran_for=STABLE_AFTER) == FIRST_BACKOFF


def test_a_crash_loop_is_so_many_exits_within_the_window() -> None:
    child = Child(0)
    loops = [child.in_crash_loop(now=float(n)) for n in range(CRASH_LOOP_EXITS)]
    assert loops == [False] * (CRASH_LOOP_EXITS - 1) + [True]
    assert not Child(0).in_crash_loop(now=0.0)


def test_processes_auto_is_one_per_cpu() -> None:
    assert parse_processes("auto") == (os.cpu_count() or 1)
    assert parse_processes("3") == 3


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5"])
def test_bad_processes_values_are_usage_errors(value: str) -> None:
    result = CliRunner().invoke(worker_command, ["--app", "nowhere:app", "--processes", value])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--processes'" in result.output
    result = CliRunner().invoke(
        worker_command, ["--app", "nowhere:app"], env={"BROKER_JOBS_PROCESSES": value}
    )
    assert result.exit_code == 2, result.output


# -- against the broker ------------------------------------------------------------------


def effects_app(tmp_path: Path, namespace: str, database: EffectsDatabase) -> Path:
    """A transactional handler writing each job's key in the store's own database, so
    that a job run twice shows as two rows."""
    return write_app(
        tmp_path,
        namespace,
        f"""
        @app.task("counter.add", transactional=True)
        def add(payload: Add, db) -> None:
            db.execute("INSERT INTO {database.table} (key) VALUES (?)", (payload.key,))
        """,
    )


def publish_keys(
    broker: Broker, namespace: str, cleanup: Callable[[Topology], Topology], keys: list[str]
) -> None:
    app = declared_app(namespace, cleanup)
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest("counter.add", {"key": key}) for key in keys])


def start_two_consuming(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    supervisors: Callable[[list[str], Path], WorkerProcess],
    request: pytest.FixtureRequest,
    *extra: str,
) -> tuple[WorkerProcess, EffectsDatabase]:
    """A supervisor of two worker processes on an SQLite effects app, once both consume."""
    database = EffectsDatabase("sqlite", tmp_path, request)
    effects_app(tmp_path, namespace, database)
    declared_app(namespace, cleanup_topology)
    args = ["--url", broker.url, "recovery_app:app", "--store", database.store_url]
    worker = supervisors([*args, "--processes", "2", *extra], tmp_path)
    wait_until(
        lambda: worker.log.count(" consuming counter.add") == 2,
        within=60,
        what="both worker processes consuming",
    )
    return worker, database


def effect_count(database: EffectsDatabase) -> int:
    return int(database.execute(f"SELECT COUNT(*) FROM {database.table}")[0][0])


def assert_each_effect_once(database: EffectsDatabase, keys: list[str]) -> None:
    rows = database.execute(f"SELECT key, COUNT(*) FROM {database.table} GROUP BY key")
    counts = {str(key): int(count) for key, count in rows}
    assert sorted(counts) == sorted(keys), "an effect is missing"
    assert set(counts.values()) == {1}, "an effect happened twice"


def success_holders(database: EffectsDatabase, keys: list[str]) -> set[str]:
    """The pids under which the successes were recorded (holder ids are host:pid:...)."""
    with open_store(database.store_url) as store:
        records = store.find(task="counter.add", limit=len(keys) + 1)
    assert len(records) == len(keys)
    return {str(record.worker).split(":")[1] for record in records}


@pytest.mark.broker
def test_two_processes_in_burst_drain_a_queue_each_effect_once_and_exit_0(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    supervisors: Callable[[list[str], Path], WorkerProcess],
    request: pytest.FixtureRequest,
) -> None:
    database = EffectsDatabase("sqlite", tmp_path, request)
    effects_app(tmp_path, namespace, database)
    keys = [f"k{n}" for n in range(600)]
    publish_keys(broker, namespace, cleanup_topology, keys)
    args = ["--url", broker.url, "recovery_app:app", "--store", database.store_url]
    worker = supervisors([*args, "--processes", "2", "--burst", "--concurrency", "2"], tmp_path)
    assert worker.process.wait(120) == 0, worker.log[-3000:]
    worker.stop()
    assert_each_effect_once(database, keys)
    pids = {pid for _index, pid in child_pids(worker)}
    assert len(pids) == 2, worker.log[-3000:]
    # Which process ran what is a race here: the first one up may drain the queue
    # before the second consumes, and a burst worker finding it empty exits 0.
    assert success_holders(database, keys) <= {str(pid) for pid in pids}
    assert all(gone(pid) for pid in pids)
    no_tracebacks(worker)


@pytest.mark.broker
def test_two_consuming_processes_share_a_queue_each_effect_once(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    supervisors: Callable[[list[str], Path], WorkerProcess],
    request: pytest.FixtureRequest,
) -> None:
    worker, database = start_two_consuming(
        broker, namespace, tmp_path, cleanup_topology, supervisors, request
    )
    pids = {str(pid) for _index, pid in child_pids(worker)}
    keys = [f"k{n}" for n in range(600)]
    # Both consumers are registered before the first publish, so the broker hands
    # the deliveries round-robin to both.
    publish_keys(broker, namespace, cleanup_topology, keys)
    wait_until(lambda: effect_count(database) >= len(keys), within=60, what="every job run")
    assert worker.stop() == 0, worker.log[-3000:]
    assert_each_effect_once(database, keys)
    assert success_holders(database, keys) == pids, "a process consumed nothing"
    no_tracebacks(worker)


@pytest.mark.broker
def test_sigterm_stops_every_child_and_exits_0(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    supervisors: Callable[[list[str], Path], WorkerProcess],
    request: pytest.FixtureRequest,
) -> None:
    worker, _database = start_two_consuming(
        broker, namespace, tmp_path, cleanup_topology, supervisors, request
    )
    pids = [pid for _index, pid in child_pids(worker)]
    assert worker.stop() == 0, worker.log[-3000:]
    assert all(gone(pid) for pid in pids), worker.log[-3000:]
    assert "SIGTERM: stopping 2 worker process(es)" in worker.log
    assert worker.log.count("stopping: finishing running jobs") == 2  # each child's own
    no_tracebacks(worker)


@pytest.mark.broker
def test_a_child_stopped_alone_is_replaced_and_its_supervisor_goes_on(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    supervisors: Callable[[list[str], Path], WorkerProcess],
    request: pytest.FixtureRequest,
) -> None:
    """`workers stop` of one process of `--processes 2` made it exit 0, which the
    supervisor took for a drained --burst: the command ran one process short, saying
    nothing. The supervisor now starts another in its place (a graceful restart), and
    `workers stop` says how to stop them all."""
    worker, database = start_two_consuming(
        broker, namespace, tmp_path, cleanup_topology, supervisors, request
    )
    (_, victim), _other = child_pids(worker)
    with open_store(database.store_url) as store:
        [child] = [v.record for v in process_views(store, namespace) if v.record.pid == victim]
    result = CliRunner().invoke(
        main,
        ["workers", "stop", child.id, "--namespace", namespace, "--store", database.store_url],
    )
    assert result.exit_code == 0, result.output
    assert "one of 2 processes under a supervisor" in result.output
    wait_until(lambda: len(child_pids(worker)) == 3, within=60, what="another process started")
    index, new_pid = child_pids(worker)[-1]
    assert (index, gone(victim)) == (0, True)
    assert new_pid != victim
    assert f"worker process 0 (pid {victim}) stopped alone" in worker.log
    assert worker.stop() == 0, worker.log[-3000:]
    no_tracebacks(worker)


@pytest.mark.broker
def test_a_child_killed_by_sigkill_is_restarted_and_the_queue_drains(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    supervisors: Callable[[list[str], Path], WorkerProcess],
    request: pytest.FixtureRequest,
) -> None:
    worker, database = start_two_consuming(
        broker, namespace, tmp_path, cleanup_topology, supervisors, request, "--lease", "5"
    )
    (_, victim), _other = child_pids(worker)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(child_pids(worker)) == 3, within=30, what="the child restarted")
    index, new_pid = child_pids(worker)[-1]
    assert index == 0
    assert new_pid != victim
    assert f"worker process 0 (pid {victim}) was killed by SIGKILL" in worker.log
    keys = [f"k{n}" for n in range(300)]
    publish_keys(broker, namespace, cleanup_topology, keys)
    wait_until(lambda: effect_count(database) >= len(keys), within=60, what="every job run")
    assert worker.stop() == 0, worker.log[-3000:]
    rows = database.execute(f"SELECT COUNT(DISTINCT key), COUNT(*) FROM {database.table}")
    assert rows == [(len(keys), len(keys))]
    no_tracebacks(worker)


@pytest.mark.broker
@pytest.mark.parametrize("fault", ["bad store URL", "app import raises"])
def test_a_child_failing_at_once_stops_the_supervisor_instead_of_spinning(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    supervisors: Callable[[list[str], Path], WorkerProcess],
    fault: str,
) -> None:
    if fault == "bad store URL":
        write_app(tmp_path, namespace, "")
        store = "nosuchdb://somewhere"
    else:
        write_app(tmp_path, namespace, "raise RuntimeError('the app cannot start')")
        store = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = ["--url", broker.url, "recovery_app:app", "--store", store]
    worker = supervisors([*args, "--processes", "auto"], tmp_path)
    assert worker.process.wait(60) == 1, worker.log[-3000:]
    worker.stop()
    cpus = os.cpu_count() or 1
    assert len(child_pids(worker)) == cpus, "a child was restarted"
    assert "a configuration error" in worker.log
    assert worker.log.count("ERROR") == 1, worker.log
    assert all(gone(pid) for _index, pid in child_pids(worker))
