"""One beat process of ``bench.failover`` (``python -m bench.failover --child``): the
real ``scheduler.Beat``, as ``broker-jobs beat`` runs it, reporting on its stdout."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime

from bench.failover.app import build_app
from broker_jobs.envelope import Job
from broker_jobs.observe.logs import configure_logging
from broker_jobs.store.urls import open_store
from scheduler import Beat, BeatSettings, Schedule, load_schedules


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
