"""Test helpers shared by the test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import importlib
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any, TypeVar

import pika
import pytest

from broker_jobs import (
    App,
    AsyncPublisher,
    Job,
    JobRequest,
    Publisher,
    QueueOptions,
    RetryPolicy,
    WireMessage,
    decode,
)
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.worker import Worker, WorkerSettings
from topology.preflight import server_version

T = TypeVar("T")


@dataclass
class Broker:
    """The session's broker. ``node`` is set when the tests own it and may kill it."""

    url: str
    node: RabbitNode | None = None
    origin: str = "environment"

    def controllable(self) -> RabbitNode:
        """The node, for fault tests; skips (fails in CI) on a broker we do not own."""
        if self.node is None:
            unavailable(f"this test stops the broker; the {self.origin} broker is not ours")
        assert self.node is not None
        return self.node

    def connection(self, name: str) -> pika.BlockingConnection:
        parameters = pika.URLParameters(self.url)
        parameters.client_properties = {"connection_name": name}
        return pika.BlockingConnection(parameters)


class AsyncFacade:
    """An :class:`AsyncPublisher` on a private event loop, so that one test body
    checks that both publishers behave the same."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.inner = AsyncPublisher(*args, **kwargs)

    def publish(self, *args: Any, **kwargs: Any) -> Job:
        return self.loop.run_until_complete(self.inner.publish(*args, **kwargs))

    def publish_many(self, requests: list[JobRequest], **kwargs: Any) -> list[Job]:
        return self.loop.run_until_complete(self.inner.publish_many(requests, **kwargs))

    def connect(self) -> None:
        self.loop.run_until_complete(self.inner.connect())

    def close(self) -> None:
        self.loop.run_until_complete(self.inner.close())
        self.loop.close()


AnyPublisher = Publisher | AsyncFacade


def run_burst_worker(broker: Broker, app: App, store: Any, **settings: Any) -> Counter[str]:
    """A worker of ``app`` in burst mode (``broker-jobs worker --burst``: until its
    queues are empty), in this process; its summary counts. ``settings`` are
    :class:`WorkerSettings` fields (concurrency 4 unless given)."""
    options = WorkerSettings(**{"burst": True, "concurrency": 4, **settings})
    return asyncio.run(Worker(broker.url, app, store, options).run())


def single_attempt_app(
    make_app: Callable[[], App],
    tasks: Iterable[str],
    handler: Callable[..., object],
    queue: QueueOptions | None = None,
) -> App:
    """An app from ``make_app`` whose ``tasks`` each run ``handler`` with one attempt
    only: a failure, flaky or not, goes straight to the task's dead letters."""
    app = make_app()
    for task in tasks:
        app.task(task, retry=RetryPolicy(max_attempts=1), queue=queue)(handler)
    return app


