"""The beat processes of one ``bench.failover`` run and the lines they print."""

from __future__ import annotations

import contextlib
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import NamedTuple, TextIO, TypeVar

from bench.common import REPO
from bench.failover.options import Options

T = TypeVar("T")

#: Seconds a child has to start (imports, declaring the topology, joining).
START_TIMEOUT = 30.0
#: The leader's latest emission must be this recent (seconds) for it to count as leading.
RECENT = 1.0


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
