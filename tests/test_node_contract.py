"""The wire contract holds in another language: tests/contract/node/publish.js, a
Node.js publisher (amqplib) written from docs/wire-format.md alone, publishes a plain
job, an idempotent pair, a delayed and two malformed jobs, and a real worker in burst
mode runs them as the page promises. (The pika publisher: tests/test_wire_contract.py.)

Node.js and the publisher's npm packages are installed by scripts/test; without them
the tests skip locally and fail in CI."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
from pydantic import BaseModel

from broker_jobs import App
from broker_jobs.store.base import Status
from broker_jobs.store.memory import MemoryStore
from broker_jobs.worker import Worker, WorkerSettings
from broker_jobs.worker.dead_letters import HEADER_REASON
from tests.support import Broker, unavailable
from topology import declare

pytestmark = pytest.mark.broker

PUBLISHER_DIR = Path(__file__).parent / "contract" / "node"
TASK = "contract.record"  # publish.js's default task
DELAY = 4.5  # n = 4: level 02 of the ladder holds the job 4 s


class Record(BaseModel):
    key: str
    n: int


@dataclass(frozen=True)
class Run:
    payload: Record
    at: datetime


def published_by_node(broker: Broker, namespace: str, scenarios: str) -> tuple[int, list[Any]]:
    """Run the Node.js publisher; its exit code and what it says it published."""
    node = shutil.which("node")
    if node is None:
        unavailable("no Node.js: apt-get install nodejs npm (scripts/test does)")
    if not (PUBLISHER_DIR / "node_modules" / "amqplib").is_dir():
        unavailable(f"amqplib missing: run `npm ci` in {PUBLISHER_DIR} (scripts/test does)")
    assert node is not None
    done = subprocess.run(
        [node, "publish.js", broker.url, namespace, scenarios, "--delay", str(DELAY)],
        cwd=PUBLISHER_DIR,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)["published"]


@pytest.fixture
def runs() -> list[Run]:
    """What the handler ran, in order (appends are atomic; handlers run in threads)."""
    return []


@pytest.fixture
def app(make_app: Callable[[], App], connection: pika.BlockingConnection, runs: list[Run]) -> App:
    """The task the Node.js service publishes to, its topology declared with the ladder
    (as an operator would before publishers start; the publisher declares nothing)."""
    app = make_app()

    @app.task(TASK)
    def record(payload: Record) -> None:
        runs.append(Run(payload, datetime.now(UTC)))

    declare(connection, app.topology())
    return app


def dead_letters(
    connection: pika.BlockingConnection, queue: str, count: int
) -> list[tuple[Any, Any]]:
    """The (properties, body) of ``count`` dead letters, waiting up to 5 s for them."""
    channel = connection.channel()
    deadline = time.monotonic() + 5
    while (channel.queue_declare(queue, passive=True).method.message_count or 0) < count:
        if time.monotonic() > deadline:
            break
        connection.sleep(0.05)
    found: list[tuple[Any, Any]] = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return found
        found.append((properties, body))


def test_jobs_from_the_node_publisher_run_as_the_page_promises(
    broker: Broker,
    app: App,
    namespace: str,
    connection: pika.BlockingConnection,
    runs: list[Run],
) -> None:
    code, published = published_by_node(broker, namespace, "all")
    assert code == 0, published
    assert [entry["outcome"] for entry in published] == ["stored"] * len(published)
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for entry in published:
        by_scenario.setdefault(entry["scenario"], []).append(entry)

    # The delayed job went to the level of n's highest set bit: n = floor(4.5 - 0.2) = 4.
    (delayed,) = by_scenario["delayed"]
    assert delayed["exchange"] == f"{namespace}.delay.02"
    assert delayed["routingKey"] == "0." * 22 + "1.0.0." + TASK
    level = connection.channel().queue_declare(f"{namespace}.delay.02", passive=True)
    assert level.method.message_count == 1  # held there 4 s

    store = MemoryStore()
    started = time.monotonic()
    outcomes = asyncio.run(Worker(broker.url, app, store, WorkerSettings(burst=True)).run())
    print(f"\nworker drained in {time.monotonic() - started:.2f} s: {dict(outcomes)}")

    ran = sorted((run.payload.key, run.payload.n) for run in runs)
    # plain once; the pair once (either of its two); delayed once; malformed never
    assert [key for key, _ in ran] == ["delayed", "pair", "plain"]
    assert ("plain", 1) in ran
    assert (outcomes["succeeded"], outcomes["duplicate"]) == (3, 1)

    # The plain job: its message id is the job id and the idempotency key by default.
    (plain,) = by_scenario["plain"]
    record = store.get(plain["messageId"])
    assert record is not None
    assert record.status is Status.SUCCEEDED

    # The pair: two message ids, one key, one run.
    first, second = by_scenario["idempotent"]
    assert first["messageId"] != second["messageId"]
    assert first["idempotencyKey"] == second["idempotencyKey"]
    record = store.get(first["idempotencyKey"])
    assert record is not None
    assert record.status is Status.SUCCEEDED

    # The delayed job: not before its bj-due-at, and not much after.
    due_at = datetime.fromisoformat(delayed["dueAt"])
    (delayed_run,) = [run for run in runs if run.payload.key == "delayed"]
    assert due_at <= delayed_run.at < due_at + timedelta(seconds=3), (due_at, delayed_run.at)

    # The malformed jobs: dead-lettered with the reason, never run.
    not_json, bad_schema = by_scenario["malformed"]
    letters = dead_letters(connection, app.names.dead_letter_queue(TASK), 2)
    reasons = {
        properties.message_id: properties.headers[HEADER_REASON] for properties, _ in letters
    }
    assert reasons == {not_json["messageId"]: "json", bad_schema["messageId"]: "schema"}
    bodies = {properties.message_id: body.decode() for properties, body in letters}
    assert bodies == {
        not_json["messageId"]: not_json["body"],
        bad_schema["messageId"]: bad_schema["body"],
    }
    for entry in (not_json, bad_schema):
        record = store.get(entry["messageId"])
        assert record is not None
        assert record.status is Status.DEAD


def test_a_job_for_a_task_without_a_queue_comes_back_to_the_node_publisher(
    broker: Broker, app: App, namespace: str
) -> None:
    code, published = published_by_node(broker, namespace, "unroutable")
    assert code == 1
    assert [entry["outcome"] for entry in published] == ["returned"]
