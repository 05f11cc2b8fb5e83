"""The beat against a real broker: failover, catch-up, split brain (docs/beat.md).

Every fire is checked in the job ledger after a worker ran the emitted jobs: each
fire of the window executed, and executed once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker_jobs.envelope import Job
from broker_jobs.publish.prepare import JobFactory
from broker_jobs.store import MemoryStore, SQLiteStore, Status, Store, StoreError
from broker_jobs.store.processes import ProcessKind, ProcessState
from broker_jobs.worker import Worker, WorkerSettings
from scheduler import Beat, BeatSettings, Schedule, load_schedules
from scheduler.beat import fire_key
from scheduler.emitter import Emitter
from tests.beat_app import TASK, Tick, build_app
from tests.support import Broker, wait_until

REPO = Path(__file__).resolve().parent.parent
SECOND = timedelta(seconds=1)


def executions(broker: Broker, namespace: str, store: Store) -> Counter[str]:
    """Run the emitted jobs with a burst worker; return how often each label ran
    (one label per schedule) and check every job ran once: the ledger holds one
    succeeded record per fire and the handler ran once per record."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()

    def count(payload: Tick) -> None:
        with lock:
            ran[payload.label] += 1

    app = build_app(namespace, on_tick=count)
    settings = WorkerSettings(burst=True, concurrency=4, declare=False)
    asyncio.run(Worker(broker.url, app, store, settings).run())
    return ran


def ledger_fires(store: SQLiteStore, schedule: str) -> list[datetime]:
    """The fire times of a schedule's succeeded jobs in the ledger."""
    prefix = f"beat:{schedule}:"
    records = store.find(status=Status.SUCCEEDED, task=TASK, limit=100_000)
    return sorted(
        datetime.fromisoformat(record.idempotency_key.removeprefix(prefix))
        for record in records
        if record.idempotency_key.startswith(prefix)
    )


def emitted_fires(log: str) -> list[datetime]:
    """The fires of ``every-second`` that a beat's log says it emitted."""
    return [
        datetime.fromisoformat(line.rsplit("every-second:", 1)[1])
        for line in log.splitlines()
        if "emitted every-second" in line
    ]


def stood_down_at(log: str) -> int | None:
    """Where a beat's log first says it lost or left the leadership, if it does."""
    found = [at for at in map(log.find, ("lost the leadership", "standing down")) if at >= 0]
    return min(found, default=None)


def every_second(first: datetime, last: datetime) -> list[datetime]:
    return [first + n * SECOND for n in range(int((last - first) / SECOND) + 1)]


class BeatProcesses:
    """Beat subprocesses sharing one SQLite store and one schedules file."""

    def __init__(self, broker: Broker, namespace: str, tmp_path: Path, schedules: str) -> None:
        self.broker, self.namespace, self.tmp_path = broker, namespace, tmp_path
        self.db = tmp_path / "beat.db"
        self.schedules = tmp_path / "schedules.toml"
        self.schedules.write_text(schedules)
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, identity: str, *, heartbeat: int = 2) -> subprocess.Popen[bytes]:
        command = [
            sys.executable, "-c", "from broker_jobs.cli import main; main()",
            "beat", "tests.beat_app:app", "--url", self.broker.url,
            "--schedules", str(self.schedules), "--store", f"sqlite:///{self.db}",
            "--identity", identity, "--heartbeat", str(heartbeat),
        ]  # fmt: skip
        env = {**os.environ, "BROKER_JOBS_TEST_NAMESPACE": self.namespace}
        with (self.tmp_path / f"{identity}.log").open("ab") as log:
            process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.running[identity] = process
        return process

    def restart(self, identity: str) -> None:
        """Start ``identity`` again and wait until it runs (signals handled)."""
        starts = self.log(identity).count(" started: ")
        self.start(identity)
        wait_until(
            lambda: self.log(identity).count(" started: ") > starts,
            within=20,
            what=f"{identity} restarted",
        )

    def log(self, identity: str) -> str:
        return (self.tmp_path / f"{identity}.log").read_text()

    def stop_all(self) -> None:
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.terminate()
        for identity, process in self.running.items():
            assert process.wait(timeout=30) in (0, -signal.SIGKILL), self.log(identity)


@pytest.fixture
def beats(
    broker: Broker, namespace: str, tmp_path: Path, cleanup_topology: Callable[..., object]
) -> Iterator[Callable[[str], BeatProcesses]]:
    cleanup_topology(build_app(namespace).topology())
    made: list[BeatProcesses] = []

    def make(schedules: str) -> BeatProcesses:
        made.append(BeatProcesses(broker, namespace, tmp_path, schedules))
        return made[-1]

    yield make
    for group in made:
        for process in group.running.values():
            if process.poll() is None:
                process.kill()
                process.wait()


