"""The rounds of ``bench.failover``: kill -9 or pause the leader, time its successor."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bench.failover.beats import Beats, Child, Emit, Timeout

#: Seconds the leader keeps emitting alone before a round (after a replacement is up).
SETTLE = 0.7
#: Seconds a resumed leader has to log that it stands down.
STAND_DOWN_TIMEOUT = 5.0
#: After a resumed leader stood down, seconds more to catch a late emission from it.
LATE_EMIT_GRACE = 1.0


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


def strike(beats: Beats, kind: str, number: int, signum: int) -> tuple[Child, Event, float]:
    """Once the leader is settled, send it ``signum`` at t0 and wait for another beat's
    first emission: the leader, the round's event so far, and t0."""
    leader = settle(beats)
    event = Event(kind, number, leader.name)
    t0 = time.time()
    os.kill(leader.process.pid, signum)
    leader.paused = signum == signal.SIGSTOP
    within = 3 * beats.options.heartbeat + 10
    try:
        first = beats.wait_for(lambda: beats.first_emit_after(t0, leader), within, "new leader")
        note_successor(event, t0, first)
    except Timeout as error:
        event.error = str(error)
    return leader, event, t0


def kill_round(beats: Beats, number: int) -> Event:
    leader, event, t0 = strike(beats, "kill", number, signal.SIGKILL)
    leader.process.wait(timeout=10)
    replacement = beats.start(leader.identity)
    beats.wait_ready(replacement)
    count_caught_up(beats, event, t0)
    return event


def pause_round(beats: Beats, number: int) -> Event:
    leader, event, t0 = strike(beats, "pause", number, signal.SIGSTOP)
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
