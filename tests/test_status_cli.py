"""``broker-jobs status`` against a real broker and the ledger (SQLite, PostgreSQL):
the broker's state comes from publishing with the Publisher, the ledger's through the
Store API."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
from click.testing import CliRunner, Result

from broker_jobs import App, Job, Publisher
from broker_jobs.cli import main
from broker_jobs.ops.status import collect, empty_summary, missing_hint
from broker_jobs.store import Status, Store, open_store
from broker_jobs.store.base import TaskSummary
from broker_jobs.urls import BrokerURLs
from tests import test_jobs_cli as _jobs_tests
from tests.support import Broker, importable_app, wait_until
from topology import Names, Topology, declare
from topology.delay import DELAY_LEVELS

pytestmark = pytest.mark.broker

# The ledgers of tests/test_jobs_cli.py (SQLite and PostgreSQL; found by name here).
store_url = _jobs_tests.store_url
ledger = _jobs_tests.ledger

LEASE = 300.0
MAIL, IMAGE = "mail.send", "image.resize"


def status(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(main, ["status", *args], env=env)


def json_of(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def app(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    namespace: str,
    cleanup_topology: Callable[[Topology], Topology],
) -> tuple[App, str]:
    """An app of two tasks in a module of its own, and its ``module:attr``."""
    module = f"bj_status_app_{namespace}"
    source = (
        "from pydantic import BaseModel\n"
        "from broker_jobs import App\n\n"
        "class Mail(BaseModel):\n"
        "    to: str\n\n"
        f"app = App(namespace={namespace!r})\n"
        f"app.declare({MAIL!r}, Mail)\n"
        f"app.declare({IMAGE!r}, Mail)\n"
    )
    loaded = importable_app(tmp_path, module, source, monkeypatch)
    cleanup_topology(loaded.topology())
    return loaded, f"{module}:app"


def job(key: str, task: str = MAIL, **fields: Any) -> Job:
    return Job(id=f"id-{key}", task=task, idempotency_key=key, **fields)


def ran(
    store: Store, key: str, outcome: str, ended: datetime, task: str = MAIL, took: float = 5.0
) -> None:
    """An execution of ``key`` that took ``took`` seconds and ended ``outcome`` at ``ended``."""
    store.claim(job(key, task), "w1", LEASE, now=ended - timedelta(seconds=took))
    if outcome == "succeeded":
        store.succeed(key, "w1", now=ended)
    elif outcome == "retrying":
        store.retry(key, "w1", "TimeoutError", due_at=ended + timedelta(hours=1), now=ended)
    elif outcome == "failed":
        store.fail(key, "w1", "ValueError", now=ended)
    else:
        store.dead(key, "w1", "exhausted", now=ended)


def set_up_ledger(store: Store, now: datetime) -> None:
    """mail.send: 2 queued (the older 2 min ago), 1 scheduled, 1 running, and 4
    executions of 5 s in the last hour (1 succeeded; retrying, failed, dead);
    image.resize: one success 2 h ago; other.task: not the app's."""

    def ago(seconds: float) -> datetime:
        return now - timedelta(seconds=seconds)

    store.record_published([job("q1")], now=ago(120))
    store.record_published([job("q2")], now=ago(30))
    store.record_published([job("s1", due_at=now + timedelta(hours=1))], now=ago(10))
    store.claim(job("r1"), "w1", LEASE, now=ago(5))
    ran(store, "ok1", "succeeded", ago(600))
    ran(store, "re1", "retrying", ago(300))
    ran(store, "fa1", "failed", ago(200))
    ran(store, "de1", "dead", ago(100))
    ran(store, "old", "succeeded", ago(7200), task=IMAGE)
    ran(store, "else", "succeeded", ago(90), task="other.task")


