"""Supervising child worker processes: ``broker-jobs worker --processes N``.

A worker is one Python process, so one core at most; the supervisor runs N of them
and keeps them running. It does no AMQP and opens no store: each child opens its own
broker connection and store handle after it started.

Children are started with multiprocessing's "spawn" context rather than forked: a
spawned child is a fresh interpreter that imports what it needs, so it inherits no
event loop, pika/aio-pika socket, sqlite3 connection or thread of the parent (a fork
would copy them half-alive). The child runs ``target(index)``, a picklable callable
given the parsed options, so nothing is rendered back into a command line (and no
password shows up in a child's argv that was not in the supervisor's).

Rules (docs/worker.md, *Processes*):

- a child exiting 0 (``--burst`` drained) is done, not restarted;
- exit 69 (a consumer cancelled by the broker: its queue was deleted) is not restarted
  either: a new child would meet the same missing queue;
- exit 1 within :data:`STARTUP_WINDOW` seconds of its start is a configuration error
  (bad app, store URL, topology conflict) that every child meets: the supervisor stops
  the others and exits 1 instead of restarting it;
- any other exit (a crash, exit 75 after ``--reconnect-timeout``, a signal such as
  kill -9 or the OOM killer) restarts the child after a backoff that doubles from
  :data:`FIRST_BACKOFF` to :data:`MAX_BACKOFF` and is reset once a child ran
  :data:`STABLE_AFTER` seconds; :data:`CRASH_LOOP_EXITS` exits within
  :data:`CRASH_LOOP_WINDOW` are reported by one ERROR line, the restarts go on at
  the backoff's pace;
- SIGTERM or SIGINT is forwarded to every child (a second one too: the children then
  exit at once); what is left after ``grace`` + :data:`STOP_MARGIN` seconds is killed
  (SIGKILL, logged).

The exit code is 0 when every child's last exit was 0, else the first non-zero last
exit (a signal N counts as 128 + N; a child killed by the very signal the supervisor
forwarded counts as stopped, 0).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from broker_jobs.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: Seconds after its start within which a child's exit 1 is taken for a configuration
#: error (the worker checks its app, store and topology before it consumes).
STARTUP_WINDOW = 10.0
#: The restart backoff: first pause, its cap, and how long a child must run for the
#: pause to start again from the first.
FIRST_BACKOFF, MAX_BACKOFF, STABLE_AFTER = 1.0, 30.0, 60.0
#: This many unexpected exits of one child within the window make a crash loop.
CRASH_LOOP_EXITS, CRASH_LOOP_WINDOW = 5, 60.0
#: Seconds the supervisor waits beyond ``--grace`` before it kills what is left: a
#: child needs a moment after its grace to close its channel and store.
STOP_MARGIN = 5.0
#: The worker's exit code for a consumer cancelled by the broker (its queue deleted).
CONSUMER_CANCELLED = 69
#: What a child that the supervisor had to kill reports: 128 + SIGKILL, as a shell does.
KILLED = 128 + signal.SIGKILL

ChildTarget = Callable[[int], None]


class Verdict(Enum):
    """What an exit of a child means for the supervisor."""

    DONE = "done"  # the child's work is over: not restarted
    RESTART = "restart"  # an unexpected exit: start it again after the backoff
    STOP_ALL = "stop all"  # a configuration error every child would meet
    REPLACE = "replace"  # stopped alone (`workers stop`, a signal to it): another now


def judge_exit(code: int, ran_for: float, *, stopping: bool, burst: bool) -> Verdict:
    """The rule for one exit (``code`` as :func:`exit_status` gives it). An exit 0 is
    a drained ``--burst``; without ``burst``, only a stop of that child alone (the
    supervisor keeps its count of processes: a graceful restart of it)."""
    if code == 0 and not stopping and not burst:
        return Verdict.REPLACE
    if stopping or code in {0, CONSUMER_CANCELLED}:
        return Verdict.DONE
    if code == 1 and ran_for < STARTUP_WINDOW:
        return Verdict.STOP_ALL
    return Verdict.RESTART


def exit_status(exitcode: int | None) -> int:
    """A process's exit as a shell reports it: multiprocessing gives -N for signal N."""
    if exitcode is None:
        return 0
    return 128 - exitcode if exitcode < 0 else exitcode


def describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


