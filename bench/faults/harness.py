"""What every fault scenario shares: nodes, app, ledger, workers, loads, drain, tally.

A scenario opens a :class:`Run` (a fresh namespace, ledger and temp dir), starts a
:class:`Fleet` of worker processes and one :class:`~bench.load.Load` per task,
breaks something, marks the fault's end (:meth:`Run.fault`), stops the loads, waits
until every confirmed job is accounted for (:meth:`Run.drain`, bounded) and returns
:meth:`Run.finish`: one summary with the figures the suite judges.
"""

from __future__ import annotations

import contextlib
import json
import string
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

from bench.effects import Effects
from broker_jobs.store.base import Execution, Status
from broker_jobs.store.urls import open_store
from broker_jobs.testing.postgres_node import PostgresNode
from broker_jobs.testing.rabbit_node import RabbitNode, RabbitNodeError
from topology import names as n

TX, PLAIN, OVERRUN = "faults.tx", "faults.plain", "faults.overrun"
#: The handlers that succeed: none of their jobs may be dead-lettered.
HEALTHY = (TX, PLAIN)
#: Each task's key prefix (keys are unique across tasks: one ledger record per key).
PREFIXES = {TX: "t", PLAIN: "p", OVERRUN: "o"}
SQLITE, POSTGRES = "sqlite", "postgres"
STORES = (SQLITE, POSTGRES)
APP_MODULE = "faults_app"
CONCURRENCY = 4

#: The overrunning task: a 1 s time limit, 2 attempts, a handler sleeping 3 s.
OVERRUN_LIMIT, OVERRUN_SLEEP, OVERRUN_ATTEMPTS, OVERRUN_BASE_DELAY = 1.0, 3.0, 2, 0.2


#: Worker WARNINGs that are part of the faults themselves (not listed as notable).
EXPECTED_WARNINGS = (
    "lost the broker at ",
    "no broker yet: ",
    "still no broker after ",
    f"task {TX} has no time limit",
)

APP_SOURCE = string.Template('''\
"""The app of one bench.faults scenario (written by bench/faults/harness.py)."""

import contextlib
import os
import time
import uuid

from pydantic import BaseModel

from broker_jobs import App, RetryPolicy


class Key(BaseModel):
    key: str


app = App(namespace=$namespace)


def _append(path, line):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write(2) with O_APPEND: lines never interleave
    finally:
        os.close(fd)


@contextlib.contextmanager
def _logged(path, key):
    """An S line when the run starts, an E line when it ends (however it ends)."""
    run = uuid.uuid4().hex[:12]
    _append(path, f"S {run} {key} {os.getpid()} {time.time():.6f}\\n")
    try:
        yield
    finally:
        _append(path, f"E {run} {key} {os.getpid()} {time.time():.6f}\\n")


@app.task($tx, transactional=True)
def tx(payload: Key, db) -> None:
    """The effect commits in the store's transaction, with the job's success."""
    db.execute($insert, (payload.key, time.time(), os.getpid()))


@app.task($plain, time_limit=60)
def plain(payload: Key) -> None:
    """The effect is the E line, written before the success is recorded."""
    with _logged($plain_log, payload.key):
        pass


@app.task(
    $overrun,
    time_limit=$limit,
    retry=RetryPolicy(max_attempts=$attempts, base_delay=$base_delay),
)
def overrun(payload: Key) -> None:
    """Sleeps past its time limit, in time.sleep (no exception lands before it returns)."""
    with _logged($overrun_log, payload.key):
        time.sleep($sleep)
''')


class ScenarioError(Exception):
    """The scenario could not go on (workers not consuming, a node not starting...)."""


class ScenarioSkipped(Exception):
    """The scenario cannot run here (a cluster that does not form, no root...)."""