EVERY_SECOND = """
[[schedule]]
name = "every-second"
task = "beat.tick"
every = 1
"""


@pytest.mark.long
def test_killing_the_leader_five_times_loses_and_doubles_no_fire(
    broker: Broker,
    namespace: str,
    beats: Callable[[str], BeatProcesses],
    capsys: pytest.CaptureFixture[str],
) -> None:
    group = beats(EVERY_SECOND)
    for n in range(3):
        group.start(f"beat-{n}")
    store = SQLiteStore(group.db)
    key = fire_key(namespace, "every-second")
    wait_until(lambda: store.last_fire(key), within=30, what="a first fire")
    failovers = []
    for _ in range(5):
        leader = wait_until(lambda: store.leader(namespace), within=10, what="a leader")
        # Let the leader emit fires of its own, then kill it mid-stride.
        start = store.last_fire(key)
        assert start is not None
        wait_until(
            lambda start=start: (store.last_fire(key) or start) >= start + 2 * SECOND,
            within=20,
            what=f"{leader.identity} emitting",
        )
        group.running[leader.identity].kill()
        killed_at = datetime.now(UTC)
        successor = wait_until(
            lambda killed_at=killed_at: (
                (found := store.leader(namespace)) and found.since > killed_at and found
            ),
            within=10,
            what="a new leader",
        )
        emitted = wait_until(
            lambda killed_at=killed_at: (
                (fire := store.last_fire(key)) and fire > killed_at and fire
            ),
            within=10,
            what="a fire from the new leader",
        )
        failovers.append(
            f"{leader.identity} -> {successor.identity}:"
            f" elected after {(successor.since - killed_at).total_seconds() * 1000:.0f} ms,"
            f" next fire {emitted.isoformat(timespec='milliseconds')}"
        )
        group.running[leader.identity].wait()
        group.restart(leader.identity)  # back as a follower
    group.stop_all()
    with capsys.disabled():  # shown in every run's log, not only on failure
        print("\nbeat failovers after kill -9:\n  " + "\n  ".join(failovers))

    last = store.last_fire(key)
    ran = executions(broker, namespace, store)
    fires = ledger_fires(store, "every-second")
    assert fires, "no fire reached the ledger"
    assert fires == every_second(fires[0], last), "a fire of the window is missing"
    assert ran["tick"] == len(fires), "a fire executed more than once"
    assert fires[-1] - fires[0] >= 10 * SECOND  # five terms of two fires or more


def test_a_paused_leader_is_replaced_and_stands_down_when_resumed(
    broker: Broker,
    namespace: str,
    beats: Callable[[str], BeatProcesses],
    capsys: pytest.CaptureFixture[str],
) -> None:
    group = beats(EVERY_SECOND)
    for n in range(2):
        group.start(f"beat-{n}", heartbeat=1)
    store = SQLiteStore(group.db)
    key = fire_key(namespace, "every-second")
    wait_until(lambda: store.last_fire(key), within=30, what="a first fire")
    leader = wait_until(lambda: store.leader(namespace), within=10, what="a leader")
    paused = group.running[leader.identity]
    (follower,) = (name for name in group.running if name != leader.identity)
    follower_log_at_pause = len(group.log(follower))
    paused.send_signal(signal.SIGSTOP)
    paused_at = datetime.now(UTC)
    # Seen in the follower's log, not the store: the paused process may hold SQLite's
    # write lock (stopped mid-transaction), so no leader record is written until it
    # resumes, while the election itself goes through RabbitMQ.
    wait_until(
        lambda: f"beat {follower} leads" in group.log(follower)[follower_log_at_pause:],
        within=15,
        what="a leader after the pause",
    )
    log_at_resume = len(group.log(leader.identity))
    paused.send_signal(signal.SIGCONT)
    wait_until(
        lambda: stood_down_at(group.log(leader.identity)[log_at_resume:]) is not None,
        within=15,
        what="the resumed beat standing down",
    )
    successor = wait_until(
        lambda: (found := store.leader(namespace)) and found.identity == follower and found,
        within=15,
        what="the successor's leader record",
    )
    with capsys.disabled():
        replaced = (successor.since - paused_at).total_seconds()
        print(f"\nbeat: a paused leader (heartbeat 1 s) replaced after {replaced:.2f} s")
    resumed_at = store.last_fire(key)
    assert resumed_at is not None
    wait_until(
        lambda: (store.last_fire(key) or resumed_at) >= resumed_at + 3 * SECOND,
        within=10,
        what="fires after the resume",
    )
    # A publish in flight when the process stopped may be confirmed after it resumes;
    # nothing due after the pause may be emitted in the term it was paused in. (A term
    # it wins later is legitimate: on a loaded machine the successor's loop may stall
    # past heartbeat / 2 and hand the token back.)
    resumed_log = group.log(leader.identity)[log_at_resume:]
    new_term = resumed_log.find(f"beat {leader.identity} leads")
    paused_term = resumed_log if new_term < 0 else resumed_log[:new_term]
    late = emitted_fires(paused_term)
    assert all(fire <= paused_at for fire in late), (paused_at, resumed_log)
    if new_term >= 0:
        assert "lost the leadership" in group.log(successor.identity)
    else:
        assert (found := store.leader(namespace)) is not None
        assert found.identity == successor.identity
    group.stop_all()
    last = store.last_fire(key)
    ran = executions(broker, namespace, store)
    fires = ledger_fires(store, "every-second")
    assert fires
    assert last is not None
    assert fires == every_second(fires[0], last), "a fire of the window is missing"
    assert ran["tick"] == len(fires), "a fire executed more than once"