def parse_processes(value: str | int) -> int:
    """``--processes``: a count of at least 1, or ``auto`` for one per CPU."""
    text = str(value).strip().lower()
    if text == "auto":
        return os.cpu_count() or 1
    try:
        count = int(text)
    except ValueError:
        raise ConfigurationError(
            f"--processes {value!r}: give a number of worker processes (1 or more) or auto"
        ) from None
    if count < 1:
        raise ConfigurationError(f"--processes {count}: at least 1 worker process is needed")
    return count


@dataclass
class Child:
    """One slot of the supervisor: the process running it now and its restart state."""

    index: int
    process: BaseProcess | None = None
    started_at: float = 0.0
    backoff: float = FIRST_BACKOFF
    restart_at: float | None = None
    unexpected_exits: deque[float] = field(default_factory=deque)
    crash_loop_reported: bool = False
    last_status: int | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.exitcode is None

    def next_backoff(self, ran_for: float) -> float:
        """The pause before the next start; doubles per exit, reset by a stable run."""
        if ran_for >= STABLE_AFTER:
            self.backoff = FIRST_BACKOFF
            self.crash_loop_reported = False
            self.unexpected_exits.clear()
        pause = self.backoff
        self.backoff = min(self.backoff * 2, MAX_BACKOFF)
        return pause

    def in_crash_loop(self, now: float) -> bool:
        self.unexpected_exits.append(now)
        while self.unexpected_exits and now - self.unexpected_exits[0] > CRASH_LOOP_WINDOW:
            self.unexpected_exits.popleft()
        return len(self.unexpected_exits) >= CRASH_LOOP_EXITS


def _child_main(target: ChildTarget, index: int) -> None:
    """Where a spawned child starts. Its own process group: a terminal's Ctrl-C goes to
    the foreground group, and a child in it would get SIGINT twice (the terminal's and
    the supervisor's), which a worker takes for "exit at once"."""
    os.setpgrp()
    target(index)