@dataclass(frozen=True)
class Settings:
    """The command line's sizes: ``--quick`` and ``--jobs`` (per handler kind)."""

    quick: bool
    jobs: int | None = None

    def jobs_for(self, quick: int, full: int) -> int:
        return self.jobs if self.jobs is not None else self.pick(quick, full)

    def pick(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full


# -- the nodes ----------------------------------------------------------------------------


class Env:
    """The nodes scenarios share, started on first use: one RabbitMQ node, one
    PostgreSQL cluster (both throwaway; PostgreSQL with its durable defaults). A scenario that
    kills one brings it back; one left down is started again on the next use."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._rabbit: RabbitNode | None = None
        self._postgres: PostgresNode | None = None

    def rabbit(self) -> RabbitNode:
        if self._rabbit is None:
            if not RabbitNode.available():
                raise ScenarioSkipped("no local rabbitmq-server (apt-get install rabbitmq-server)")
            self._rabbit = self._fresh_rabbit()
        elif not self._rabbit.running:  # left down by a scenario that failed
            try:
                self._rabbit.start()
            except Exception:
                with contextlib.suppress(Exception):
                    self._rabbit.cleanup()
                self._rabbit = None
                return self.rabbit()
        return self._rabbit

    def _fresh_rabbit(self) -> RabbitNode:
        # Ports are picked free, but another process (a parallel test run) may take one
        # before the node binds it: a second node on fresh ports is the cure.
        try:
            return self._started_rabbit("rabbit")
        except RabbitNodeError as first:
            print(f"  the node did not boot ({first}); once more on fresh ports", flush=True)
            return self._started_rabbit("rabbit-again")

    def _started_rabbit(self, name: str) -> RabbitNode:
        node = RabbitNode.create(self.base / name)
        print(f"  starting a throwaway RabbitMQ node ({node.nodename})", flush=True)
        try:
            node.start()
        except RabbitNodeError:
            with contextlib.suppress(Exception):
                node.cleanup()
            raise
        return node

    def postgres(self) -> PostgresNode:
        if self._postgres is None:
            if not PostgresNode.available():
                raise ScenarioSkipped("no local PostgreSQL server (apt-get install postgresql)")
            # Durable: the scenarios kill it, and a fast node (fsync and synchronous
            # commits off) loses commits it acknowledged, so jobs acked after them.
            self._postgres = PostgresNode.create(self.base / "postgres", durable=True)
            print(f"  starting a throwaway PostgreSQL (port {self._postgres.port})", flush=True)
            self._postgres.start()
        elif not self._postgres.running:
            self._postgres.start()
        return self._postgres

    def close(self) -> None:
        for node in (self._rabbit, self._postgres):
            if node is not None:
                with contextlib.suppress(Exception):
                    node.cleanup()


@contextlib.contextmanager
def environment(base: Path | None = None) -> Iterator[Env]:
    """An :class:`Env` in ``base`` (default: a temp dir), its nodes removed at the end."""
    with contextlib.ExitStack() as stack:
        if base is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-faults-")))
        env = Env(base)
        stack.callback(env.close)
        yield env


# -- what the handlers left ----------------------------------------------------------------


class Ledger:
    """The workers' store and the transactional handler's ``effects`` table in it."""

    def __init__(self, kind: str, where: Path, dsn: str | None) -> None:
        self.kind = kind
        self.effects = Effects(where, dsn if kind == POSTGRES else None, prefix="bjfaults")

    @property
    def store_url(self) -> str:
        return self.effects.store_url

    def create(self) -> None:
        self.effects.create()
        open_store(self.store_url).close()  # the schema, before the workers race for it

    def counts(self) -> dict[str, int]:
        with open_store(self.store_url) as store:
            return {status.value: count for status, count in store.counts().items() if count}

    def statuses(self, keys: Sequence[str]) -> Counter[str]:
        with open_store(self.store_url) as store:
            found = Counter[str]()
            for key in keys:
                record = store.get(key)
                found[record.status.value if record else "none"] += 1
            return found

    def executions(self, keys: Sequence[str]) -> dict[str, list[Execution]]:
        with open_store(self.store_url) as store:
            return {key: store.executions(key) for key in keys}

    def keys(self, status: Status, limit: int) -> list[str]:
        with open_store(self.store_url) as store:
            return [record.idempotency_key for record in store.find(status=status, limit=limit)]

    def explain(self, keys: Sequence[str]) -> dict[str, Any]:
        """What the ledger says of ``keys``: each record and its executions."""
        found: dict[str, Any] = {}
        with open_store(self.store_url) as store:
            for key in keys:
                record = store.get(key)
                found[key] = (
                    None
                    if record is None
                    else {
                        "job_id": record.job_id,
                        "status": record.status.value,
                        "attempts": record.attempts,
                        "worker": record.worker,
                        "lease_until": record.lease_until,
                        "last_error": (record.last_error or "")[:200] or None,
                        "executions": [
                            f"{e.worker} {e.started_at:%H:%M:%S.%f} -> {e.outcome or 'running'}"
                            for e in store.executions(key)
                        ],
                    }
                )
        return found

    def drop(self) -> None:
        self.effects.drop()


@dataclass
class HandlerRun:
    """One run of a logged handler: its S line and, once it ended, its E line."""

    run: str
    key: str
    pid: int
    started: float
    ended: float | None = None


class RunLog:
    """The file a logged handler appends its S and E lines to (every process)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def runs(self) -> list[HandlerRun]:
        found: dict[str, HandlerRun] = {}
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) != 5:
                continue  # a line being written right now
            mark, run, key, pid, moment = parts
            if mark == "S":
                found[run] = HandlerRun(run, key, int(pid), float(moment))
            elif mark == "E" and run in found:
                found[run].ended = float(moment)
        return list(found.values())

    def by_key(self) -> dict[str, list[HandlerRun]]:
        keyed: dict[str, list[HandlerRun]] = {}
        for run in sorted(self.runs(), key=lambda r: r.started):
            keyed.setdefault(run.key, []).append(run)
        return keyed

    def ended(self) -> dict[str, int]:
        """Finished runs per key: the effects."""
        return dict(Counter(run.key for run in self.runs() if run.ended is not None))

    def first_end_after(self, moment: float) -> float | None:
        """The earliest end of a run that started after ``moment`` (one already
        running then, say when a broker died, does not show the service back)."""
        return min((r.ended for r in self.runs() if r.ended and r.started > moment), default=None)


# -- the broker's side ---------------------------------------------------------------------


@dataclass(frozen=True)
class DeadLetter:
    key: str
    reason: str


def dead_letters(url: str, queue: str) -> list[DeadLetter]:
    """Every message in ``queue``, read without removing any (they go back when the
    connection closes): its key and reason (ours, else the broker's x-death reason)."""
    parameters = pika.URLParameters(url)
    parameters.socket_timeout = 10
    connection = pika.BlockingConnection(parameters)
    found: list[DeadLetter] = []
    try:
        channel = connection.channel()
        while len(found) < 1_000_000:
            method, properties, _body = channel.basic_get(queue, auto_ack=False)
            if method is None or properties is None:
                break
            headers = properties.headers or {}
            reason = headers.get(n.HEADER_DEAD_REASON)
            if reason is None:
                deaths = headers.get("x-death") or [{}]
                reason = f"broker {deaths[0].get('reason', '?')}"
            key = headers.get(n.HEADER_IDEMPOTENCY_KEY) or properties.message_id or "?"
            found.append(DeadLetter(str(key), str(reason)))
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.close()
    return found


# -- the output ------------------------------------------------------------------------------


def dumps(value: Any) -> str:
    return json.dumps(value, default=str)
