"""The ``broker-jobs`` command line."""

from __future__ import annotations

from collections.abc import Callable

import pika
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from broker_jobs import App
from broker_jobs.cli import main
from tests.support import Broker, drain
from topology import declare


class Note(BaseModel):
    text: str


def test_version_and_help() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["--version"]).output.startswith("broker-jobs, version ")
    result = runner.invoke(main, ["publish", "--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output


@pytest.mark.broker
def test_publish_prints_the_confirmed_job_id(
    broker: Broker, make_app: Callable[[], App], connection: pika.BlockingConnection
) -> None:
    app = make_app()
    app.declare("note.add", Note)
    declare(connection, app.topology(ladder=False))
    result = CliRunner().invoke(
        main,
        [
            "publish",
            "--url",
            broker.url,
            "--namespace",
            app.namespace,
            "--key",
            "k1",
            "note.add",
            '{"text": "hi"}',
        ],
    )
    assert result.exit_code == 0, result.output
    (job,) = drain(connection, app.names.task_queue("note.add"))
    assert job.id == result.output.strip()
    assert (job.idempotency_key, job.payload) == ("k1", {"text": "hi"})


def test_bad_payloads_are_refused_with_a_hint() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["publish", "note.add", "{nope"])
    assert result.exit_code == 2
    assert "not JSON" in result.output
    result = runner.invoke(main, ["publish", "note.add", "[1]"])
    assert result.exit_code == 2
    assert "must be a JSON object" in result.output


@pytest.mark.broker
def test_errors_exit_1_with_a_masked_message(namespace: str) -> None:
    result = CliRunner().invoke(
        main,
        [
            "publish",
            "--url",
            "amqp://u:hunter2@127.0.0.1:1/",
            "--namespace",
            namespace,
            "note.add",
            "{}",
        ],
    )
    assert result.exit_code == 1
    assert "cannot connect to the broker at 127.0.0.1:1" in result.output
    assert "hunter2" not in result.output
