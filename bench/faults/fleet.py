"""The worker processes of a scenario: slots that can be killed and restarted."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.faults.harness import EXPECTED_WARNINGS, ScenarioError
from bench.workers import WORKER_COMMAND, Record, WorkerProcess, stop_workers

#: Seconds for the workers to consume after their start.
READY_TIMEOUT = 60.0
#: Seconds for the workers to exit after SIGTERM (they get --grace 5).
STOP_TIMEOUT = 30.0
#: A supervised slot is restarted at most this many times after exits of its own.
MAX_RESTARTS = 20
#: Distinct worker log messages (not INFO) kept per scenario.
NOTABLE = 12
#: Worker processes per scenario.
WORKERS = 2


# -- the workers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Exit:
    """A worker process that ended: killed by the scenario, or on its own."""

    at: float
    name: str
    pid: int
    code: int | None
    killed: bool


class Fleet:
    """``count`` worker slots (``w1``, ``w2``...), each one ``broker-jobs worker`` process
    at a time. :meth:`kill` is ``kill -9`` of one and its restart; with ``supervise`` a
    process that exits on its own is restarted too (as systemd would), and counted."""

    def __init__(
        self, workdir: Path, args: Sequence[str], count: int = WORKERS, *, supervise: bool = True
    ) -> None:
        self.workdir, self.args, self.count, self.supervise = workdir, list(args), count, supervise
        self.slots: list[WorkerProcess] = []
        self.every: list[WorkerProcess] = []
        self.exits: list[Exit] = []
        self._seen: set[int] = set()
        self._restarts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tend, name="fleet", daemon=True)

    @property
    def command(self) -> str:
        return " ".join(["broker-jobs", *WORKER_COMMAND[3:], *self.args])

    def start(self) -> None:
        with self._lock:
            self.slots = [self._spawn(f"w{index + 1}") for index in range(self.count)]
        self._thread.start()

    def _spawn(self, name: str) -> WorkerProcess:
        worker = WorkerProcess.spawn(name, self.args, self.workdir)
        self.every.append(worker)
        return worker

    def kill(self, index: int) -> Exit:
        """SIGKILL slot ``index``'s process, wait for it, start a new one there."""
        with self._lock:
            worker = self.slots[index]
            at = time.time()
            worker.process.kill()
            code = worker.process.wait(timeout=10)
            ended = Exit(at, worker.name, worker.pid, code, killed=True)
            self.exits.append(ended)
            self._seen.add(worker.pid)
            self.slots[index] = self._spawn(worker.name)
        return ended

    def _tend(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                for index, worker in enumerate(self.slots):
                    code = worker.process.poll()
                    if code is None or worker.pid in self._seen:
                        continue
                    self._seen.add(worker.pid)
                    self.exits.append(Exit(time.time(), worker.name, worker.pid, code, False))
                    if self.supervise and self._restarts[worker.name] < MAX_RESTARTS:
                        self._restarts[worker.name] += 1
                        self.slots[index] = self._spawn(worker.name)

    @property
    def kills(self) -> list[Exit]:
        return [e for e in self.exits if e.killed]

    @property
    def unexpected(self) -> list[Exit]:
        return [e for e in self.exits if not e.killed]

    def ended_at(self, pid: int) -> float | None:
        return next((e.at for e in self.exits if e.pid == pid), None)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every slot's current process logged that it consumes."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                current = list(self.slots)
            if all(w.alive and w.first(" consuming ", 0.0) for w in current):
                return
            if time.monotonic() > deadline:
                tails = [f"{w.name}: {r.message}" for w in current for r in w.records[-3:]]
                raise ScenarioError(
                    f"the workers did not consume within {timeout:g} s: " + " | ".join(tails)
                )
            time.sleep(0.05)

    def stop(self) -> dict[str, int | None]:
        """Stop tending, SIGTERM the current processes: their exit codes."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._lock:
            current = list(self.slots)
        codes = stop_workers(current, STOP_TIMEOUT)
        for worker in current:
            self._seen.add(worker.pid)
        return codes

    def kill_all(self) -> None:
        """The last resort of a cleanup: SIGKILL whatever still runs."""
        self._stop.set()
        for worker in self.every:
            if worker.alive:
                with contextlib.suppress(OSError):
                    worker.process.kill()
                with contextlib.suppress(Exception):
                    worker.process.wait(timeout=10)

    def records(self) -> list[tuple[str, Record]]:
        return [(w.name, r) for w in self.every for r in list(w.records)]

    def outcomes(self) -> dict[str, int]:
        """The outcome counts every process printed at its exit, added up."""
        total: Counter[str] = Counter()
        for path in sorted({w.stdout_path for w in self.every}):
            with contextlib.suppress(OSError):
                for name, count in re.findall(r"([\w-]+): (\d+)", path.read_text()):
                    total[name] += int(count)
        return dict(total)


#: What varies between two records of one kind: ids, keys, holders, numbers.
FOLDS = (
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<id>"),
    (re.compile(r"\b[tpo]\d{7}\b"), "<key>"),
    (re.compile(r"\b[\w.-]+:\d+:[0-9a-f]+(#\d+)?"), "<holder>"),
    (re.compile(r"\d+(\.\d+)?"), "N"),
)


def fold(message: str) -> str:
    for pattern, replacement in FOLDS:
        message = pattern.sub(replacement, message)
    return message


def notable_records(records: Sequence[tuple[str, Record]]) -> dict[str, Any]:
    """The worker log records by level, and the distinct messages above INFO (digits
    folded) with their counts: the evidence of what the workers went through."""
    levels = Counter(record.level for _name, record in records)
    messages: Counter[tuple[str, str]] = Counter()
    for _name, record in records:
        if record.expected(EXPECTED_WARNINGS) or record.level == "?":
            continue
        text = fold(record.message)[:300]
        tail = next((line.strip() for line in reversed(record.more) if line.strip()), "")
        messages[(record.level, f"{text}{' | ' + tail[:160] if tail else ''}")] += 1
    return {
        "levels": dict(levels),
        "notable": [
            {"level": level, "count": count, "message": message}
            for (level, message), count in messages.most_common(NOTABLE)
        ],
    }
