"""The log line of a dead letter says what the message told: its key and attempt
when its headers carry them, and no "None" for what it lacks (run in the testing
kit: the worker's own protocol, no broker)."""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel

from broker_jobs import App
from broker_jobs.envelope import WireMessage
from broker_jobs.testing import JobsKit
from topology import names as n


class Order(BaseModel):
    number: int


def dead_letter_line(caplog: pytest.LogCaptureFixture, headers: dict[str, object]) -> str:
    app = App(namespace="logs")

    @app.task("order.ship")
    def ship(order: Order) -> None:
        del order

    with JobsKit(app) as kit, caplog.at_level(logging.ERROR, "broker_jobs.worker.observer"):
        message = WireMessage(
            body=b'{"number": "five"}',  # against the model: a schema dead letter
            message_id="m-1",
            type="order.ship",
            content_type="application/json",
            headers=headers,
        )
        kit.broker.publish("", app.names.task_queue("order.ship"), message)
        kit.run()
        assert [letter.reason for letter in kit.dead_letters("order.ship")] == ["schema"]
    [record] = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
    return record.getMessage()


def test_a_schema_dead_letter_names_the_key_and_attempt_of_its_headers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    line = dead_letter_line(caplog, {n.HEADER_IDEMPOTENCY_KEY: "order-5", n.HEADER_ATTEMPT: 3})
    assert line.startswith("job m-1 (key order-5, order.ship attempt 3) dead-lettered on"), line


def test_a_message_without_key_or_attempt_says_so_and_prints_no_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    line = dead_letter_line(caplog, {})
    assert "None" not in line, line
    assert line.startswith("job m-1 (no key, order.ship) dead-lettered on"), line