def unavailable(reason: str) -> None:
    """Skip locally, fail in CI: a CI run must not pass by skipping its broker tests."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run every test)")
    pytest.skip(reason)


def wire_from_pika(properties: pika.BasicProperties, body: bytes) -> WireMessage:
    return WireMessage(
        body=body,
        message_id=properties.message_id,
        type=properties.type,
        content_type=properties.content_type,
        content_encoding=properties.content_encoding,
        timestamp=properties.timestamp,
        delivery_mode=properties.delivery_mode or 1,
        headers=properties.headers or {},
    )


def drain(connection: pika.BlockingConnection, queue: str) -> list[Job]:
    """Every job in ``queue``, removed from it: the depth the queue reports is
    consumed (one round trip per message would take seconds for thousands), then
    basic.get until empty for any that arrived meanwhile."""
    channel = connection.channel()
    jobs = []
    depth = channel.queue_declare(queue, passive=True).method.message_count
    if depth:
        # Acked as it goes: a quorum queue stops at 2,000 unacked for an unlimited
        # prefetch. The timeout only bounds a depth that was read high (another
        # consumer took some): basic.get below takes what is left.
        last_tag = acked_tag = 0
        for method, properties, body in channel.consume(queue, inactivity_timeout=10):
            if method is None or properties is None or body is None:
                break
            assert method.delivery_tag is not None
            jobs.append(decode(wire_from_pika(properties, body)))
            last_tag = method.delivery_tag
            if len(jobs) % 500 == 0:
                channel.basic_ack(last_tag, multiple=True)
                acked_tag = last_tag
            if len(jobs) == depth:
                break
        if last_tag > acked_tag:  # a tag acked twice would close the channel
            channel.basic_ack(last_tag, multiple=True)
        channel.cancel()  # requeues what was pushed past the depth, unacked
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return jobs
        jobs.append(decode(wire_from_pika(properties, body)))


def drain_at_least(
    connection: pika.BlockingConnection, queue: str, count: int, within: float = 5.0
) -> list[Job]:
    """Drain ``queue`` once it holds ``count`` messages, or after ``within`` seconds.

    For messages that arrive asynchronously (dead-lettering) or read short for a
    moment (a quorum queue replaying its log after a restart): the depth is polled,
    and the caller's assertions on what was drained decide.
    """
    channel = connection.channel()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if channel.queue_declare(queue, passive=True).method.message_count >= count:
            break
        connection.sleep(0.02)
    return drain(connection, queue)


def docker_answers() -> bool:
    """Whether a Docker engine answers ``/_ping`` (checked over its socket directly:
    docker-py leaks the socket when the engine is absent)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        family, address = socket.AF_UNIX, host.removeprefix("unix://")
    elif host.startswith("tcp://"):
        name, _, port = host.removeprefix("tcp://").partition(":")
        family, address = socket.AF_INET, (name, int(port or 2375))  # type: ignore[assignment]
    else:
        return False
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(address)
            probe.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return b" 200 " in probe.recv(256)
        except OSError:
            return False


def wait_until(condition: Callable[[], T | None], *, within: float, what: str) -> T:
    """Poll ``condition`` until it returns something truthy, which is returned; fail
    naming ``what`` after ``within`` seconds. For state in another process (a store
    row, a log line) that has no event to await."""
    deadline = time.monotonic() + within
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {within:g} s")
        time.sleep(0.02)


def untyped_queue_type(connection: pika.BlockingConnection) -> str | None:
    """What the broker reports as ``x-queue-type`` of a queue declared without one:
    nothing on RabbitMQ 3.x, ``classic`` on 4.x."""
    version = server_version(connection)
    return "classic" if version is not None and version >= (4,) else None


def app_from(directory: Path, module: str) -> App:
    """The ``app`` of ``<directory>/<module>.py``, imported afresh: a test that writes
    its app module and runs once per RabbitMQ release, or per store, must not get the
    module an earlier run left in ``sys.modules`` (with that run's namespace)."""
    sys.modules.pop(module, None)
    sys.path.insert(0, str(directory))
    try:
        app = importlib.import_module(module).app
    finally:
        sys.path.remove(str(directory))
        sys.modules.pop(module, None)
    assert isinstance(app, App)
    return app


def worker_command(
    broker: Broker, directory: Path, app_path: str, *options: str
) -> subprocess.CompletedProcess[str]:
    """``python -m broker_jobs worker`` on ``app_path`` (a module of ``directory``),
    run to its end (at most 120 s), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "broker_jobs", "worker", "--url", broker.url, app_path, *options],
        check=False,
        cwd=directory,
        env={"PYTHONPATH": str(directory), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def importable_app(
    directory: Path, module: str, source: str, monkeypatch: pytest.MonkeyPatch
) -> App:
    """The ``app`` of ``source`` written as ``<directory>/<module>.py``, a module the
    commands under test import by name (``module:app``), as an operator names it: the
    directory stays on ``sys.path`` for the test, the module leaves ``sys.modules``."""
    (directory / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(directory))
    app: App = importlib.import_module(module).app
    monkeypatch.delitem(sys.modules, module)  # the command imports it afresh
    return app


def reports_of(processes: Sequence[BaseProcess], results: Queue[Any]) -> list[Any]:
    """Start ``processes``, each of which puts one report on ``results``; their
    reports, once every process has exited 0. The reports are read before the joins:
    a process may not exit before what it put on a queue is read (a deadlock)."""
    for process in processes:
        process.start()
    reports = [results.get(timeout=100) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    results.close()
    results.join_thread()
    return reports
