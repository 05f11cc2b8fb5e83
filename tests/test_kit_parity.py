"""One table of scenarios, run by the testing kit in memory and by a real worker on a
real RabbitMQ: the same outcomes, since both run the worker's own decision code
(claim, idempotency check, retry policy, dead-letter reasons, results)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
import pytest
from pydantic import BaseModel

from broker_jobs import App, JobRequest, PermanentError, Publisher, RetryPolicy
from broker_jobs.envelope import WireMessage
from broker_jobs.store.memory import MemoryStore
from broker_jobs.testing import JobsKit
from tests.support import Broker, run_burst_worker
from topology import Topology
from topology import names as n


class Order(BaseModel):
    number: int
    fail: int = 0  # runs that fail before one succeeds
    permanent: bool = False


@dataclass(frozen=True)
class Raw:
    """A message published straight to the task queue, past the publishers' checks."""

    body: bytes
    message_type: str = "order.ship"
    content_type: str = "application/json"
    message_id: str = "raw-1"


@dataclass(frozen=True)
class Scenario:
    name: str
    requests: list[JobRequest] = field(default_factory=list)
    raw: list[Raw] = field(default_factory=list)


def ship(number: int, **fields: Any) -> JobRequest:
    return JobRequest("order.ship", {"number": number, **fields}, job_id=f"job-{number}")


SCENARIOS = [
    Scenario("succeeds", [ship(1)]),
    Scenario("retried then succeeds", [ship(2, fail=2)]),
    Scenario("exhausted", [ship(3, fail=9)]),
    Scenario("permanent failure", [ship(4, permanent=True)]),
    Scenario(
        "one key twice",
        [
            JobRequest("order.ship", {"number": 5}, job_id="job-5a", idempotency_key="order-5"),
            JobRequest("order.ship", {"number": 5}, job_id="job-5b", idempotency_key="order-5"),
        ],
    ),
    Scenario("payload against the model", raw=[Raw(b'{"number": "five"}')]),
    Scenario("not JSON", raw=[Raw(b"\x80not json")]),
    Scenario("another task's message", raw=[Raw(b'{"number": 6}', message_type="order.cancel")]),
]


def make_app(namespace: str, runs: Counter[int]) -> App:
    app = App(namespace=namespace)
    app.declare("order.cancel", Order)

    # No backoff: the real side's burst worker ends when its queue is empty, so a
    # retry must be in the queue before the delivery it replaces is acked.
    @app.task("order.ship", retry=RetryPolicy(max_attempts=3, schedule=[0, 0]), keep_result=True)
    def ship(order: Order) -> dict[str, int]:
        runs[order.number] += 1
        if order.permanent:
            raise PermanentError("no such address")
        if runs[order.number] <= order.fail:
            raise RuntimeError(f"run {runs[order.number]} fails")
        return {"shipped": order.number}

    return app


@dataclass
class Observed:
    """What a scenario left: per job id its status, attempts and result; the dead
    letters' reasons; the handler's runs; the worker's outcome counts."""

    records: dict[str, tuple[str, int, Any]]
    dead: list[tuple[str | None, str | None]]
    runs: dict[int, int]
    outcomes: dict[str, int]


def observe(
    store: MemoryStore, app: App, ids: list[str], dead: list[tuple[str | None, str | None]],
    runs: Counter[int], outcomes: Counter[str],
) -> Observed:  # fmt: skip
    records = {}
    for job_id in ids:
        record = store.lookup(job_id)
        if record is not None:
            records[job_id] = (record.status.value, record.attempts, store.result(job_id))
    counted = {k: v for k, v in outcomes.items() if v and not k.startswith("ack")}
    return Observed(records, sorted(dead, key=str), dict(runs), counted)


def raw_message_id(scenario: Scenario, index: int) -> str:
    return f"{scenario.name.replace(' ', '-')}-{index}"


def in_memory(scenario: Scenario) -> Observed:
    runs: Counter[int] = Counter()
    app = make_app("parity", runs)
    store = MemoryStore()
    with JobsKit(app, store=store) as kit:
        kit.publisher().publish_many(scenario.requests)
        for index, raw in enumerate(scenario.raw):
            kit.broker.publish(
                "",
                app.names.task_queue("order.ship"),
                WireMessage(
                    body=raw.body,
                    message_id=raw_message_id(scenario, index),
                    type=raw.message_type,
                    content_type=raw.content_type,
                ),
            )
        kit.run_all()
        dead = [(d.job_id, d.reason) for d in kit.dead_letters("order.ship")]
        outcomes = kit.outcomes
    return observe(store, app, job_ids(scenario), dead, runs, outcomes)


def on_rabbitmq(
    scenario: Scenario, broker: Broker, namespace: str, cleanup: Callable[[Topology], Topology]
) -> Observed:
    runs: Counter[int] = Counter()
    app = make_app(namespace, runs)
    cleanup(app.topology())
    store = MemoryStore()
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many(scenario.requests)
    with broker.connection("test parity") as connection:
        channel = connection.channel()
        for index, raw in enumerate(scenario.raw):
            channel.basic_publish(
                "",
                app.names.task_queue("order.ship"),
                raw.body,
                pika.BasicProperties(
                    message_id=raw_message_id(scenario, index),
                    type=raw.message_type,
                    content_type=raw.content_type,
                    delivery_mode=2,
                ),
            )
        outcomes = run_burst_worker(broker, app, store)
        dead = []
        while True:
            method, properties, body = channel.basic_get(
                app.names.dead_letter_queue("order.ship"), auto_ack=True
            )
            if method is None:
                break
            headers = properties.headers or {}
            job_id = properties.message_id
            reason = headers.get(n.HEADER_DEAD_REASON)
            dead.append((job_id, reason.decode() if isinstance(reason, bytes) else reason))
        del body
    return observe(store, app, job_ids(scenario), dead, runs, outcomes)


def job_ids(scenario: Scenario) -> list[str]:
    ids = [request.job_id for request in scenario.requests if request.job_id]
    return ids + [raw_message_id(scenario, index) for index in range(len(scenario.raw))]


@pytest.mark.broker
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_kit_and_a_real_worker_reach_the_same_outcomes(
    scenario: Scenario,
    broker: Broker,
    namespace: str,
    cleanup_topology: Callable[[Topology], Topology],
) -> None:
    memory = in_memory(scenario)
    real = on_rabbitmq(scenario, broker, namespace, cleanup_topology)
    assert memory == real, json.dumps(
        {"memory": memory.__dict__, "rabbitmq": real.__dict__}, default=str, indent=1
    )
    assert memory.records or memory.dead, "the scenario left nothing to compare"
