"""The faults: what each scenario breaks, when, and what it measures besides the tally.

Every scenario is a function ``(env, store, settings) -> summary`` built on
:class:`~bench.faults.run.Run`; :data:`SCENARIOS` lists them with the stores they
support, and :func:`run_case` runs one, turning a skip or a failure into a summary too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import subprocess
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.faults.harness import (
    OVERRUN,
    OVERRUN_LIMIT,
    OVERRUN_SLEEP,
    PLAIN,
    POSTGRES,
    SQLITE,
    STORES,
    TX,
    Env,
    HandlerRun,
    ScenarioError,
    ScenarioSkipped,
    Settings,
)
from bench.faults.run import Run
from bench.figures import spread
from bench.workers import worker_has_option
from broker_jobs.store.base import TERMINAL
from broker_jobs.testing.ports import port_free
from broker_jobs.testing.postgres_node import PostgresNode
from broker_jobs.testing.processes import child_pids
from broker_jobs.testing.rabbit_cluster import RabbitCluster
from broker_jobs.testing.tcp_proxy import TcpProxy

#: Seconds the load goes on after a worker-kill storm.
AFTER_STORM = 3.0
#: Seconds a node restart is counted on when spreading a scenario's jobs over time.
RESTART_S = 8.0
#: The heartbeat (s) of the black-hole scenario's workers, and the cut's length in them.
HEARTBEAT, CUT_HEARTBEATS = 2, 3
#: The memory watermark that trips the alarm, and RabbitMQ's default to restore.
ALARM_WATERMARK, DEFAULT_WATERMARK = "0.00001", "0.4"
#: ``--overrun-grace`` given to the time-limit scenario's workers, when they have it.
OVERRUN_GRACE = 2


def _pause(seconds: float) -> None:
    time.sleep(max(0.0, seconds))


# -- 1. worker-kill -----------------------------------------------------------------------


def worker_kill(env: Env, store: str, settings: Settings) -> dict[str, Any]:
    """A storm of ``kill -9`` on the worker processes, one every 1-2 s (alternating,
    each restarted at once) while jobs are published and drained."""
    jobs, kills = settings.jobs_for(500, 8000), settings.pick(5, 18)
    lease = settings.pick(10, None)  # None: the worker's default (60 s)
    node = env.rabbit()
    with Run(env, "worker-kill", store) as run:
        run.declare(node.url)
        fleet = run.start_workers([node.url], extra=["--lease", str(lease)] if lease else [])
        storm = kills * 1.5
        run.start_loads(jobs / (storm + 1.0 + AFTER_STORM), node.url, limit=jobs)
        _pause(1.0)
        started, rng = time.time(), random.Random()
        for index in range(kills):
            _pause(rng.uniform(1.0, 2.0))
            fleet.kill(index % fleet.count)
        run.fault(started, time.time(), kind="kill -9 storm", kills=kills, every_s="1-2")
        _pause(AFTER_STORM)  # jobs published after the storm show the recovery
        run.stop_loads()
        run.drain(timeout=2 * (lease or 60) + 120)
        if lease:
            run.notes.append(f"workers ran with --lease {lease} (quick); the default is 60 s")
        summary = run.finish()
        summary["at_least_once"] = at_least_once(run)
    return summary


def at_least_once(run: Run) -> dict[str, Any]:
    """Why plain jobs ran twice: for each, the worker of its first finished run and
    when that worker was killed, and the job's executions in the ledger."""
    by_key = {k: v for k, v in run.plain_log.by_key().items() if k in run.confirmed(PLAIN)}
    killed_at = {e.pid: e.at for e in run.fleet_.kills}
    twice = {k: runs for k, runs in by_key.items() if sum(r.ended is not None for r in runs) > 1}
    causes: Counter[str] = Counter()
    gaps: list[float] = []
    for runs in twice.values():
        first = next(r for r in runs if r.ended is not None)
        kill = killed_at.get(first.pid)
        if kill is None:
            causes["its first worker was not killed"] += 1
            continue
        assert first.ended is not None
        gaps.append(kill - first.ended)
        causes["handler returned, worker killed before the success was recorded"] += 1
    histories: Counter[str] = Counter()
    for executions in run.ledger_.executions(sorted(twice)[:500]).values():
        histories[" > ".join(str(e.outcome or "running") for e in executions)] += 1
    cut = [r for runs in by_key.values() for r in runs if r.ended is None]
    kills = len(run.fleet_.kills)
    return {
        "plain_published": len(run.confirmed(PLAIN)),
        "kills": kills,
        "reran": len(twice),
        "reran_per_kill": round(len(twice) / kills, 2) if kills else None,
        "started_more_than_once": sum(len(runs) > 1 for runs in by_key.values()),
        "runs_cut_short_by_a_kill": len(cut),
        "causes": dict(causes),
        "handler_end_to_kill_s": spread(gaps),
        "ledger_histories": dict(histories.most_common(8)),
    }