def set_up_broker(
    broker: Broker, connection: pika.BlockingConnection, app: App
) -> pika.adapters.blocking_connection.BlockingChannel:
    """mail.send: 3 ready jobs and 1 delayed (in the ladder), 1 dead letter;
    image.resize: a consumer; 2 jobs in the unroutable queue. Returns the consumer's
    channel (closing it ends the consumer)."""
    names = app.names
    with Publisher(broker.url, app) as publisher:
        for number in range(3):
            publisher.publish(MAIL, {"to": f"{number}@example.com"})
        publisher.publish(MAIL, {"to": "later@example.com"}, delay=120)
    channel = connection.channel()
    channel.confirm_delivery()  # each publish below returns once the broker has it
    channel.basic_publish(names.dead_letter_exchange, MAIL, b"{}", mandatory=True)
    for _ in range(2):
        channel.basic_publish(names.unroutable_exchange, "", b"{}", mandatory=True)
    consumer = connection.channel()
    consumer.basic_consume(names.task_queue(IMAGE), lambda *_: None)
    return consumer


@pytest.fixture
def declared(connection: pika.BlockingConnection, app: tuple[App, str]) -> tuple[App, str]:
    declare(connection, app[0].topology())
    return app


# -- the report --------------------------------------------------------------------------


def test_status_counts_what_the_broker_and_the_ledger_hold(
    broker: Broker,
    connection: pika.BlockingConnection,
    declared: tuple[App, str],
    ledger: Store,
    store_url: str,
) -> None:
    app, app_path = declared
    set_up_ledger(ledger, datetime.now(UTC))
    consumer = set_up_broker(broker, connection, app)
    names = app.names

    document = json_of(
        status("--url", broker.url, "--app", app_path, "--store", store_url, "--json")
    )
    assert document["namespace"] == app.namespace
    node = BrokerURLs.parse(broker.url).first.masked
    assert document["node"] == node
    assert [task["task"] for task in document["tasks"]] == [IMAGE, MAIL]  # sorted
    image, mail = document["tasks"]
    assert mail["queue"] == {
        "name": names.task_queue(MAIL),
        "exists": True,
        "messages": 3,
        "consumers": 0,
    }
    assert mail["dead_letters"]["messages"] == 1
    assert mail["dead_letters"]["indexed"] == 0  # put there by hand, not by a worker
    assert image["queue"]["consumers"] == 1
    assert image["queue"]["messages"] == 0
    assert image["dead_letters"] == {
        "name": names.dead_letter_queue(IMAGE),
        "exists": True,
        "messages": 0,
        "consumers": 0,
        "indexed": 0,
    }
    assert document["ladder"] == {"messages": 1, "levels": DELAY_LEVELS, "missing": []}
    assert document["unroutable"]["messages"] == 2
    assert document["missing"] == []
    assert document["publishing"] == {"accepted": True, "blocked_reason": None, "why": None}

    ledger_mail = mail["ledger"]
    assert ledger_mail["counts"] == {
        "queued": 2,
        "scheduled": 1,
        "running": 1,
        "succeeded": 1,
        "retrying": 1,
        "failed": 1,
        "dead": 1,
        "cancelled": 0,
    }
    assert (ledger_mail["succeeded_last_hour"], ledger_mail["failed_last_hour"]) == (1, 3)
    assert (ledger_mail["succeeded_last_minute"], ledger_mail["failed_last_minute"]) == (0, 0)
    assert (ledger_mail["p50_seconds"], ledger_mail["p99_seconds"]) == (5.0, 5.0)
    assert 120 <= ledger_mail["oldest_waiting_seconds"] < 120 + 60
    taken_at = datetime.fromisoformat(document["taken_at"])
    oldest = datetime.fromisoformat(ledger_mail["oldest_waiting"])
    assert (taken_at - oldest).total_seconds() == ledger_mail["oldest_waiting_seconds"]
    ledger_image = image["ledger"]
    assert ledger_image["counts"]["succeeded"] == 1
    assert ledger_image["succeeded_last_hour"] == 0  # two hours ago
    assert ledger_image["p50_seconds"] is None
    assert ledger_image["oldest_waiting"] is None

    people = status("--url", broker.url, "--app", app_path, "--store", store_url)
    assert people.exit_code == 0, people.output
    lines = people.stdout.splitlines()
    assert lines[0].startswith(f"namespace {app.namespace!r} on {node}, ledger ")
    row = next(line.split() for line in lines if line.startswith(MAIL))
    # task ready running consumers queued scheduled retrying dead-letters failed ok/h
    # failed/h oldest p50 p99
    assert row[:11] == [MAIL, "3", "1", "0", "2", "1", "1", "1", "1", "1", "3"]
    assert row[11].startswith("2m")
    assert row[12:] == ["5.0s", "5.0s"]
    image_row = next(line.split() for line in lines if line.startswith(IMAGE))
    assert image_row == [IMAGE, "0", "0", "1", "0", "0", "0", "0", "0", "0", "0", "-", "-", "-"]
    assert "delay ladder: 1 delayed job(s) waiting in 25 levels" in lines
    assert any(
        line.startswith(f"unroutable: 2 job(s) in {names.unroutable_queue}") for line in lines
    )
    assert not any(line.startswith("missing:") for line in lines)
    assert "publishing: accepted (the broker confirmed two test publishes)" in lines
    assert "other.task" not in people.stdout
    [hint] = [line for line in lines if line.startswith("dead letters not in the ledger's")]
    assert f"({MAIL}: 1)" in hint
    assert "those being dead-lettered right now count" in hint  # before RabbitMQ is blamed
    assert hint.index("right now") < hint.index("RabbitMQ")
    assert hint.endswith(f"broker-jobs dlq reindex --namespace {app.namespace} --task {MAIL}")

    def consumers() -> int:
        command = ["--url", broker.url, "--app", app_path, "--store", store_url, "--json"]
        count: int = json_of(status(*command))["tasks"][0]["queue"]["consumers"]
        return count

    consumer.close()  # the count is the broker's, now
    wait_until(lambda: consumers() == 0, within=10, what="the consumer count to drop to 0")


