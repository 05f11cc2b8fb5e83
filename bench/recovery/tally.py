"""The end of ``bench.recovery``: every confirmed job ran, none twice."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.common import Admin
from bench.effects import Effects
from bench.load import Load
from bench.recovery.rounds import TASK, Round

#: Seconds at the end for every confirmed job to run.
DRAIN_TIMEOUT = 60.0


@dataclass
class Tally:
    attempted: int
    published: int  # confirmed
    not_published: int
    ran_not_published: int  # keys whose publish failed (outcome unknown) that ran anyway
    ran: int  # distinct keys run
    runs: int  # effect rows
    lost: list[str]
    twice: list[str]
    unknown: list[str]  # keys run that were never published at all
    drain_s: float
    queue_left: int | None
    dead_letters: int | None


def drain(load: Load, effects: Effects) -> float:
    """Wait until every confirmed key ran (bounded); the seconds it took."""
    started = time.monotonic()
    with load.lock:
        wanted = set(load.confirmed)
    while time.monotonic() - started < DRAIN_TIMEOUT:
        if effects.count() >= len(wanted) and wanted <= set(effects.runs()):
            break
        time.sleep(0.25)
    return time.monotonic() - started


def tally(
    load: Load, effects: Effects, rounds: Sequence[Round], drain_s: float, admin: Admin | None
) -> Tally:
    runs = effects.runs()
    with load.lock:
        confirmed = dict(load.confirmed)
        failed = {key: at for key, at in load.failed.items() if key not in confirmed}
    for record in rounds:
        record.not_published = sum(
            record.killed_at <= at < (record.published_again_at or record.killed_at + 60)
            for at in failed.values()
        )
        if record.up_at is not None:
            record.carried_over = sum(
                confirmed_at < record.killed_at and runs.get(key, [0.0])[0] > record.up_at
                for key, confirmed_at in confirmed.items()
            )
    queue_left = dead = None
    if admin is not None:
        names = load.app.names
        with contextlib.suppress(Exception):
            queue_left = admin.depth(names.task_queue(TASK))
            dead = admin.depth(names.dead_letter_queue(TASK))
    return Tally(
        attempted=load.attempted,
        published=len(confirmed),
        not_published=len(failed),
        ran_not_published=sum(key in runs for key in failed),
        ran=len(runs),
        runs=sum(len(times) for times in runs.values()),
        lost=sorted(key for key in confirmed if key not in runs),
        twice=sorted(key for key, times in runs.items() if len(times) > 1),
        unknown=sorted(key for key in runs if key not in confirmed and key not in failed),
        drain_s=drain_s,
        queue_left=queue_left,
        dead_letters=dead,
    )