# -- 2. broker-kill, broker-restart -------------------------------------------------------


def broker_kill(env: Env, store: str, settings: Settings) -> dict[str, Any]:
    """``kill -9`` of the RabbitMQ node under load, then its restart."""
    return _broker_down(env, store, settings, graceful=False)


def broker_restart(env: Env, store: str, settings: Settings) -> dict[str, Any]:
    """``rabbitmqctl stop`` of the node under load, then its start."""
    return _broker_down(env, store, settings, graceful=True)


def _broker_down(env: Env, store: str, settings: Settings, *, graceful: bool) -> dict[str, Any]:
    jobs, rounds, steady = settings.jobs_for(300, 3000), settings.pick(1, 3), settings.pick(2, 4)
    node = env.rabbit()
    name = "broker-restart" if graceful else "broker-kill"
    with Run(env, name, store) as run:
        # RabbitNode.kill: a quorum queue younger than ~0.5 s comes back empty.
        run.begin(node.url, jobs / (rounds * (steady + RESTART_S) + steady), settle=1.0)
        for number in range(1, rounds + 1):
            _pause(steady)
            started = time.time()
            if graceful:
                node.stop()
            else:
                node.kill()
            down = time.time()
            node.start()
            run.fault(
                started,
                time.time(),
                kind="rabbitmqctl stop, start" if graceful else "kill -9 of beam, start",
                round=number,
                stop_s=round(down - started, 3),
            )
        return run.end(steady)


# -- 3. cluster-leader ----------------------------------------------------------------------


def cluster_leader(env: Env, store: str, settings: Settings) -> dict[str, Any]:
    """A 3-node cluster, quorum queues; the node leading them, which every client is
    connected to, is killed (kill -9) under load."""
    jobs, steady = settings.jobs_for(300, 3000), settings.pick(2, 4)
    with _cluster(env) as cluster, Run(env, "cluster-leader", store) as run:
        run.declare(cluster.nodes[0].url)
        _pause(1.0)
        names = run.app_.names
        leaders = {task: cluster.queue_leader(names.task_queue(task)) for task in run.tasks}
        leader = cluster.node(leaders[TX])
        others = [node for node in cluster.nodes if node is not leader]
        urls = [leader.url, *(node.url for node in others)]  # everyone connects to it first
        run.admin_url = others[0].url
        run.start_workers(urls)
        run.start_loads(jobs / (2 * steady + RESTART_S), ",".join(urls))
        _pause(steady)
        killed = time.time()
        leader.kill()
        run.fault(
            killed,
            killed,
            kind="kill -9 of the queue leader (every client's node)",
            node=leader.nodename,
            leaders_before=leaders,
            cluster_formed_s=round(cluster.started_in or 0, 1),
        )
        run.wait_recovered(timeout=60)  # publishes may be refused until a new leader
        _pause(steady)
        run.stop_loads()
        confirms = [at for load in run.loads.values() for at in load.confirmed.values()]
        first = min((at for at in confirms if at > killed), default=None)
        run.faults[-1].details["first_confirm_after_s"] = (
            None if first is None else round(first - killed, 3)
        )
        run.drain(timeout=90)
        with contextlib.suppress(Exception):
            after = {task: cluster.queue_leader(names.task_queue(task)) for task in run.tasks}
            run.faults[-1].details["leaders_after"] = after
        run.notes.append("recovery counts from the kill: the node stays down (2 of 3 serve)")
        return run.finish()


