"""What every peer shares: the record file its handlers write, the worker process
(its own session, so that its whole tree can be measured and stopped), and what a
peer provides (its family, its lanes, its publishers)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from bench.common import REPO, Admin, child_env

#: The environment variable naming the record file of a worker's handlers.
RECORD_ENV = "BENCH_RECORD"
POLL_S = 0.005
STOP_TIMEOUT = 20.0


# -- the record file ----------------------------------------------------------------------


class RecordWriter:
    """Appends ``"<seq> <time.time()>"`` per job; reopened in each (forked) process.

    One ``write(2)`` of a short line on an ``O_APPEND`` descriptor is atomic, so the
    processes and threads of a worker can share the file without a lock."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = 0

    def record(self, seq: int) -> None:
        now = time.time()  # first: the job's start, not the write's
        if self._pid != os.getpid():
            self._fd = os.open(os.environ[RECORD_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            self._pid = os.getpid()
        assert self._fd is not None
        os.write(self._fd, f"{seq} {now:.6f}\n".encode())


record = RecordWriter().record


@dataclass
class RecordReader:
    """The parent's view of a record file: each seq's first start, and duplicates."""

    path: Path
    starts: dict[int, float] = field(default_factory=dict)
    duplicates: int = 0
    #: Distinct jobs of ``expected`` started (warm-up jobs and earlier phases aside).
    found: int = 0
    expected: range = range(0)
    _offset: int = 0
    _partial: bytes = b""

    def poll(self) -> int:
        """Read what was appended since the last poll; the number of distinct jobs."""
        with contextlib.suppress(FileNotFoundError), self.path.open("rb") as stream:
            stream.seek(self._offset)
            chunk = stream.read()
            self._offset += len(chunk)
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                seq, moment = line.split()
                number = int(seq)
                if number in self.starts:
                    self.duplicates += 1
                    continue
                self.starts[number] = float(moment)
                if number in self.expected:
                    self.found += 1
        return self.found

    def expect(self, seqs: range) -> None:
        """Count the jobs of ``seqs`` from now on (those already started included)."""
        self.expected = seqs
        self.found = sum(1 for seq in seqs if seq in self.starts)

    def among(self, seqs: range) -> list[float]:
        return [self.starts[seq] for seq in seqs if seq in self.starts]


# -- the worker process -------------------------------------------------------------------


class WorkerDiedError(RuntimeError):
    """The worker process exited while the bench waited for its jobs."""


@dataclass
class WorkerProcess:
    """A peer's worker command in its own session; its record file and log in ``workdir``."""

    name: str
    argv: Sequence[str]
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name.replace(' ', '_')}.log"

    @property
    def records(self) -> Path:
        return self.workdir / f"{self.name.replace(' ', '_')}.records"

    def start(self) -> RecordReader:
        self.records.unlink(missing_ok=True)
        env = child_env({**self.env, RECORD_ENV: str(self.records)})
        with self.log.open("wb") as output:
            self.process = subprocess.Popen(
                list(self.argv),
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return RecordReader(self.records)

    def check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise WorkerDiedError(
                f"{self.name} exited ({self.process.returncode}):\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 25) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def rss_bytes(self) -> int:
        """VmRSS summed over the worker's process tree (its session's processes)."""
        assert self.process is not None
        return sum(vm_rss(pid) for pid in session_pids(self.process.pid))

    def stop(self) -> None:
        """SIGTERM to the whole session (each peer's warm shutdown), SIGKILL if it hangs."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        # Pool children may outlive their parent by a moment; they hold no jobs by now.
        for pid in session_pids(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def session_pids(session: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # The comm field may hold spaces: the fields after its closing parenthesis.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:  # field 6 of stat(5): the session id
                found.append(int(entry.name))
    return found


def vm_rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def wait_for_jobs(reader: RecordReader, seqs: range, worker: WorkerProcess, timeout: float) -> bool:
    """Until every job of ``seqs`` started; False after ``timeout``."""
    deadline = time.monotonic() + timeout
    reader.expect(seqs)
    while True:
        if reader.poll() >= len(seqs):
            return True
        worker.check_alive()
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)


@contextlib.contextmanager
def running(worker: WorkerProcess) -> Iterator[RecordReader]:
    try:
        yield worker.start()
    finally:
        worker.stop()


def python_command(*args: str) -> list[str]:
    return [sys.executable, *args]


# -- what a peer provides -----------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One worker configuration of a peer, e.g. Celery's solo pool or Dramatiq 2x8."""

    name: str
    family: str
    processes: int = 1
    threads: int = 8
    pool: str = ""
    store: str = "memory"
    #: Only the consume workload (the ledger's cost rows): not every workload.
    consume_only: bool = False


class PublisherLike(Protocol):
    def publish(self, seq: int, delay: float | None = None) -> None:
        """One confirmed publish: returns once the broker confirmed it."""

    def publish_batch(self, seqs: range) -> None:
        """Every job confirmed, batched (only where the family has a batched confirm)."""

    def close(self) -> None: ...


class Lane(Protocol):
    """One peer's fresh queue (and whatever the peer declares with it) for one round."""

    queue: str

    def publisher(self) -> PublisherLike: ...

    def fill(self, seqs: range) -> None:
        """Put these jobs in the queue, fast (untimed): before a consume."""

    def worker(self, variant: Variant, workdir: Path) -> WorkerProcess: ...

    def cleanup(self) -> None: ...


class Family(Protocol):
    name: str
    #: None when supported, else why not ("n/a: ...").
    batch_na: str | None
    delay_na: str | None

    def queue_type_na(self, queue_type: str) -> str | None: ...

    def lane(self, url: str, queue_type: str) -> Lane: ...

    def settings(self) -> dict[str, str]:
        """How each workload is configured, citing the peer's own setting names."""


class FamilyBase:
    """What a family supports unless it says otherwise: batched confirms, delayed
    delivery and both queue types."""

    batch_na: str | None = None
    delay_na: str | None = None

    def queue_type_na(self, queue_type: str) -> str | None:
        return None


@dataclass
class OwnQueueLane:
    """A lane on a queue of the peer's own, ``bcmp-<PREFIX>-<hex>``: named here,
    declared by the peer's :meth:`declare`, deleted by :meth:`cleanup`."""

    url: str
    queue_type: str
    queue: str = ""
    PREFIX: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.queue = f"bcmp-{self.PREFIX}-{secrets.token_hex(4)}"
        self.declare()

    def declare(self) -> None: ...

    def owned(self) -> tuple[list[str], list[str]]:
        """The queues and exchanges the lane declared: what :meth:`cleanup` deletes."""
        return [self.queue], []

    def cleanup(self) -> None:
        with Admin(self.url) as admin:
            admin.delete_named(*self.owned())