def catch_up_schedule(name: str, policy: str, lookback: int = 3600) -> str:
    """A one-second schedule whose jobs carry its name as their label."""
    return (
        f'[[schedule]]\nname = "{name}"\ntask = "beat.tick"\nevery = 1\n'
        f'catch_up = "{policy}"\nlookback = {lookback}\npayload = {{label = "{name}"}}\n'
    )


CATCH_UP = "\n".join(
    [
        catch_up_schedule("all", "all"),
        catch_up_schedule("latest", "latest"),
        catch_up_schedule("skip", "skip"),
        catch_up_schedule("bounded", "all", lookback=4),
    ]
)


def run_beat_until(beat: Beat, done: Callable[[], bool]) -> None:
    """Run ``beat`` on its own loop until ``done()``, then stop it."""

    async def main() -> None:
        running = asyncio.create_task(beat.run())
        while not done() and not running.done():
            await asyncio.sleep(0.02)  # polling the emitted fires the callback collects
        beat.stop()
        await running

    asyncio.run(main())


def test_catch_up_follows_each_policy(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[..., object],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """All beats stopped for ten fires, then one started: every missed fire (all),
    the latest missed one (latest), none (skip), or those within the lookback."""
    app = build_app(namespace)
    cleanup_topology(app.topology())
    (tmp_path / "catch-up.toml").write_text(CATCH_UP)
    schedules = load_schedules(app, [tmp_path / "catch-up.toml"])
    store = SQLiteStore(tmp_path / "beat.db")
    stopped = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    emitted: dict[str, list[datetime]] = defaultdict(list)

    def collect(schedule: Schedule, fire: datetime, job: Job) -> None:
        emitted[schedule.name].append(fire)

    def last_fires_reach(moment: datetime) -> bool:
        return all(store.last_fire(fire_key(namespace, s.name)) == moment for s in schedules)

    # Before the outage: one beat at `stopped` emits the fires due then.
    before = Beat(broker.url, app, schedules, store, on_emitted=collect, clock=lambda: stopped)
    run_beat_until(before, lambda: last_fires_reach(stopped))
    assert all(fires[-1] == stopped for fires in emitted.values())
    emitted.clear()

    # Ten fires later (and a quarter second), another beat starts.
    now = stopped + 10.25 * SECOND
    after = Beat(broker.url, app, schedules, store, on_emitted=collect, clock=lambda: now)
    with caplog.at_level(logging.INFO, logger="scheduler.beat"):
        run_beat_until(after, lambda: last_fires_reach(stopped + 10 * SECOND))
    said = caplog.messages
    assert "skipped 7 missed fire(s) of latest (catch_up latest, lookback 1:00:00)" in said
    assert "skipped 8 missed fire(s) of skip (catch_up skip, lookback 1:00:00)" in said
    assert not any("missed fire(s) of all" in line for line in said)
    assert f"emitted all beat:all:{stopped + SECOND:%Y-%m-%dT%H:%M:%S}Z (caught up)" in said

    # Fires late by more than the grace (2 s) are missed: stopped+1 .. stopped+8.
    on_time = [stopped + 9 * SECOND, stopped + 10 * SECOND]
    assert emitted["all"] == [stopped + n * SECOND for n in range(1, 11)]
    assert emitted["latest"] == [stopped + 8 * SECOND, *on_time]
    assert emitted["skip"] == on_time
    assert emitted["bounded"] == [stopped + n * SECOND for n in range(7, 11)]
    ran = executions(broker, namespace, store)
    # Plus the two fires each schedule emitted before the outage.
    assert ran == {"all": 12, "latest": 5, "skip": 4, "bounded": 6}


def test_two_leaders_at_once_still_run_each_fire_once(
    broker: Broker, namespace: str, tmp_path: Path, cleanup_topology: Callable[..., object]
) -> None:
    """A simulated split brain: two beats emit as leaders at the same time."""
    app = build_app(namespace)
    app.schedule("fast", TASK, every=0.2)
    cleanup_topology(app.topology())
    schedules = load_schedules(app)
    store = SQLiteStore(tmp_path / "beat.db")
    emitted: dict[str, list[datetime]] = defaultdict(list)

    async def both() -> None:
        pair = [
            Beat(
                broker.url,
                app,
                schedules,
                store,
                BeatSettings(identity=identity, force_leader=True),
                on_emitted=lambda s, fire, job, identity=identity: emitted[identity].append(fire),
            )
            for identity in ("left", "right")
        ]
        running = [asyncio.create_task(beat.run()) for beat in pair]
        while min(len(emitted["left"]), len(emitted["right"])) < 15:
            await asyncio.sleep(0.02)  # polling the emitted fires
        for beat in pair:
            beat.stop()
        await asyncio.gather(*running)

    asyncio.run(both())
    both_emitted = set(emitted["left"]) & set(emitted["right"])
    assert len(both_emitted) >= 10, "the two beats did not emit the same fires"
    ran = executions(broker, namespace, store)
    fires = ledger_fires(store, "fast")
    assert set(fires) == set(emitted["left"]) | set(emitted["right"])
    assert ran["tick"] == len(fires)


def test_jitter_delays_a_fire_the_same_for_every_leader(namespace: str) -> None:
    app = build_app(namespace)
    app.schedule("herd", TASK, cron="0 * * * *", jitter=300)
    (schedule,) = load_schedules(app)
    fire = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=2)
    jobs = [Emitter(JobFactory(app, None)).job_for(schedule, fire)[0] for _ in range(2)]
    assert jobs[0].id == jobs[1].id
    assert jobs[0].idempotency_key == f"beat:herd:{fire:%Y-%m-%dT%H}:00:00Z"
    assert jobs[0].due_at == jobs[1].due_at == fire + timedelta(seconds=schedule.jitter_for(fire))
    assert fire < jobs[0].due_at < fire + 300 * SECOND