@contextlib.contextmanager
def _cluster(env: Env) -> Iterator[RabbitCluster]:
    if not RabbitCluster.available():
        raise ScenarioSkipped("no local rabbitmq-server for a cluster")
    cluster = RabbitCluster.create(env.base / "cluster", size=3)
    print("  forming a 3-node RabbitMQ cluster of throwaway nodes", flush=True)
    try:
        try:
            cluster.start(timeout=180)
        except Exception as error:
            raise ScenarioSkipped(f"a 3-node cluster did not start: {error}") from error
        yield cluster
    finally:
        cluster.kill()
        with contextlib.suppress(Exception):
            cluster.cleanup()


# -- 4. black-hole --------------------------------------------------------------------------


def black_hole(env: Env, store: str, settings: Settings) -> dict[str, Any]:
    """The workers' connections go through a proxy that stops passing bytes (sockets
    kept open, nothing sent either way) for 3 heartbeats, then passes them again."""
    jobs, steady = settings.jobs_for(300, 3000), settings.pick(2, 4)
    cut_s = HEARTBEAT * CUT_HEARTBEATS
    node = env.rabbit()
    with (
        Run(env, "black-hole", store) as run,
        TcpProxy(f"{node.url}?heartbeat={HEARTBEAT}") as proxy,
    ):
        run.declare(node.url)
        fleet = run.start_workers([proxy.url])
        run.start_loads(jobs / (2 * steady + cut_s + 2), node.url)  # the publisher: direct
        _pause(steady)
        cut = time.time()
        proxy.cut()
        _pause(cut_s)
        proxy.heal()
        healed = time.time()
        noticed = {
            w.name: None if (r := w.first("lost the broker", cut)) is None else round(r.at - cut, 2)
            for w in fleet.slots
        }
        run.fault(
            cut,
            healed,
            kind=f"proxy black-holes the workers' connections (heartbeat {HEARTBEAT} s)",
            noticed_s=noticed,
        )
        return run.end(steady + 2)


# -- 5. postgres-kill -----------------------------------------------------------------------


def postgres_kill(env: Env, store: str, settings: Settings) -> dict[str, Any]:
    """The PostgreSQL ledger's server: every process killed (kill -9), down for ~10 s,
    then started again on the same port and data directory."""
    jobs, steady, down = settings.jobs_for(300, 3000), settings.pick(2, 4), settings.pick(6, 10)
    node, postgres = env.rabbit(), env.postgres()
    with Run(env, "postgres-kill", POSTGRES) as run:
        run.begin(node.url, jobs / (2 * steady + down + 1))
        _pause(steady)
        run.held_fault(
            down,
            "kill -9 of every PostgreSQL process, restart",
            lambda: {"processes": kill_postgres(postgres)},
            lambda: start_postgres_when_its_port_is_free(postgres),
        )
        return run.end(steady)


def kill_postgres(node: PostgresNode) -> int:
    """SIGKILL the postmaster and its children (a crash), wait until they are gone;
    how many processes there were."""
    pid_file = node.data_dir / "postmaster.pid"
    try:
        master = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError) as error:
        raise ScenarioError(f"no PostgreSQL postmaster to kill: {error}") from error
    pids = {master, *child_pids(master)}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise ScenarioError(f"PostgreSQL processes survived SIGKILL: {sorted(pids)}")
        time.sleep(0.05)
    return len(pids)


