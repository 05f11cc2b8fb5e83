"""broker-jobs: the ``broker-jobs worker`` command and ``Publisher``.

The worker loads ``bench.peers.bj:app``, built from the environment the bench sets
(namespace and queue type), whose no-op task writes the record line.
"""

from __future__ import annotations

import functools
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from bench.common import Admin
from bench.workers import WORKER_COMMAND, worker_has_option
from broker_jobs import App, JobRequest, Publisher
from topology import QueueOptions

from .common import FamilyBase, Variant, WorkerProcess, record

NAME = "broker-jobs"
TASK = "bench.noop"
CONCURRENCY = 8
NAMESPACE_ENV, QUEUE_TYPE_ENV = "BENCH_BJ_NAMESPACE", "BENCH_BJ_QUEUE_TYPE"
#: ``async`` for an ``async def`` handler (run on the worker's event loop), else sync.
HANDLER_ENV = "BENCH_BJ_HANDLER"


class Seq(BaseModel):
    seq: int


def make_app(
    namespace: str, queue_type: str, *, handler: bool = False, on_loop: bool = False
) -> App:
    app = App(namespace=namespace)
    options = QueueOptions(queue_type=queue_type)  # type: ignore[arg-type]  # str -> enum
    if handler and on_loop:

        @app.task(TASK, queue=options)
        async def noop_on_loop(payload: Seq) -> None:
            record(payload.seq)

    elif handler:

        @app.task(TASK, queue=options)
        def noop(payload: Seq) -> None:
            record(payload.seq)

    else:
        app.declare(TASK, Seq, queue=options)
    return app


@functools.cache
def worker_app() -> App:
    """What ``broker-jobs worker --app bench.peers.bj:app`` loads (in the worker only)."""
    on_loop = os.environ.get(HANDLER_ENV) == "async"
    return make_app(
        os.environ[NAMESPACE_ENV], os.environ[QUEUE_TYPE_ENV], handler=True, on_loop=on_loop
    )


def __getattr__(name: str) -> App:
    # ``app`` is built on first access, so that importing this module in the bench
    # (which has no namespace in its environment) builds nothing.
    if name == "app":
        return worker_app()
    raise AttributeError(name)


class BjPublisher:
    """``Publisher.publish`` (waits for its confirm) and ``publish_many`` (one batch,
    every confirm awaited together)."""

    def __init__(self, url: str, app: App) -> None:
        self._publisher = Publisher(url, app, connection_name="bench compare")

    def publish(self, seq: int, delay: float | None = None) -> None:
        if delay is None:
            self._publisher.publish(TASK, Seq(seq=seq))
        else:
            self._publisher.publish(TASK, Seq(seq=seq), delay=delay)

    def publish_batch(self, seqs: range) -> None:
        self._publisher.publish_many([JobRequest(TASK, Seq(seq=seq)) for seq in seqs])

    def close(self) -> None:
        self._publisher.close()


@dataclass
class BjLane:
    url: str
    queue_type: str
    store_dsn: str | None = None  # PostgreSQL, for the ledger-cost row
    app: App = field(init=False)
    queue: str = ""

    def __post_init__(self) -> None:
        self.app = make_app(f"bcmp{secrets.token_hex(4)}", self.queue_type)
        self.queue = self.app.names.task_queue(TASK)
        with Admin(self.url) as admin:
            admin.declare(self.app.topology())  # the ladder too: no delay pays for it

    def publisher(self) -> BjPublisher:
        return BjPublisher(self.url, self.app)

    def fill(self, seqs: range) -> None:
        with Publisher(self.url, self.app, connection_name="bench fill") as publisher:
            publisher.publish_many([JobRequest(TASK, Seq(seq=seq)) for seq in seqs])

    def store_url(self, variant: Variant, workdir: Path) -> str:
        if variant.store == "sqlite":
            return f"sqlite:///{workdir / f'ledger-{secrets.token_hex(4)}.db'}"
        if variant.store == "postgresql":
            if self.store_dsn is None:
                raise RuntimeError("no PostgreSQL for the ledger row")
            return self.store_dsn
        return "memory://"

    def worker(self, variant: Variant, workdir: Path) -> WorkerProcess:
        argv = [
            *WORKER_COMMAND, "--url", self.url, "--app", "bench.peers.bj:app",
            "--store", self.store_url(variant, workdir),
            "--concurrency", str(CONCURRENCY),  # the default log level, as users run it
        ]  # fmt: skip
        if variant.processes > 1:
            argv += ["--processes", str(variant.processes)]
        env = {NAMESPACE_ENV: self.app.namespace, QUEUE_TYPE_ENV: self.queue_type}
        if variant.pool == "async":
            env[HANDLER_ENV] = "async"
        return WorkerProcess(variant.name, argv, workdir, env)

    def cleanup(self) -> None:
        with Admin(self.url) as admin:
            admin.delete(self.app.topology())


class BjFamily(FamilyBase):
    name = NAME

    def __init__(self, postgres_dsn: str | None = None) -> None:
        self.postgres_dsn = postgres_dsn

    def lane(self, url: str, queue_type: str) -> BjLane:
        return BjLane(url, queue_type, self.postgres_dsn)

    def settings(self) -> dict[str, str]:
        return {
            "publish": "Publisher.publish (persistent, mandatory, waits for its confirm);"
            " batched: Publisher.publish_many (one batch, confirms awaited together);"
            " delayed: publish(..., delay=2.0) through the delay ladder",
            "worker": f"broker-jobs worker --concurrency {CONCURRENCY} --store memory://"
            " at its defaults (log level INFO: a summary line a second of the successes,"
            " a line per failure), default"
            f" --prefetch (2 x concurrency + 64 = {2 * CONCURRENCY + 64}, a second consumer"
            " of 3 x that while jobs run short: docs/worker.md, Prefetch); --processes 2 when"
            " the command has it; ledger rows: --store sqlite:///... (WAL, synchronous=FULL)"
            " and postgresql://... (a throwaway cluster, fsync off); the memory store keeps"
            " the last 50,000 finished jobs, ~40 MB of the rss row (docs/store.md)",
            "async": "the same worker with the no-op handler written `async def` (it runs"
            " on the worker's event loop: no hand-over to a handler thread)",
            "queue": "QueueOptions(queue_type=classic|quorum), topology declared up front",
        }


def variants() -> tuple[Variant, ...]:
    found = [Variant("broker-jobs 1x8", NAME), Variant("broker-jobs async", NAME, pool="async")]
    if worker_has_option("--processes"):  # newer versions only
        found.append(Variant("broker-jobs 2x8", NAME, processes=2))
    found += [
        Variant("broker-jobs sqlite", NAME, store="sqlite", consume_only=True),
        Variant("broker-jobs postgresql", NAME, store="postgresql", consume_only=True),
    ]
    return tuple(found)