def test_status_of_tasks_named_in_a_namespace(
    broker: Broker, declared: tuple[App, str], ledger: Store, store_url: str, namespace: str
) -> None:
    app, _ = declared
    with Publisher(broker.url, app) as publisher:
        publisher.publish(MAIL, {"to": "a@example.com"})
    ledger.record_published([job("q1")])
    command = ["--url", broker.url, "--store", store_url, "--json", "--namespace", namespace]
    document = json_of(status(*command, "--task", MAIL, "--task", "ghost.task", "--task", MAIL))
    assert [task["task"] for task in document["tasks"]] == [MAIL, "ghost.task"]  # given order
    mail, ghost = document["tasks"]
    assert mail["queue"]["messages"] == 1
    assert mail["ledger"]["counts"]["queued"] == 1
    assert ghost["queue"] == {
        "name": Names(namespace).task_queue("ghost.task"),
        "exists": False,
        "messages": None,
        "consumers": None,
    }
    assert ghost["ledger"]["counts"]["queued"] == 0
    assert document["missing"] == [
        Names(namespace).task_queue("ghost.task"),
        Names(namespace).dead_letter_queue("ghost.task"),
    ]

    # The app in the environment gives way to an explicit --namespace.
    env = {"BROKER_JOBS_APP": "no_such_module:app"}
    assert json_of(status(*command, "--task", MAIL, env=env))["tasks"][0]["task"] == MAIL


def test_missing_queues_are_reported_with_the_command_that_creates_them(
    broker: Broker, app: tuple[App, str], ledger: Store, store_url: str
) -> None:
    loaded, app_path = app  # nothing declared
    names = loaded.names
    command = ["--url", broker.url, "--app", app_path, "--store", store_url]
    document = json_of(status(*command, "--task", MAIL, "--json"))
    (mail,) = document["tasks"]
    assert mail["queue"]["exists"] is False
    assert mail["dead_letters"]["exists"] is False
    assert document["ladder"]["messages"] == 0
    assert document["ladder"]["missing"] == [names.delay_queue(n) for n in range(DELAY_LEVELS)]
    assert document["unroutable"] == {
        "name": names.unroutable_queue,
        "exists": False,
        "messages": None,
        "consumers": None,
    }
    assert document["missing"] == [
        names.task_queue(MAIL),
        names.dead_letter_queue(MAIL),
        *(names.delay_queue(n) for n in range(DELAY_LEVELS)),
        names.unroutable_queue,
    ]

    people = status(*command)
    assert people.exit_code == 0, people.output
    row = next(line.split() for line in people.stdout.splitlines() if line.startswith(MAIL))
    assert row[1:4] == ["missing", "0", "missing"]
    assert f"unroutable: queue {names.unroutable_queue} missing" in people.stdout
    assert "(25 level queue(s) missing)" in people.stdout
    (line,) = [line for line in people.stdout.splitlines() if line.startswith("missing:")]
    assert names.task_queue(IMAGE) in line
    assert "25 delay level queue(s)" in line
    assert line.endswith(f"create them with: broker-jobs topology apply --app {app_path}")