def start_postgres_when_its_port_is_free(node: PostgresNode, within: float = 30.0) -> None:
    """Start ``node`` again on its port once nothing holds that port: a backend forked
    as the postmaster was killed (a worker reconnecting) is not among the children
    listed before the kill, and may hold the listening socket for a moment; a start
    meanwhile fails with "could not bind ... Address already in use"."""
    deadline = time.monotonic() + within
    while not port_free(node.port, "127.0.0.1"):
        if time.monotonic() > deadline:
            raise ScenarioError(f"port {node.port} still held {within:.0f} s after the kill")
        time.sleep(0.1)
    node.start()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie is dead (its parent, pg_ctl's shell, is gone)


# -- 6. sqlite-full-disk --------------------------------------------------------------------


def sqlite_full_disk(env: Env, store: str, settings: Settings) -> dict[str, Any]:
    """The SQLite ledger on a small tmpfs that a filler file fills up for ~15 s; then
    the filler is deleted."""
    jobs, steady, hold = settings.jobs_for(300, 3000), settings.pick(2, 4), settings.pick(8, 15)
    node = env.rabbit()
    mount = env.base / "ledger-tmpfs"
    with _tmpfs(mount, "64m"), Run(env, "sqlite-full-disk", SQLITE, ledger_dir=mount) as run:
        run.begin(node.url, jobs / (2 * steady + hold + 1))
        _pause(steady)
        filler = mount / "filler"

        def fill_up() -> dict[str, Any]:
            filled, left = fill(filler), os.statvfs(mount)
            return {
                "filled_mib": round(filled / 2**20, 1),
                "free_bytes_while_full": left.f_bavail * left.f_frsize,
            }

        run.held_fault(hold, "the ledger's file system full (tmpfs 64 MiB)", fill_up, filler.unlink)
        return run.end(steady)


def fill(path: Path) -> int:
    """Write ``path`` until the file system says ENOSPC: the bytes written."""
    written = 0
    with path.open("wb", buffering=0) as filler:
        for size in (2**20, 2**12, 2**9):
            chunk = b"\0" * size
            while True:
                try:
                    written += filler.write(chunk) or 0
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    break
    return written


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        raise ScenarioSkipped("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if mounted.returncode != 0:
        raise ScenarioSkipped(f"mount -t tmpfs failed: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        for args in (["umount", str(where)], ["umount", "-l", str(where)]):
            done = subprocess.run(args, check=False, capture_output=True, timeout=30)
            if done.returncode == 0:
                break
            time.sleep(0.5)
        with contextlib.suppress(OSError):
            where.rmdir()


# -- 7. memory-alarm ------------------------------------------------------------------------


def memory_alarm(env: Env, store: str, settings: Settings) -> dict[str, Any]:
    """The broker's memory alarm (``set_vm_memory_high_watermark 0.00001``) for some
    seconds under the publishers, then the default watermark again."""
    jobs, steady, hold = settings.jobs_for(300, 3000), settings.pick(2, 4), settings.pick(6, 10)
    node = env.rabbit()
    with Run(env, "memory-alarm", store) as run:
        run.begin(node.url, jobs / (2 * steady + hold + 1))
        _pause(steady)
        raised = time.time()
        try:
            node.ctl("set_vm_memory_high_watermark", ALARM_WATERMARK)
            _pause(hold)
        finally:
            node.ctl("set_vm_memory_high_watermark", DEFAULT_WATERMARK)
        cleared = time.time()
        _pause(steady + 2)
        run.stop_loads()
        confirms = [at for task in run.tasks for at in run.loads[task].confirmed.values()]
        first_after = min((at for at in confirms if at > cleared), default=None)
        run.fault(
            raised,
            cleared,
            kind=f"memory alarm (watermark {ALARM_WATERMARK}), then {DEFAULT_WATERMARK}",
            confirmed_during_alarm=sum(raised + 1 < at <= cleared for at in confirms),
            first_confirm_after_s=None if first_after is None else round(first_after - cleared, 3),
        )
        run.drain(timeout=90)
        return run.finish()


# -- 8. time-limit-overrun ------------------------------------------------------------------


def time_limit_overrun(env: Env, store: str, settings: Settings) -> dict[str, Any]:
    """A sync handler past its 1 s time limit (it sleeps 3 s in time.sleep), 2
    attempts: no two executions of one key may overlap."""
    jobs = settings.jobs_for(6, 16)
    node = env.rabbit()
    extra = ["--lease", "10"] if settings.quick else []
    grace = worker_has_option("--overrun-grace")
    if grace:
        extra += ["--overrun-grace", str(OVERRUN_GRACE)]
    with Run(env, "time-limit-overrun", store, tasks=(OVERRUN,)) as run:
        run.declare(node.url)
        fleet = run.start_workers([node.url], extra=extra)
        run.start_loads(jobs * 10.0, node.url, limit=jobs)
        run.wait_loads(timeout=30)
        keys = sorted(run.confirmed(OVERRUN))

        def settled() -> bool:
            statuses = run.ledger_.statuses(keys)
            busy = any(r.ended is None for r in run.overrun_log.runs())
            return not busy and all(status in TERMINAL for status in statuses)

        run.drain(timeout=settings.pick(60, 150), settled=settled)
        runs = run.overrun_log.by_key()
        now = time.time()
        overlapping = {
            key: count
            for key, key_runs in runs.items()
            if (count := overlaps(key_runs, fleet.ended_at, now))
        }
        durations = [(r.ended or now) - r.started for key_runs in runs.values() for r in key_runs]
        run.extra.update(
            overlapping_keys=len(overlapping),
            overrun={
                "time_limit_s": OVERRUN_LIMIT,
                "handler_sleeps_s": OVERRUN_SLEEP,
                "overrun_grace": OVERRUN_GRACE if grace else "option not in this worker",
                "jobs": len(keys),
                "executions": len([r for key_runs in runs.values() for r in key_runs]),
                "executions_per_key": dict(Counter(len(v) for v in runs.values())),
                "overlapping": dict(sorted(overlapping.items())[:20]),
                "run_s": spread(durations),
                "statuses": dict(run.ledger_.statuses(keys)),
            },
        )
        if not grace:
            run.notes.append("this worker has no --overrun-grace option yet")
        return run.finish()


def overlaps(
    runs: Sequence[HandlerRun], ended_at: Callable[[int], float | None], now: float
) -> int:
    """Runs of one key that started before an earlier run of it had ended (a run
    without an E line ended when its process did, else it still runs)."""
    count, latest_end = 0, 0.0
    for run in sorted(runs, key=lambda r: r.started):
        if run.started < latest_end:
            count += 1
        end = run.ended or ended_at(run.pid) or now
        latest_end = max(latest_end, end)
    return count


# -- the list -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Env, str, Settings], dict[str, Any]]
    stores: tuple[str, ...]  # those it supports
    defaults: tuple[str, ...]  # those it runs without --store


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("worker-kill", worker_kill, STORES, STORES),
        Scenario("broker-kill", broker_kill, STORES, (SQLITE,)),
        Scenario("broker-restart", broker_restart, STORES, (SQLITE,)),
        Scenario("cluster-leader", cluster_leader, STORES, (SQLITE,)),
        Scenario("black-hole", black_hole, STORES, (SQLITE,)),
        Scenario("postgres-kill", postgres_kill, (POSTGRES,), (POSTGRES,)),
        Scenario("sqlite-full-disk", sqlite_full_disk, (SQLITE,), (SQLITE,)),
        Scenario("memory-alarm", memory_alarm, STORES, (SQLITE,)),
        Scenario("time-limit-overrun", time_limit_overrun, STORES, (SQLITE,)),
    )
}


def cases(names: Sequence[str], store: str | None) -> list[tuple[str, str]]:
    """(scenario, store) pairs: ``store`` where the scenario supports it, else its own."""
    found = []
    for name in names:
        scenario = SCENARIOS[name]
        stores = (store,) if store in scenario.stores else scenario.defaults
        found += [(name, each) for each in stores]
    return found


def run_case(env: Env, name: str, store: str, settings: Settings) -> dict[str, Any]:
    """One scenario's summary; a skip or an error is a summary too (never raised)."""
    began = time.time()
    try:
        return SCENARIOS[name].run(env, store, settings)
    except ScenarioSkipped as skipped:
        return {"scenario": name, "store": store, "ok": None, "skipped": str(skipped)}
    except Exception as error:
        return {
            "scenario": name,
            "store": store,
            "ok": False,
            "error": f"{type(error).__name__}: {error}",
            "traceback": traceback.format_exc().splitlines()[-12:],
            "duration_s": round(time.time() - began, 1),
            "problems": [f"the scenario failed: {type(error).__name__}: {error}"],
        }
