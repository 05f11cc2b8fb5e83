"""Beat failover: time from the leader's death (or pause) to the new leader's first emission.

Several beat processes (``--beats``, each running the real ``scheduler.Beat`` as
``broker-jobs beat`` does) share one SQLite store and one fresh namespace, whose app
has one task, ``bench.tick``, and one interval schedule firing every ``--interval``
seconds. Each child reports every emitted fire on its stdout (``on_emitted``: after the
publish confirm and the store's ``record_fire``), stamped with ``time.time()``.

- A **kill** round: the beat that emitted last is the leader; ``kill -9`` it at
  ``t0``. Failover = the first emission by another beat after ``t0``, minus ``t0``.
  A replacement (same identity) is started and must be running before the next round.
- A **pause** round: ``SIGSTOP`` the leader at ``t0``, failover as above (the broker
  drops the silent connection 2 to 3 heartbeats after its last byte); then ``SIGCONT``
  it: it must stand down and emit no fire later than ``t0``.

At the end, the fires emitted must form a contiguous sequence of the schedule's
instants (no gap); a fire emitted by two leaders (a duplicate, harmless thanks to the
fence key) is listed.

    python -m bench.failover --url amqp://guest:guest@localhost:5672/
    python -m bench.failover --kills 5 --pauses 1   # no URL: starts a throwaway node

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, TextIO, TypeVar

from pydantic import BaseModel

from bench.publish import Admin, add_url_argument, broker, describe_broker, percentile
from broker_jobs import App
from broker_jobs.envelope import Job
from broker_jobs.observe.logs import configure_logging
from broker_jobs.store.urls import open_store
from broker_jobs.testing.rabbit_node import RabbitNode
from scheduler import Beat, BeatSettings, Schedule, load_schedules
from topology import Topology
from topology.model import ExchangeSpec, QueueSpec
from topology.names import Names
from topology.permissions import beat_leader_queue

T = TypeVar("T")

TASK = "bench.tick"
SCHEDULE = "tick"
REPO = Path(__file__).resolve().parent.parent
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

DEFAULT_KILLS, DEFAULT_PAUSES, DEFAULT_BEATS = 20, 3, 3
DEFAULT_HEARTBEAT, DEFAULT_INTERVAL = 2, 0.05

#: Aim after a kill -9 (seconds).
AIM_KILL = 1.0
#: Aim after a pause: the heartbeat timeout plus this (seconds).
AIM_PAUSE_MARGIN = 1.0
#: Seconds a child has to start (imports, declaring the topology, joining).
START_TIMEOUT = 30.0
#: Seconds the leader keeps emitting alone before a round (after a replacement is up).
SETTLE = 0.7
#: The leader's latest emission must be this recent (seconds) for it to count as leading.
RECENT = 1.0
#: Seconds a resumed leader has to log that it stands down.
STAND_DOWN_TIMEOUT = 5.0
#: After a resumed leader stood down, seconds more to catch a late emission from it.
LATE_EMIT_GRACE = 1.0
#: Duplicates listed in full at most.
SHOW_DUPLICATES = 10


class Tick(BaseModel):
    """The benchmark task's payload model."""

    label: str = "tick"


# -- options ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    url: str | None
    kills: int
    pauses: int
    beats: int
    heartbeat: int
    interval: float


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.failover", description=__doc__.split("\n\n", 1)[0]
    )
    add_url_argument(parser)
    parser.add_argument(
        "--kills", type=int, default=DEFAULT_KILLS, help="kill -9 rounds (%(default)s)"
    )
    parser.add_argument(
        "--pauses", type=int, default=DEFAULT_PAUSES, help="SIGSTOP rounds (%(default)s)"
    )
    parser.add_argument(
        "--beats", type=int, default=DEFAULT_BEATS, help="beat processes (%(default)s)"
    )
    parser.add_argument(
        "--heartbeat",
        type=int,
        default=DEFAULT_HEARTBEAT,
        help="the beats' AMQP heartbeat, whole seconds (%(default)s)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        help="the schedule's interval in seconds (%(default)s)",
    )
    # The child process: one beat (internal).
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--identity", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kills < 0 or args.pauses < 0 or args.kills + args.pauses < 1:
        parser.error("--kills and --pauses must not be negative, and not both 0")
    if args.beats < 2:
        parser.error("--beats must be at least 2")
    if args.heartbeat < 1:
        parser.error("--heartbeat must be at least 1 second")
    if not 0.001 <= args.interval <= 1.0:
        parser.error("--interval must be between 0.001 and 1 s")
    if args.child and not (args.url and args.namespace and args.identity and args.store):
        parser.error("--child needs --url, --namespace, --identity and --store")
    return args