class Supervisor:
    """Runs ``processes`` children, each ``target(index)``, until they are done."""

    def __init__(
        self, target: ChildTarget, processes: int, *, grace: float, burst: bool = False
    ) -> None:
        self._target = target
        self._burst = burst
        self._children = [Child(index) for index in range(processes)]
        self._grace = grace
        self._context = multiprocessing.get_context("spawn")
        self._stopping = False
        self._stop_deadline: float | None = None
        self._stop_signal = signal.SIGTERM
        self._signals: list[int] = []
        self._statuses: list[int] = []  # last exits of children, in the order they came

    def run(self) -> int:
        """Supervise until every child is done; the exit code (module docstring)."""
        with self._signal_wakeups() as wakeup:
            for child in self._children:
                self._start(child)
            while self._running():
                self._wait(wakeup)
                self._handle_signals()
                self._reap()
                self._restart_due()
                self._kill_after_grace()
        return next((status for status in self._statuses if status != 0), 0)

    # -- the loop -----------------------------------------------------------------------

    def _running(self) -> bool:
        return any(c.alive or c.restart_at is not None for c in self._children)

    def _wait(self, wakeup: socket.socket) -> None:
        """Until a child exits, a signal comes, or the next restart or deadline is due."""
        moments = [c.restart_at for c in self._children if c.restart_at is not None]
        if self._stop_deadline is not None:
            moments.append(self._stop_deadline)
        timeout = max(0.0, min(moments) - time.monotonic()) if moments else None
        # Every child not reaped yet, alive or not: a child that died since the last
        # _reap (its exit code read by an alive check) must still wake this wait.
        sentinels = [c.process.sentinel for c in self._children if c.process is not None]
        if wakeup in wait([*sentinels, wakeup], timeout):
            with contextlib.suppress(BlockingIOError):
                wakeup.recv(4096)

    def _handle_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            first = not self._stopping
            self._stop(signal.Signals(signum))
            if not first:
                logger.warning(
                    "second %s: forwarded, the worker processes exit at once",
                    signal.Signals(signum).name,
                )

    def _reap(self) -> None:
        now = time.monotonic()
        for child in self._children:
            if child.process is not None and child.process.exitcode is not None:
                self._exited(child, now)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for child in self._children:
            if child.restart_at is not None and child.restart_at <= now:
                child.restart_at = None
                self._start(child)

    def _kill_after_grace(self) -> None:
        if self._stop_deadline is None or time.monotonic() < self._stop_deadline:
            return
        for child in self._children:
            if child.alive and child.process is not None:
                logger.warning(
                    "worker process %d (pid %s) still runs %.0f s after the stop: killed"
                    " (SIGKILL); its unacked jobs are redelivered",
                    child.index,
                    child.process.pid,
                    self._grace + STOP_MARGIN,
                )
                child.process.kill()
                child.process.join()
                child.process = None
                self._statuses.append(KILLED)
        self._stop_deadline = None

    # -- children -----------------------------------------------------------------------

    def _start(self, child: Child) -> None:
        process = self._context.Process(
            target=_child_main,
            args=(self._target, child.index),
            name=f"broker-jobs worker {child.index}",
        )
        process.start()
        child.process, child.started_at = process, time.monotonic()
        logger.info("worker process %d started (pid %s)", child.index, process.pid)

    def _exited(self, child: Child, now: float) -> None:
        process = child.process
        assert process is not None
        process.join()
        child.process = None
        ran_for = now - child.started_at
        status = self._status(process.exitcode)
        verdict = judge_exit(status, ran_for, stopping=self._stopping, burst=self._burst)
        if verdict is Verdict.RESTART:
            self._schedule_restart(child, process, ran_for, now)
            return
        if verdict is Verdict.REPLACE:
            # At once after a run of a while; one that stops as soon as it starts
            # (anything that would make each new one stop too) gets the backoff.
            pause = 0.0 if ran_for >= STARTUP_WINDOW else child.next_backoff(ran_for)
            child.restart_at = now + pause
            logger.info(
                "worker process %d (pid %s) stopped alone (`broker-jobs workers stop`, or a"
                " signal to it): starting another in %g s, to keep %d; stop this supervisor"
                " (pid %d) to stop them all",
                child.index,
                process.pid,
                pause,
                len(self._children),
                os.getpid(),
            )
            return
        self._statuses.append(status)
        if verdict is Verdict.STOP_ALL:
            logger.error(
                "worker process %d (pid %s) exited with code 1 %.1f s after its start: a"
                " configuration error (see its message above) every process would meet;"
                " stopping the others",
                child.index,
                process.pid,
                ran_for,
            )
            self._stop(signal.SIGTERM)
        elif status != 0 and not self._stopping:
            logger.warning(
                "worker process %d (pid %s) %s: not restarted (its queue is gone)",
                child.index,
                process.pid,
                describe_exit(process.exitcode),
            )

    def _status(self, exitcode: int | None) -> int:
        """Killed by the signal we forwarded: stopped as asked (the signal came before
        the worker installed its handlers)."""
        if self._stopping and exitcode == -self._stop_signal:
            return 0
        return exit_status(exitcode)

    def _schedule_restart(
        self, child: Child, process: BaseProcess, ran_for: float, now: float
    ) -> None:
        pause = child.next_backoff(ran_for)
        child.restart_at = now + pause
        logger.warning(
            "worker process %d (pid %s) %s after %.1f s; restarting it in %g s",
            child.index,
            process.pid,
            describe_exit(process.exitcode),
            ran_for,
            pause,
        )
        if child.in_crash_loop(now) and not child.crash_loop_reported:
            child.crash_loop_reported = True
            logger.error(
                "worker process %d is crash-looping: %d exits within %g s, the last one"
                " with code %d; restarting it with a backoff of up to %g s (now %g s)",
                child.index,
                len(child.unexpected_exits),
                CRASH_LOOP_WINDOW,
                exit_status(process.exitcode),
                MAX_BACKOFF,
                pause,
            )

    def _stop(self, signum: signal.Signals) -> None:
        """Forward ``signum`` to every child; the first stop also cancels the restarts
        and sets the deadline after which what is left is killed."""
        if not self._stopping:
            self._stopping, self._stop_signal = True, signum
            self._stop_deadline = time.monotonic() + self._grace + STOP_MARGIN
            for child in self._children:
                child.restart_at = None
            alive = sum(child.alive for child in self._children)
            logger.info("%s: stopping %d worker process(es)", signum.name, alive)
        for child in self._children:
            if child.alive and child.process is not None and child.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.process.pid, signum)

    @contextlib.contextmanager
    def _signal_wakeups(self) -> Iterator[socket.socket]:
        """SIGTERM and SIGINT recorded by a handler and woken on through a socket (the
        loop blocks in :func:`wait`, which a signal alone does not end)."""
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)

        def record(signum: int, _frame: FrameType | None) -> None:
            self._signals.append(signum)

        previous_fd = signal.set_wakeup_fd(writer.fileno())
        previous = {sig: signal.signal(sig, record) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield reader
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_fd)
            reader.close()
            writer.close()