class FlakyStore(MemoryStore):
    """A store whose first ``failures`` fire records fail (a locked or lost database)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def record_fire(self, schedule: str, fire_at: datetime) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise StoreError("the database is locked")
        super().record_fire(schedule, fire_at)


def test_a_store_failure_pauses_the_leader_and_loses_no_fire(
    broker: Broker,
    namespace: str,
    cleanup_topology: Callable[..., object],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fire published but not recorded is emitted again after the store recovers,
    under its fence key: nothing is lost, and the worker runs it once. The outage is
    said once and its end once (it was an ERROR and a "leads" line every second)."""
    caplog.set_level(logging.INFO, logger="scheduler.beat")
    app = build_app(namespace)
    app.schedule("steady", TASK, every=0.5)
    cleanup_topology(app.topology())
    store = FlakyStore(failures=3)
    emitted: list[datetime] = []
    beat = Beat(
        broker.url,
        app,
        load_schedules(app),
        store,
        on_emitted=lambda schedule, fire, job: emitted.append(fire),
    )
    run_beat_until(beat, lambda: len(emitted) >= 4)
    assert store.failures == 0
    kinds = {" leads ": "leads", "cannot use the store": "failed", "answers again": "answers"}
    said = [
        (record.levelname, kind)
        for record in caplog.records
        if record.name == "scheduler.beat"
        for words, kind in kinds.items()
        if words in record.getMessage()
    ]
    assert said == [("INFO", "leads"), ("WARNING", "failed"), ("INFO", "answers")], said
    last = store.last_fire(fire_key(namespace, "steady"))
    assert last == emitted[-1]
    ran = executions(broker, namespace, store)
    fires = store.find(status=Status.SUCCEEDED, task=TASK, limit=1000)
    assert ran["tick"] == len(fires) >= len(set(emitted))


def test_a_beat_given_several_urls_leads_through_the_first_that_answers(
    broker: Broker, namespace: str, cleanup_topology: Callable[..., object]
) -> None:
    """A node that is down first in the list: the beat declares, leads and emits
    through the next one."""
    app = build_app(namespace)
    app.schedule("steady", TASK, every=0.2)
    cleanup_topology(app.topology())
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        down = f"amqp://guest:guest@127.0.0.1:{probe.getsockname()[1]}/"
    emitted: list[datetime] = []
    store = MemoryStore()
    beat = Beat(
        [down, broker.url],
        app,
        load_schedules(app),
        store,
        BeatSettings(heartbeat=2),
        on_emitted=lambda schedule, fire, job: emitted.append(fire),
    )
    run_beat_until(beat, lambda: len(emitted) >= 2)
    assert len(emitted) >= 2
    # Its heartbeat (broker-jobs workers): a beat, stopped when it returned.
    [last] = store.processes(namespace)
    assert (last.id, last.kind, last.state) == (
        beat.identity,
        ProcessKind.BEAT,
        ProcessState.STOPPED,
    )