def options_from(args: argparse.Namespace) -> Options:
    return Options(
        url=args.url or None,
        kills=args.kills,
        pauses=args.pauses,
        beats=args.beats,
        heartbeat=args.heartbeat,
        interval=args.interval,
    )


def build_app(namespace: str, interval: float) -> App:
    app = App(namespace=namespace)
    app.declare(TASK, Tick)
    app.schedule(SCHEDULE, TASK, every=interval)
    return app


# -- the child: one beat process ----------------------------------------------------------


class _Lines(logging.Handler):
    """Turns the beat's log lines into stdout lines for the parent: READY once it runs
    (signals handled, joining the election), LEAD when elected, STANDDOWN when it
    loses the leadership."""

    MARKERS = ((" started: ", "READY"), (" leads ", "LEAD"), ("standing down", "STANDDOWN"))

    def __init__(self, identity: str, write: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._identity = identity
        self._write = write

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for marker, word in self.MARKERS:
            if marker in message:
                self._write(f"{word} {self._identity} {record.created!r}")


def child_main(args: argparse.Namespace) -> int:
    """Run one beat like ``broker-jobs beat`` does, reporting each emitted fire."""
    configure_logging()
    identity: str = args.identity
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def emitted(schedule: Schedule, fire: datetime, job: Job) -> None:
        write(f"EMIT {identity} {time.time()!r} {fire.isoformat()}")

    logging.getLogger("scheduler.beat").addHandler(_Lines(identity, write))
    app = build_app(args.namespace, args.interval)
    schedules = load_schedules(app)
    settings = BeatSettings(identity=identity, heartbeat=args.heartbeat)
    with open_store(args.store) as store:
        beat = Beat(args.url, app, schedules, store, settings, on_emitted=emitted)
        asyncio.run(_run_child(beat))
    return 0


async def _run_child(beat: Beat) -> None:
    beat.install_signal_handlers()
    await beat.run()


# -- the parent: children and what they print ---------------------------------------------


class Emit(NamedTuple):
    """One fire a beat emitted: ``at`` is the child's ``time.time()`` after the confirm."""

    child: Child
    at: float
    fire: datetime


@dataclass(eq=False)
class Child:
    """One beat process; ``incarnation`` counts restarts of the same identity."""

    identity: str
    incarnation: int
    process: subprocess.Popen[str]
    log_path: Path
    ready: bool = False
    paused: bool = False
    leads: list[float] = field(default_factory=list)
    stand_downs: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.identity if self.incarnation == 0 else f"{self.identity}#{self.incarnation}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Beats:
    """The beat processes of one run and the lines they print, read in threads."""

    def __init__(self, url: str, options: Options, namespace: str, workdir: Path) -> None:
        self.url, self.options, self.namespace, self.workdir = url, options, namespace, workdir
        self.store_url = f"sqlite:///{workdir / 'beat.db'}"
        self.current: dict[str, Child] = {}
        self.every: list[Child] = []
        self.emits: list[Emit] = []
        self.unparsed: list[str] = []
        self._lines: queue.Queue[tuple[Child, str]] = queue.Queue()

    def start(self, identity: str) -> Child:
        incarnation = sum(child.identity == identity for child in self.every)
        log_path = self.workdir / f"{identity}.{incarnation}.log"
        command = [
            sys.executable, "-m", "bench.failover", "--child",
            "--url", self.url, "--namespace", self.namespace, "--identity", identity,
            "--store", self.store_url, "--heartbeat", str(self.options.heartbeat),
            "--interval", repr(self.options.interval),
        ]  # fmt: skip
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
        child = Child(identity, incarnation, process, log_path)
        self.current[identity] = child
        self.every.append(child)
        stdout = process.stdout
        assert stdout is not None
        threading.Thread(
            target=self._read, args=(child, stdout), name=f"read {child.name}", daemon=True
        ).start()
        return child

    def _read(self, child: Child, stdout: TextIO) -> None:
        for line in stdout:
            self._lines.put((child, line.rstrip("\n")))

    def pump(self, timeout: float) -> None:
        """Take in the lines printed so far, waiting up to ``timeout`` for the first."""
        with contextlib.suppress(queue.Empty):
            child, line = self._lines.get(timeout=max(timeout, 0.0))
            self._take(child, line)
            while True:
                child, line = self._lines.get_nowait()
                self._take(child, line)

    def _take(self, child: Child, line: str) -> None:
        word, _, rest = line.partition(" ")
        parts = rest.split()
        try:
            if word == "EMIT" and len(parts) == 3:
                fire = datetime.fromisoformat(parts[2])
                self.emits.append(Emit(child, float(parts[1]), fire))
            elif word == "READY":
                child.ready = True
            elif word == "LEAD" and len(parts) == 2:
                child.leads.append(float(parts[1]))
            elif word == "STANDDOWN" and len(parts) == 2:
                child.stand_downs.append(float(parts[1]))
            else:
                self.unparsed.append(f"{child.name}: {line}")
        except ValueError:
            self.unparsed.append(f"{child.name}: {line}")

    def pump_for(self, seconds: float) -> None:
        """Take in every line printed during the next ``seconds``."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self.pump(remaining)

    def wait_for(self, found: Callable[[], T | None], within: float, what: str) -> T:
        deadline = time.monotonic() + within
        while True:
            self.pump(0.0)
            value = found()
            if value is not None and value is not False:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout(f"no {what} within {within:g} s")
            self.pump(min(remaining, 0.02))

    def wait_ready(self, child: Child) -> None:
        def ready() -> bool | None:
            if not child.alive:
                raise Timeout(f"{child.name} exited ({child.process.returncode}) before ready")
            return child.ready or None

        self.wait_for(ready, START_TIMEOUT, f"{child.name} ready")

    def leader(self) -> Child:
        """The live beat that emitted last, once its latest emission is recent."""

        def found() -> Child | None:
            if not self.emits:
                return None
            latest = max(self.emits, key=lambda emit: emit.at)
            child = latest.child
            recent = time.time() - latest.at < RECENT
            return child if recent and child.alive and not child.paused else None

        return self.wait_for(found, 3 * self.options.heartbeat + 10, "a leader emitting")

    def first_emit_after(self, t0: float, other_than: Child) -> Emit | None:
        later = [e for e in self.emits if e.at > t0 and e.child is not other_than]
        return min(later, key=lambda emit: emit.at) if later else None

    def stop_all(self) -> None:
        """Kill every child (resumed first, so none is left stopped)."""
        for child in self.every:
            if child.alive:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGCONT)
                    child.process.kill()
        for child in self.every:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=10)
        self.pump_for(0.2)


class Timeout(Exception):
    """Something awaited from the beats did not happen in time."""


# -- rounds -------------------------------------------------------------------------------


@dataclass
class Event:
    """One kill or pause: times in seconds after ``t0`` (None: not observed)."""

    kind: str  # "kill" or "pause"
    number: int
    victim: str
    successor: str | None = None
    failover: float | None = None
    elected: float | None = None  # the successor's "leads" log line
    first_fire: str | None = None
    #: Seconds the new leader waited for the first fire after its election (0: the
    #: first fire was already due then, a catch-up).
    fire_wait: float | None = None
    caught_up: int = 0  # fires already due at the election, emitted at once
    catch_up_first: bool | None = None  # the first emission's fire was due before election
    # pause rounds
    paused_for: float | None = None
    stood_down_after: float | None = None  # after the resume
    late_fires: list[str] = field(default_factory=list)  # fires > t0 from the resumed one
    error: str | None = None

    @property
    def stood_down(self) -> bool | None:
        if self.kind != "pause" or self.paused_for is None:
            return None
        return not self.late_fires


def plan(kills: int, pauses: int) -> list[str]:
    """Kills with the pauses spread evenly among them."""
    rounds = ["kill"] * kills
    for j in reversed(range(pauses)):
        rounds.insert(round((j + 1) * kills / (pauses + 1)), "pause")
    return rounds


def settle(beats: Beats) -> Child:
    time.sleep(SETTLE)
    leader = beats.leader()
    # A random phase against the fire grid, so kills land anywhere between two fires.
    time.sleep(random.uniform(0, beats.options.interval))
    beats.pump(0.0)
    return leader


def kill_round(beats: Beats, number: int) -> Event:
    leader = settle(beats)
    event = Event("kill", number, leader.name)
    t0 = time.time()
    os.kill(leader.process.pid, signal.SIGKILL)
    within = 3 * beats.options.heartbeat + 10
    try:
        first = beats.wait_for(lambda: beats.first_emit_after(t0, leader), within, "new leader")
        note_successor(event, t0, first)
    except Timeout as error:
        event.error = str(error)
    leader.process.wait(timeout=10)
    replacement = beats.start(leader.identity)
    beats.wait_ready(replacement)
    count_caught_up(beats, event, t0)
    return event


def pause_round(beats: Beats, number: int) -> Event:
    leader = settle(beats)
    event = Event("pause", number, leader.name)
    t0 = time.time()
    os.kill(leader.process.pid, signal.SIGSTOP)
    leader.paused = True
    within = 3 * beats.options.heartbeat + 10
    try:
        first = beats.wait_for(lambda: beats.first_emit_after(t0, leader), within, "new leader")
        note_successor(event, t0, first)
    except Timeout as error:
        event.error = str(error)
    stand_downs = len(leader.stand_downs)
    resumed = time.time()
    os.kill(leader.process.pid, signal.SIGCONT)
    leader.paused = False
    event.paused_for = resumed - t0
    with contextlib.suppress(Timeout):
        beats.wait_for(
            lambda: len(leader.stand_downs) > stand_downs, STAND_DOWN_TIMEOUT, "stand down"
        )
        event.stood_down_after = leader.stand_downs[-1] - resumed
    beats.pump_for(LATE_EMIT_GRACE)
    event.late_fires = [
        iso(emit.fire)
        for emit in beats.emits
        if emit.child is leader and emit.fire.timestamp() > t0
    ]
    if not leader.alive:
        event.error = f"{leader.name} exited after the resume ({leader.process.returncode})"
    count_caught_up(beats, event, t0)
    return event


def note_successor(event: Event, t0: float, first: Emit) -> None:
    successor = first.child
    event.successor = successor.name
    event.failover = first.at - t0
    event.first_fire = iso(first.fire)
    elected = next((lead for lead in successor.leads if lead > t0), None)
    if elected is not None:
        event.elected = elected - t0
        event.fire_wait = max(0.0, first.fire.timestamp() - elected)
        event.catch_up_first = first.fire.timestamp() <= elected


def count_caught_up(beats: Beats, event: Event, t0: float) -> None:
    """The fires already due when the successor was elected (emitted at once): counted
    once the round is over, when its first burst has been read."""
    if event.successor is None or event.elected is None:
        return
    successor = next(child for child in beats.every if child.name == event.successor)
    elected = t0 + event.elected
    event.caught_up = sum(
        emit.child is successor and emit.at > t0 and emit.fire.timestamp() <= elected
        for emit in beats.emits
    )


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- figures ------------------------------------------------------------------------------


def ms(seconds: float | None) -> float | None:
    if seconds is None or math.isnan(seconds):
        return None
    return round(seconds * 1000, 1)


def stats(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "count": len(values),
        "p50_ms": ms(percentile(values, 50)),
        "p90_ms": ms(percentile(values, 90)),
        "max_ms": ms(max(values, default=math.nan)),
        "min_ms": ms(min(values, default=math.nan)),
    }


@dataclass(frozen=True)
class FireSequence:
    """The fires emitted over the run, on the schedule's grid."""

    emissions: int
    fires: int
    first: str | None
    last: str | None
    duplicates: list[str]
    gaps: list[str]


def check_sequence(emits: Sequence[Emit], interval: float) -> FireSequence:
    step = timedelta(seconds=interval)
    counts = Counter((emit.fire - EPOCH) // step for emit in emits)
    if not counts:
        return FireSequence(0, 0, None, None, [], [])
    first, last = min(counts), max(counts)

    def instant(index: int) -> str:
        return iso(EPOCH + index * step)

    return FireSequence(
        emissions=len(emits),
        fires=len(counts),
        first=instant(first),
        last=instant(last),
        duplicates=[instant(index) for index in sorted(counts) if counts[index] > 1],
        gaps=[instant(index) for index in range(first, last + 1) if index not in counts],
    )


def figures(events: Sequence[Event]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for kind in ("kill", "pause"):
        done = [event for event in events if event.kind == kind and event.failover is not None]
        elected = [event.elected for event in done if event.elected is not None]
        after_election = [
            event.failover - event.elected
            for event in done
            if event.failover is not None and event.elected is not None
        ]
        result[kind] = {
            "failover": stats([event.failover for event in done if event.failover is not None]),
            "elected": stats(elected),
            "election_to_emission": stats(after_election),
            "fire_wait": stats([event.fire_wait for event in done if event.fire_wait is not None]),
            "catch_up_first": sum(bool(event.catch_up_first) for event in done),
            "rounds": sum(event.kind == kind for event in events),
            "failed": sum(event.kind == kind and event.failover is None for event in events),
        }
    return result


class Aim(NamedTuple):
    label: str
    figure: str  # what is compared, for the report
    met: bool | None  # None: no round of that kind


def aims(options: Options, table: dict[str, dict[str, Any]], events: Sequence[Event]) -> list[Aim]:
    """The issue's aims. A pause is judged against 3 heartbeats + 1 s: RabbitMQ drops
    a silent connection 2 to 3 heartbeats after its last byte (its check runs once a
    heartbeat and gives up after two checks without data), so 3 heartbeats is the
    heartbeat timeout's worst case; 2 heartbeats + 1 s is shown too, informational."""
    h = options.heartbeat
    pauses = [event for event in events if event.kind == "pause"]

    def under(kind: str, limit_s: float) -> Aim:
        group = table[kind]
        worst = group["failover"]["max_ms"]
        label = f"{'kill -9' if kind == 'kill' else 'pause'}: max < {limit_s:g} s"
        figure = f"max {'-' if worst is None else f'{worst:g}'} ms"
        if group["failed"]:
            return Aim(label, f"{figure}, {group['failed']} without a new leader", met=False)
        if not group["rounds"]:
            return Aim(label, figure, met=None)
        return Aim(label, figure, met=worst is not None and worst < limit_s * 1000)

    kill = under("kill", AIM_KILL)
    worst_case = under("pause", 3 * h + AIM_PAUSE_MARGIN)
    best_case = under("pause", 2 * h + AIM_PAUSE_MARGIN)
    stood = sum(bool(event.stood_down) for event in pauses)
    return [
        kill,
        worst_case._replace(label=worst_case.label + f" (3 x {h} s heartbeat + 1 s: the aim)"),
        best_case._replace(label=best_case.label + f" (2 x {h} s + 1 s: informational)"),
        Aim(
            "pause: every resumed leader stood down",
            f"{stood}/{len(pauses)}",
            met=stood == len(pauses) if pauses else None,
        ),
    ]


# -- reporting ----------------------------------------------------------------------------


def describe_config(
    options: Options, url: str, node: RabbitNode | None, admin: Admin, namespace: str
) -> dict[str, Any]:
    return {
        **describe_broker(url, node, admin),
        "namespace": namespace,
        "beats": options.beats,
        "heartbeat_s": options.heartbeat,
        "interval_s": options.interval,
        "kills": options.kills,
        "pauses": options.pauses,
        "beat": "own processes: scheduler.Beat as broker-jobs beat runs it, SQLite store",
        "measure": "kill/stop at t0 -> first fire emitted (confirmed, recorded) by another beat",
    }


def print_config(config: dict[str, Any]) -> None:
    print("Beat failover benchmark (broker_jobs)")
    for key, value in config.items():
        print(f"  {key:<16} {value}")
    print()


def print_event(event: Event, total: int) -> None:
    label = f"{event.kind:<5} {event.number:>2}/{total}"
    if event.failover is None:
        print(f"  {label} {event.victim}: FAILED: {event.error}", flush=True)
        return
    if event.catch_up_first is None:
        wait = "election not logged"
    elif event.catch_up_first:
        wait = "a catch-up"
    else:
        wait = f"waited {_ms(event.fire_wait)} for it"
    line = (
        f"  {label} {event.victim} -> {event.successor}: failover {_ms(event.failover)}"
        f" (elected {_ms(event.elected)}; first fire {event.first_fire}: {wait};"
        f" {event.caught_up} due at election)"
    )
    if event.kind == "pause":
        stood = "yes" if event.stood_down else "NO"
        down = _ms(event.stood_down_after) if event.stood_down_after is not None else "not logged"
        line += (
            f"; resumed after {_ms(event.paused_for)}, stood down after {down},"
            f" late fires {len(event.late_fires)}: stood down: {stood}"
        )
        if event.error:
            line += f"; {event.error}"
    print(line, flush=True)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


ROWS = (
    ("failover p50 (ms)", "failover", "p50_ms"),
    ("failover p90 (ms)", "failover", "p90_ms"),
    ("failover max (ms)", "failover", "max_ms"),
    ("failover min (ms)", "failover", "min_ms"),
    ("  elected (its 'leads' log) p50 (ms)", "elected", "p50_ms"),
    ("  elected (its 'leads' log) max (ms)", "elected", "max_ms"),
    ("  election to emission p50 (ms)", "election_to_emission", "p50_ms"),
    ("  election to emission max (ms)", "election_to_emission", "max_ms"),
    ("    of which waiting for a fire p50 (ms)", "fire_wait", "p50_ms"),
    ("    of which waiting for a fire max (ms)", "fire_wait", "max_ms"),
)


def print_table(table: dict[str, dict[str, Any]], sequence: FireSequence) -> None:
    kill, pause = table["kill"], table["pause"]
    print()
    print(f"{'figure':<40} {'kill -9':>10} {'pause':>10}")
    for label, group, key in ROWS:
        print(f"{label:<40} {_cell(kill[group][key])} {_cell(pause[group][key])}")
    catch_ups = f"{kill['catch_up_first']:>10} {pause['catch_up_first']:>10}"
    print(f"{'first emission was a catch-up':<40} {catch_ups}")
    print(f"{'rounds (failed)':<40} {_count(kill):>10} {_count(pause):>10}")
    print()
    print(
        f"Fires: {sequence.fires} distinct fires in {sequence.emissions} emissions,"
        f" {sequence.first} to {sequence.last}; duplicates {len(sequence.duplicates)}"
        f" (harmless: same fence key), gaps {len(sequence.gaps)} (must be 0)"
    )
    if sequence.duplicates:
        shown = ", ".join(sequence.duplicates[:SHOW_DUPLICATES])
        more = len(sequence.duplicates) - SHOW_DUPLICATES
        print(f"  duplicates: {shown}{f' and {more} more' if more > 0 else ''}")
    if sequence.gaps:
        print(f"  GAPS: {', '.join(sequence.gaps[:SHOW_DUPLICATES])}")


def _cell(value: float | None) -> str:
    return f"{'-' if value is None else f'{value:g}':>10}"


def _count(group: dict[str, Any]) -> str:
    return f"{group['rounds']} ({group['failed']})"


def print_aims(options: Options, met: Sequence[Aim], found: Sequence[str]) -> None:
    h = options.heartbeat
    print()
    print(
        f"Aims (a kill -9 closes the leader's socket at once; a paused leader's connection"
        f" is dropped by the broker 2 to 3 heartbeats, {2 * h}-{3 * h} s, after its last byte):"
    )
    for aim in met:
        verdict = "n/a" if aim.met is None else "met" if aim.met else "NOT met"
        print(f"  {aim.label:<58} {aim.figure:>16}  {verdict}")
    for problem in found:
        print(f"FAILED: {problem}")


def problems(events: Sequence[Event], sequence: FireSequence, unparsed: Sequence[str]) -> list[str]:
    found = [f"{e.kind} {e.number}: {e.error}" for e in events if e.error]
    found += [
        f"pause {e.number}: {e.victim} emitted {len(e.late_fires)} fires after t0 once resumed"
        for e in events
        if e.late_fires
    ]
    if sequence.gaps:
        found.append(f"{len(sequence.gaps)} fires never emitted (first {sequence.gaps[0]})")
    found += [f"unexpected child output: {line}" for line in unparsed[:5]]
    return found


# -- main ---------------------------------------------------------------------------------


def leader_topology(names: Names) -> Topology:
    """The election's queue and its fanout exchange (declared by each beat)."""
    leader = beat_leader_queue(names)
    return Topology(exchanges=(ExchangeSpec(leader, "fanout"),), queues=(QueueSpec(leader),))


def run(options: Options, beats: Beats) -> list[Event]:
    """Start the beats, then run the rounds; a round that cannot start (no leader
    emitting, a replacement that does not come up) ends the run as a failed round."""
    started = [beats.start(f"beat-{index}") for index in range(options.beats)]
    try:
        for child in started:
            beats.wait_ready(child)
        beats.leader()
    except Timeout as error:
        print_log_tails(beats)
        raise SystemExit(f"the beats did not start: {error}") from None
    events: list[Event] = []
    numbers: Counter[str] = Counter()
    for kind in plan(options.kills, options.pauses):
        numbers[kind] += 1
        step = kill_round if kind == "kill" else pause_round
        try:
            event = step(beats, numbers[kind])
        except Timeout as error:
            event = Event(kind, numbers[kind], "-", error=f"run aborted: {error}")
        print_event(event, options.kills if kind == "kill" else options.pauses)
        events.append(event)
        if event.error:
            print_log_tails(beats)
        if event.error and event.error.startswith("run aborted"):
            break
    time.sleep(SETTLE)
    return events


def print_log_tails(beats: Beats) -> None:
    for child in beats.current.values():
        tail = child.log_tail().replace("\n", "\n      ")
        print(f"    {child.name} log tail:\n      {tail}", flush=True)


def bench(options: Options, url: str, node: RabbitNode | None) -> tuple[dict[str, Any], bool]:
    namespace = f"bfail{secrets.token_hex(4)}"
    app = build_app(namespace, options.interval)
    topology = app.topology() + leader_topology(app.names)
    admin = Admin(url)
    try:
        config = describe_config(options, url, node, admin, namespace)
        print_config(config)
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as workdir:
            beats = Beats(url, options, namespace, Path(workdir))
            open_store(beats.store_url).close()  # the schema, before the beats race for it
            try:
                events = run(options, beats)
            finally:
                beats.stop_all()
            emits = list(beats.emits)
            unparsed = list(beats.unparsed)
    finally:
        admin.delete(topology)
        admin.close()
    table = figures(events)
    sequence = check_sequence(emits, options.interval)
    met = aims(options, table, events)
    found = problems(events, sequence, unparsed)
    print_table(table, sequence)
    print_aims(options, met, found)
    result = {
        "config": config,
        "kill": table["kill"],
        "pause": table["pause"],
        "events": [_event_json(event) for event in events],
        "fires": asdict(sequence),
        "aims_met": {aim.label: aim.met for aim in met},
        "problems": found,
    }
    return result, not found


def _event_json(event: Event) -> dict[str, Any]:
    row = asdict(event)
    for key in ("failover", "elected", "fire_wait", "paused_for", "stood_down_after"):
        row[f"{key}_ms"] = ms(row.pop(key))
    row["stood_down"] = event.stood_down
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    options = options_from(args)
    with broker(options.url) as (url, node):
        result, ok = bench(options, url, node)
    print(json.dumps(result, sort_keys=False))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