def test_collect_is_the_api_behind_the_command(
    broker: Broker, declared: tuple[App, str], ledger: Store
) -> None:
    app, _ = declared
    ledger.record_published([job("q1")])
    report = collect(broker.url, app.names, [MAIL], ledger)
    (mail,) = report.tasks
    assert (mail.queue.exists, mail.queue.messages, mail.running) == (True, 0, 0)
    assert mail.ledger.counts[Status.QUEUED] == 1
    assert isinstance(mail.ledger, TaskSummary)
    assert report.missing == ()
    assert json.loads(json.dumps(report.document()))["tasks"][0]["task"] == MAIL
    assert empty_summary("x").counts[Status.RUNNING] == 0
    assert missing_hint() == (
        "create them with: broker-jobs topology apply --app MODULE:APP (or --file topology.toml)"
    )


# -- refusals ----------------------------------------------------------------------------


def test_a_missing_sqlite_ledger_is_refused_not_created(
    broker: Broker, app: tuple[App, str], tmp_path: Path
) -> None:
    _, app_path = app
    path = tmp_path / "typo.db"
    for env, options in [
        (None, ["--store", f"sqlite:///{path}"]),
        ({"BROKER_JOBS_STORE": f"sqlite:///{path}"}, []),
    ]:
        result = status("--url", broker.url, "--app", app_path, *options, env=env)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith(f"error: no ledger at 'sqlite:///{path}'")
        assert "--store" in result.stderr
        assert "BROKER_JOBS_STORE" in result.stderr
        assert not path.exists()


def test_an_unreachable_broker_is_one_line_with_the_password_masked(
    app: tuple[App, str], ledger: Store, store_url: str
) -> None:
    _, app_path = app
    url = "amqp://ops:s3cret@127.0.0.1:1/"
    result = status("--url", url, "--app", app_path, "--store", store_url)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "127.0.0.1:1" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert "s3cret" not in result.output


@pytest.mark.parametrize(
    ("options", "code", "message"),
    [
        ([], 2, "no tasks given: add --app MODULE:APP, or --namespace NS with --task NAME"),
        (["--namespace", "jobs"], 2, "--namespace jobs needs the tasks to show: add --task NAME"),
        (["--app", "APP", "--namespace", "jobs"], 2, "give --app or --namespace"),
        (["--app", "APP", "--task", "nope"], 2, "'nope' is not a task of"),
        (["--app", "no_such_module:app"], 1, "no module named 'no_such_module'"),
        (["--namespace", "jobs", "--task", "bad task"], 2, "invalid task name 'bad task'"),
        (["--namespace", "no.dots", "--task", "x"], 2, "invalid namespace 'no.dots'"),
    ],
)
def test_usage_errors(
    app: tuple[App, str], tmp_path: Path, options: list[str], code: int, message: str
) -> None:
    _, app_path = app
    store = tmp_path / "ledger.db"
    open_store(f"sqlite:///{store}").close()
    options = [app_path if option == "APP" else option for option in options]
    result = status("--store", f"sqlite:///{store}", *options, env={"BROKER_JOBS_APP": None})
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert not result.stdout


def test_help_has_examples() -> None:
    result = CliRunner().invoke(main, ["status", "-h"])
    assert result.exit_code == 0
    assert "Examples:" in result.output
    assert "--store" in result.output
    assert "BROKER_JOBS_APP" in result.output
