"""Worker processes of the real command line, for the benches that break things.

``bench.recovery`` and ``bench.faults`` run ``broker-jobs worker`` as an operator
would: a process each, its stderr read line by line by a thread of its own and parsed
into log records (the text format's ``asctime level logger: message``), its stdout
(the outcome counts printed at exit) kept in a file. They also write the app those
workers load as a module in the run's temp dir: :func:`write_app`.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

from broker_jobs import App

LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (\S+): (.*)$")
#: The worker command line, without its options: this interpreter, this checkout.
WORKER_COMMAND = (sys.executable, "-c", "from broker_jobs.cli import main; main()", "worker")


@functools.cache
def worker_has_option(option: str) -> bool:
    """Does this checkout's ``broker-jobs worker`` take ``option`` (in its ``--help``)?"""
    shown = subprocess.run(
        [*WORKER_COMMAND, "--help"], check=False, capture_output=True, text=True, timeout=60
    )
    return option in shown.stdout


def write_app(workdir: Path, module: str, source: str) -> App:
    """Write ``source`` as ``workdir/<module>.py`` (what the workers load as
    ``<module>:app``, run from ``workdir``) and load it here too: its ``app``."""
    path = workdir / f"{module}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None
    assert spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    app = loaded.app
    assert isinstance(app, App)
    return app


@dataclass
class Record:
    """One log record of a worker: its first line and any lines that followed it."""

    at: float  # the log line's own time (asctime), else when it was read
    level: str  # "?" for output that is not a log line
    message: str
    more: list[str] = field(default_factory=list)

    def expected(self, warnings: Sequence[str]) -> bool:
        """INFO, or a WARNING starting with one of ``warnings``, without a traceback."""
        if any("Traceback" in line for line in self.more):
            return False
        if self.level == "INFO":
            return True
        return self.level == "WARNING" and self.message.startswith(tuple(warnings))


@dataclass(eq=False)
class WorkerProcess:
    """One ``broker-jobs worker`` process; :attr:`records` fill as it logs."""

    name: str
    process: subprocess.Popen[bytes]
    stdout_path: Path
    records: list[Record] = field(default_factory=list)
    reader: threading.Thread | None = None

    @classmethod
    def spawn(cls, name: str, args: Sequence[str], workdir: Path) -> WorkerProcess:
        """Start ``broker-jobs worker ARGS`` in ``workdir`` (where the app module is);
        stdout goes to ``workdir/<name>.stdout`` (a restarted worker appends)."""
        stdout_path = workdir / f"{name}.stdout"
        with stdout_path.open("ab") as stdout:
            process = subprocess.Popen(
                [*WORKER_COMMAND, *args],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.PIPE,
            )
        worker = cls(name, process, stdout_path)
        assert process.stderr is not None
        worker.reader = threading.Thread(target=worker._read, args=(process.stderr,), name=name)
        worker.reader.daemon = True
        worker.reader.start()
        return worker

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def pid(self) -> int:
        return self.process.pid

    def first(self, fragment: str, after: float) -> Record | None:
        return next((r for r in list(self.records) if r.at > after and fragment in r.message), None)

    def _read(self, stream: IO[bytes]) -> None:
        with stream:  # closed at the process's end, not left to the garbage collector
            for raw in stream:
                self._take(raw)

    def _take(self, raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip("\n")
        found = LOG_LINE.match(line)
        if found is None:  # a traceback's or a wrapped message's continuation
            if self.records and self.records[-1].level != "?":
                self.records[-1].more.append(line)
            else:
                self.records.append(Record(time.time(), "?", line))
            return
        stamp, level, _logger, message = found.groups()
        try:
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            at = time.time()
        self.records.append(Record(at, level, message))


def stop_workers(workers: Sequence[WorkerProcess], timeout: float) -> dict[str, int | None]:
    """SIGTERM each worker still running; their exit codes (None: still running after
    ``timeout`` s, then killed)."""
    for worker in workers:
        if worker.alive:
            worker.process.send_signal(signal.SIGTERM)
    codes: dict[str, int | None] = {}
    deadline = time.monotonic() + timeout
    for worker in workers:
        try:
            codes[worker.name] = worker.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[worker.name] = None
            worker.process.kill()
            worker.process.wait()
    for worker in workers:  # the reader threads take the last lines
        if worker.reader is not None:
            worker.reader.join(timeout=5)
    return codes
