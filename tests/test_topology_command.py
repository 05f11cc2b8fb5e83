"""``broker-jobs topology``: plan, apply, verify, export, preflight and permissions
against a real broker. Tests that run rabbitmqctl need a node of their own and skip
with ``BROKER_JOBS_TEST_AMQP_URL``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pika
import pika.exceptions
import pytest
from click.testing import CliRunner, Result
from pydantic import BaseModel

from broker_jobs import AccessRefusedError, App, Job, Publisher
from broker_jobs.cli import main
from broker_jobs.ops.unroutable import reroute
from broker_jobs.store import MemoryStore
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.urls import BrokerURL
from broker_jobs.worker import Worker, WorkerSettings, rerouting
from scheduler import Beat, BeatSettings, load_schedules
from tests.support import Broker, drain, importable_app, untyped_queue_type, wait_until
from tests.test_worker_recovery import WorkerThread
from topology import Names, Topology, declare
from topology.delay import delay_routing_key
from topology.errors import show_value
from topology.file import TopologyFileError, load_file, parse
from topology.permissions import Role, role_permissions

pytestmark = pytest.mark.broker

COMMANDS = ["plan", "apply", "verify", "export", "preflight", "permissions"]


class Mail(BaseModel):
    to: str


def topology(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(main, ["topology", *args], env=env)


def exists(connection: pika.BlockingConnection, kind: str, name: str) -> bool:
    """Passive declare on a channel of its own (a 404 closes the channel)."""
    channel = connection.channel()
    try:
        if kind == "queue":
            channel.queue_declare(name, passive=True)
        else:
            channel.exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as error:
        if error.reply_code == 404:
            return False
        raise
    channel.close()
    return True


def with_credentials(url: str, user: str, password: str, vhost: str | None = None) -> str:
    parts = urlsplit(url)
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port}"
    path = parts.path if vhost is None else "/" + quote(vhost, safe="")
    return urlunsplit(parts._replace(netloc=netloc, path=path))


def rabbitmqctl_command(node: RabbitNode) -> str:
    """A shell command line reaching the test's node: its cookie lives in its HOME."""
    return node.ctl_command_line()


@pytest.fixture
def app_path(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    namespace: str,
    cleanup_topology: Callable[[Topology], Topology],
) -> str:
    """``module:attr`` of an app in a module of its own, as an operator names it."""
    module = f"bj_topology_app_{namespace}"
    source = (
        "from pydantic import BaseModel\n"
        "from broker_jobs import App\n\n"
        "class Mail(BaseModel):\n"
        "    to: str\n\n"
        f"app = App(namespace={namespace!r})\n"
        "app.declare('mail.send', Mail)\n"
    )
    app = importable_app(tmp_path, module, source, monkeypatch)
    cleanup_topology(app.topology())
    return f"{module}:app"


@pytest.fixture
def applied(broker: Broker, app_path: str, namespace: str) -> Names:
    """The app's topology applied by an operator (the ladder included); its names."""
    result = topology("apply", "--url", broker.url, "--app", app_path)
    assert result.exit_code == 0, result.output
    return Names(namespace)


@pytest.fixture
def user(broker: Broker) -> Iterator[Callable[[], tuple[str, str]]]:
    """Create users on the test's own node; deleted afterwards."""
    node = broker.controllable()
    created: list[str] = []

    def make() -> tuple[str, str]:
        name, password = f"bj-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        node.ctl("add_user", name, password)
        created.append(name)
        return name, password

    yield make
    for name in created:
        node.ctl("delete_user", name)


def grant(node: RabbitNode, printed: str) -> None:
    """Run the ``rabbitmqctl set_permissions`` line the command printed."""
    command = shlex.split(printed.strip().splitlines()[-1])
    assert command[:2] == ["rabbitmqctl", "set_permissions"]
    node.ctl(*command[1:])


def granted_user(
    broker: Broker, user: Callable[[], tuple[str, str]], *permissions: str
) -> tuple[str, str]:
    """A new user granted what ``topology permissions <permissions> --user <name>``
    prints, as an operator grants it: the broker's URL with the user's credentials,
    and what the command printed."""
    name, password = user()
    printed = topology("permissions", *permissions, "--user", name)
    grant(broker.controllable(), printed.stdout)
    return with_credentials(broker.url, name, password), printed.stdout


@contextlib.contextmanager
def confirming_channel(url: str) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    """A channel of ``url``'s user in confirm mode: a publish the broker refuses or
    returns raises instead of passing unseen."""
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        yield channel


# -- help and usage -------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command: str) -> None:
    result = topology(command, "--help")
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output
    if command not in {"export", "permissions"}:
        assert "--url" in result.output
        assert "BROKER_JOBS_URL" in result.output


def test_usage_errors_exit_1_so_that_2_means_changes_pending() -> None:
    result = topology("plan")
    assert result.exit_code == 1
    assert "--app MODULE:ATTR" in result.output
    result = topology("plan", "--app", "x:app", "--file", "t.toml")
    assert result.exit_code == 1
    assert "not both" in result.output
    result = topology("plan", "--bogus")
    assert result.exit_code == 1
    assert "No such option" in result.output


# -- plan, apply, verify --------------------------------------------------------------


@pytest.mark.also_on_rabbitmq_4
def test_plan_creates_nothing_then_apply_makes_plan_and_verify_pass(
    broker: Broker, app_path: str, namespace: str, connection: pika.BlockingConnection
) -> None:
    names = Names(namespace)
    plan = topology("plan", "--url", broker.url, "--app", app_path)
    assert plan.exit_code == 2, plan.output
    assert f"+ exchange {names.work_exchange} (topic): missing, to create" in plan.stdout
    assert f"+ queue {names.task_queue('mail.send')} (quorum)" in plan.stdout
    assert f"+ queue {names.unroutable_queue} (quorum)" in plan.stdout
    # The ladder's 25 levels (an exchange and a queue each) in one line.
    assert f"{names.delay_queue(24)} " not in plan.stdout
    assert "  delay ladder: 50 to create (run with --verbose to see them)\n" in plan.stdout
    assert sum(line.startswith("  + ") for line in plan.stdout.splitlines()) == 7
    assert "57 to create, 0 conflicting, 0 in sync" in plan.stdout
    verbose = topology("plan", "--url", broker.url, "--app", app_path, "--verbose")
    assert verbose.exit_code == 2, verbose.output
    assert f"+ queue {names.delay_queue(24)} (quorum): missing, to create" in verbose.stdout
    assert f"+ exchange {names.delay_exchange(0)} (topic): missing, to create" in verbose.stdout
    assert sum(line.startswith("  + ") for line in verbose.stdout.splitlines()) == 57
    assert "  delay ladder: 50 to create\n" in verbose.stdout
    # Read-only: nothing exists after the plan.
    for kind, name in [
        ("exchange", names.work_exchange),
        ("exchange", names.delay_exchange(24)),
        ("queue", names.task_queue("mail.send")),
        ("queue", names.delay_queue(0)),
    ]:
        assert not exists(connection, kind, name), name

    verify = topology("verify", "--url", broker.url, "--app", app_path)
    assert verify.exit_code == 1
    assert f"{namespace!r} is not in sync: 57 missing, 0 conflicting" in verify.stderr
    assert "  delay ladder: 50 missing (run with --verbose to see them)" in verify.stdout
    assert len(verify.stdout.splitlines()) == 8  # 7 objects and the ladder's line

    apply = topology("apply", "--url", broker.url, "--app", app_path)
    assert apply.exit_code == 0, apply.output
    assert "57 created" in apply.stdout
    assert "nothing changed or deleted" in apply.stdout
    assert f"+ queue {names.task_queue('mail.send')} (quorum): created" in apply.stdout
    assert "  delay ladder: 50 created (run with --verbose to see them)" in apply.stdout
    assert sum(line.startswith("  + ") for line in apply.stdout.splitlines()) == 7

    plan = topology("plan", "--url", broker.url, "--app", app_path)
    assert plan.exit_code == 0, plan.output
    assert "  delay ladder: 50 objects in sync\n" in plan.stdout
    assert sum(line.startswith("  = ") for line in plan.stdout.splitlines()) == 7
    assert "0 to create, 0 conflicting, 57 in sync" in plan.stdout
    assert "54 to re-declare (idempotent" in plan.stdout
    verbose = topology("plan", "--url", broker.url, "--app", app_path, "-v")
    assert sum(line.startswith("  = ") for line in verbose.stdout.splitlines()) == 57
    verify = topology("verify", "--url", broker.url, "--app", app_path)
    assert verify.exit_code == 0, verify.output
    assert verify.stdout.startswith(f"in sync: namespace {namespace!r}, 57 exchanges and queues")
    again = topology("apply", "--url", broker.url, "--app", app_path, "--verbose")
    assert again.exit_code == 0, again.output
    assert "0 created" in again.stdout
    assert "+ " not in again.stdout
    assert "  delay ladder: 50 objects in sync\n" in again.stdout


@pytest.mark.also_on_rabbitmq_4
def test_a_conflicting_queue_is_reported_with_its_remedy_and_left_untouched(
    broker: Broker, app_path: str, namespace: str, connection: pika.BlockingConnection
) -> None:
    queue = Names(namespace).task_queue("mail.send")
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)  # classic, where quorum is wanted
    channel.basic_publish("", queue, b"{}", pika.BasicProperties(delivery_mode=2))

    plan = topology("plan", "--url", broker.url, "--app", app_path)
    assert plan.exit_code == 1, plan.output
    assert f"! queue {queue} (quorum): conflict: " in plan.stdout
    untyped = show_value(untyped_queue_type(connection))
    assert f"x-queue-type: wanted 'quorum', broker has {untyped}" in plan.stdout
    assert "2 blocked by a conflict" in plan.stdout
    assert "1 object(s) conflict" in plan.stderr

    apply = topology("apply", "--url", broker.url, "--app", app_path)
    assert apply.exit_code == 1, apply.output
    assert f"! queue {queue}: " in apply.stderr
    assert "cannot change a queue's type in place" in apply.stderr
    assert "everything else was declared" in apply.stderr

    # Untouched: still classic (declaring it as created succeeds), message kept.
    depth = connection.channel().queue_declare(queue, durable=True)
    assert depth.method.message_count == 1
    verify = topology("verify", "--url", broker.url, "--app", app_path)
    assert verify.exit_code == 1
    assert f"! queue {queue}" in verify.stdout
    assert "0 missing, 1 conflicting" in verify.stderr


def test_json_documents_of_plan_apply_and_verify_parse_with_the_same_exit_codes(
    broker: Broker, app_path: str, namespace: str, connection: pika.BlockingConnection
) -> None:
    names = Names(namespace)
    plan = topology("plan", "--url", broker.url, "--app", app_path, "--json")
    assert plan.exit_code == 2, plan.output
    document = json.loads(plan.stdout)  # nothing but the document on stdout
    assert document["command"] == "plan"
    assert document["namespace"] == namespace
    assert document["in_sync"] is False
    assert document["counts"] == {"in_sync": 0, "create": 57, "conflict": 0, "unchecked": 0}
    queues = {o["name"]: o for o in document["objects"] if o["kind"] == "queue"}
    assert queues[names.task_queue("mail.send")]["state"] == "create"
    assert queues[names.task_queue("mail.send")]["ladder"] is False
    assert queues[names.delay_queue(3)]["ladder"] is True
    assert {b["state"] for b in document["bindings"]} == {"create"}
    assert ":guest@" not in plan.stdout  # the node's password is masked

    apply = topology("apply", "--url", broker.url, "--app", app_path, "--json")
    assert apply.exit_code == 0, apply.output
    assert json.loads(apply.stdout)["counts"]["created"] == 57

    verify = topology("verify", "--url", broker.url, "--app", app_path, "--json")
    assert verify.exit_code == 0, verify.output
    assert json.loads(verify.stdout)["in_sync"] is True

    # A conflict: the document names the difference and the remedy, exit 1.
    connection.channel().queue_delete(names.task_queue("mail.send"))
    connection.channel().queue_declare(names.task_queue("mail.send"), durable=True)
    plan = topology("plan", "--url", broker.url, "--app", app_path, "--json")
    assert plan.exit_code == 1, plan.output
    conflict = next(
        o for o in json.loads(plan.stdout)["objects"] if o["name"] == names.task_queue("mail.send")
    )
    assert conflict["state"] == "conflict"
    untyped = untyped_queue_type(connection)
    assert {"argument": "x-queue-type", "wanted": "quorum", "broker": untyped} in conflict[
        "differences"
    ]
    assert conflict["remedy"]
    assert "1 object(s) conflict" in plan.stderr
    apply = topology("apply", "--url", broker.url, "--app", app_path, "--json")
    assert apply.exit_code == 1, apply.output
    assert json.loads(apply.stdout)["counts"]["conflict"] == 1


def test_errors_name_the_problem_without_a_traceback_or_password(tmp_path: Path) -> None:
    spec = tmp_path / "topology.toml"
    spec.write_text('namespace = "x"\n')
    result = topology("plan", "--url", "amqp://ops:hunter2@127.0.0.1:1/", "--file", str(spec))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot connect to the broker at 127.0.0.1:1")
    assert "hunter2" not in result.output
    assert "Traceback" not in result.output


def closed_port_url(password: str = "guest") -> str:
    """A URL of a port nothing listens on: a node that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"amqp://ops:{password}@127.0.0.1:{probe.getsockname()[1]}/"


def test_commands_use_the_first_node_that_answers(
    broker: Broker, app_path: str, namespace: str
) -> None:
    down = closed_port_url()
    apply = topology("apply", "--url", down, "--url", broker.url, "--app", app_path)
    assert apply.exit_code == 0, apply.output
    assert f"on {BrokerURL(broker.url).masked}:" in apply.stdout
    plan = topology("plan", "--url", f"{down},{broker.url}", "--app", app_path)
    assert plan.exit_code == 0, plan.output
    assert plan.stdout.startswith(f"namespace {namespace!r} on {BrokerURL(broker.url).masked}")
    verify = topology("verify", "--app", app_path, env={"BROKER_JOBS_URL": f"{down} {broker.url}"})
    assert verify.exit_code == 0, verify.output
    preflight = topology("preflight", "--url", down, "--url", broker.url, "--namespace", namespace)
    assert preflight.exit_code == 0, preflight.output
    assert preflight.stdout.startswith(f"preflight of {BrokerURL(broker.url).masked}")


def test_no_node_answering_names_each_without_a_password(tmp_path: Path) -> None:
    spec = tmp_path / "topology.toml"
    spec.write_text('namespace = "x"\n')
    first, second = closed_port_url("hunter2"), closed_port_url("hunter2")
    result = topology("verify", "--url", first, "--url", second, "--file", str(spec))
    assert result.exit_code == 1
    for url in (first, second):
        node = BrokerURL(url)
        assert f"{node.host}:{node.port} ({node.masked}): " in result.stderr
    assert "hunter2" not in result.output
    bad = topology("verify", "--url", "amqp://ops:hunter2@mq1,mq2/", "--file", str(spec))
    assert bad.exit_code == 1  # a usage error: 1 in these commands
    assert "a host cannot contain a comma" in bad.output
    assert "hunter2" not in bad.output


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("no_such_module_bj:app", "no module named 'no_such_module_bj'"),
        ("json:app", "module 'json' has no attribute 'app'"),
        ("json:dumps", "is a function, not a broker_jobs.App"),
        ("json", "use MODULE:ATTR"),
    ],
)
def test_app_that_cannot_be_loaded_is_a_clear_error(app: str, message: str) -> None:
    result = topology("verify", "--app", app)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert message in result.stderr


# -- the TOML file --------------------------------------------------------------------


def test_a_topology_file_gives_the_same_model(
    broker: Broker,
    tmp_path: Path,
    namespace: str,
    cleanup_topology: Callable[[Topology], Topology],
) -> None:
    path = tmp_path / "topology.toml"
    path.write_text(
        f'namespace = "{namespace}"\n\n'
        '[tasks."mail.send"]\n\n'
        '[tasks."report.build"]\nqueue_type = "classic"\n\n'
        '[tasks."image.resize"]\ndelivery_limit = 3\n'
    )
    app = App(namespace=namespace)
    app.declare("mail.send", Mail)
    from_file = parse({"namespace": namespace, "tasks": {"mail.send": {}}}, "inline").topology()
    assert from_file == app.topology()  # one model, whichever way it is given

    cleanup_topology(load_file(path).topology())  # should the plan create anything
    result = topology("plan", "--url", broker.url, "--file", str(path))
    assert result.exit_code == 2, result.output
    names = Names(namespace)
    assert f"+ queue {names.task_queue('report.build')} (classic)" in result.stdout
    assert f"+ queue {names.task_queue('image.resize')} (quorum)" in result.stdout
    exported = json.loads(topology("export", "--file", str(path)).stdout)
    limits = {
        queue["name"]: queue["arguments"].get("x-delivery-limit") for queue in exported["queues"]
    }
    assert limits[names.task_queue("image.resize")] == 3
    assert limits[names.task_queue("mail.send")] == 10
    assert limits[names.task_queue("report.build")] is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[tasks."a.b"]\nqueue_typ = "quorum"\n', "unknown key 'queue_typ' in [tasks.\"a.b\"]"),
        ('namespce = "jobs"\n', "unknown key 'namespce' in the top level"),
        ("[ladder]\ndelivery_limit = 3\n", "unknown key 'delivery_limit' in [ladder]"),
        ("[tasks.a.b]\n", 'quote task names that contain dots, e.g. [tasks."a.b"]'),
        ('[tasks."a"]\nqueue_type = "stream"\n', "queue_type must be one of"),
        ('[tasks."a"]\ndelivery_limit = true\n', "delivery_limit must be a whole number"),
        (
            '[tasks."a"]\nqueue_type = "classic"\ndelivery_limit = 3\n',
            "delivery_limit applies to quorum queues only",
        ),
        ('namespace = "a.b"\n', "invalid namespace 'a.b'"),
        ("namespace = [", "not valid TOML"),
    ],
)
def test_a_bad_topology_file_names_the_file_and_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "ops.toml"
    path.write_text(text)
    result = topology("export", "--file", str(path))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {path}")
    assert message in result.stderr


def test_a_missing_topology_file_is_an_error(tmp_path: Path) -> None:
    result = topology("export", "--file", str(tmp_path / "nope.toml"))
    assert result.exit_code == 1
    assert "cannot read topology file" in result.stderr
    with pytest.raises(TopologyFileError, match="must be a table"):
        parse({"tasks": {"a": 1}})


# -- export ---------------------------------------------------------------------------


def test_export_writes_rabbitmq_definitions(app_path: str, namespace: str) -> None:
    result = topology("export", "--app", app_path, "--vhost", "prod")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document) == {"exchanges", "queues", "bindings"}
    assert (len(document["exchanges"]), len(document["queues"])) == (29, 28)
    names = Names(namespace)
    work = next(e for e in document["exchanges"] if e["name"] == names.work_exchange)
    assert work == {
        "name": names.work_exchange,
        "vhost": "prod",
        "type": "topic",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {},
    }
    task = next(q for q in document["queues"] if q["name"] == names.task_queue("mail.send"))
    assert task["type"] == task["arguments"]["x-queue-type"] == "quorum"
    assert task["arguments"]["x-delivery-limit"] == 10
    kinds = {binding["destination_type"] for binding in document["bindings"]}
    assert kinds == {"queue", "exchange"}  # the ladder chains exchanges
    out = next(e for e in document["exchanges"] if e["name"] == names.delay_out_exchange)
    assert out["arguments"] == {"alternate-exchange": names.unroutable_exchange}
    lost = next(e for e in document["exchanges"] if e["name"] == names.unroutable_exchange)
    assert (lost["type"], lost["arguments"]) == ("fanout", {})
    assert {
        "source": names.unroutable_exchange,
        "vhost": "prod",
        "destination": names.unroutable_queue,
        "destination_type": "queue",
        "routing_key": "",
        "arguments": {},
    } in document["bindings"]


@pytest.mark.also_on_rabbitmq_4
def test_exported_definitions_import_into_a_fresh_vhost_in_sync(
    broker: Broker, app_path: str
) -> None:
    node = broker.controllable()
    vhost = f"bj-import-{uuid.uuid4().hex[:8]}"
    path = node.base_dir / f"{vhost}.json"  # where the node's rabbitmqctl can read it
    result = topology("export", "--app", app_path, "--vhost", vhost, "--output", str(path))
    assert result.exit_code == 0, result.output
    assert f"for vhost {vhost!r}" in result.stderr
    node.ctl("add_vhost", vhost)
    try:
        node.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        node.ctl("import_definitions", str(node.inside(path)))
        url = with_credentials(broker.url, "guest", "guest", vhost)
        # RabbitMQ 3.10 imports asynchronously ("Successfully started definition
        # import"): poll until the import has landed.
        deadline = time.monotonic() + 20
        while (verify := topology("verify", "--url", url, "--app", app_path)).exit_code:
            assert time.monotonic() < deadline, verify.output
            time.sleep(0.2)
        assert "in sync" in verify.stdout
    finally:
        node.ctl("delete_vhost", vhost)
        path.unlink(missing_ok=True)


# -- preflight ------------------------------------------------------------------------


@pytest.mark.also_on_rabbitmq_4
def test_preflight_on_this_broker(broker: Broker, namespace: str) -> None:
    result = topology(
        "preflight", "--url", broker.url, "--namespace", namespace, "--max-task-timeout", "600"
    )
    assert result.exit_code == 0, result.output
    assert "ok       server version: RabbitMQ " in result.stdout
    assert "ok       quorum queues: available" in result.stdout
    assert "ok       at-least-once dead-lettering: available" in result.stdout
    assert "consumer_timeout: not readable over AMQP (must exceed 601200 ms" in result.stdout
    assert "rabbitmqctl environment | grep consumer_timeout" in result.stdout


@pytest.mark.also_on_rabbitmq_4
def test_preflight_reads_flags_and_consumer_timeout_with_rabbitmqctl(broker: Broker) -> None:
    node = broker.controllable()
    result = topology(
        "preflight",
        "--url",
        broker.url,
        "--rabbitmqctl",
        rabbitmqctl_command(node),
        "--max-task-timeout",
        "3600",
    )
    assert result.exit_code == 1, result.output
    assert "ok       quorum queues: feature flag quorum_queue is enabled" in result.stdout
    assert "at-least-once dead-lettering: feature flag stream_queue is enabled" in result.stdout
    # The default 30 min is too short for a task of an hour: a problem, with its fix.
    assert "problem  consumer_timeout: 1800000 ms (30 min) is too short" in result.stdout
    assert "to fix: set consumer_timeout = 5460000 in rabbitmq.conf" in result.stdout
    assert "error: 1 problem(s): consumer_timeout" in result.stderr


# -- permissions ----------------------------------------------------------------------


def test_permissions_print_escaped_least_privilege_patterns() -> None:
    names = Names("ns-1")
    publisher = role_permissions(Role.PUBLISHER, names, ["a.b"])
    assert (publisher.configure, publisher.write, publisher.read) == (
        "^$",
        r"^(ns-1\.work|ns-1\.delay\.[0-9]{2})$",
        "^$",
    )
    worker = role_permissions(Role.WORKER, names, ["a.b", "c"])
    # Each task's queue and its lanes' (priority levels, shards), if it has any.
    lanes = r"(@(high|low))?(:[0-9]+)?"
    # And the unroutable delayed jobs it sends on (or puts back: its fanout exchange
    # has the queue's name).
    assert worker.read == (rf"^(ns-1\.unroutable|ns-1\.task\.a\.b{lanes}|ns-1\.task\.c{lanes})$")
    assert worker.write == r"^(ns-1\.work|ns-1\.dead|ns-1\.unroutable|ns-1\.delay\.[0-9]{2})$"
    assert role_permissions(Role.WORKER, names, None).read == r"^(ns-1\.unroutable|ns-1\.task\..+)$"
    beat = role_permissions(Role.BEAT, names, None)
    assert beat.configure == beat.read == r"^ns-1\.beat\.leader$"
    assert beat.write == r"^(ns-1\.work|ns-1\.beat\.leader|ns-1\.delay\.[0-9]{2})$"
    result = topology("permissions", "--role", "publisher", "--namespace", "ns-1")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[-1] == (
        r"rabbitmqctl set_permissions -p / ns-1-publisher '^$'"
        r" '^(ns-1\.work|ns-1\.delay\.[0-9]{2})$' '^$'"
    )


def test_publisher_permissions_allow_publishing_and_nothing_more(
    broker: Broker,
    app_path: str,
    applied: Names,
    namespace: str,
    connection: pika.BlockingConnection,
    user: Callable[[], tuple[str, str]],
) -> None:
    url, _printed = granted_user(broker, user, "--role", "publisher", "--namespace", namespace)

    with Publisher(url, namespace=namespace, declare=False) as publisher:
        job = publisher.publish("mail.send", {"to": "a@example.com"})
        # A delayed job enters the ladder's top level, after a passive check that
        # the task's queue exists: both allowed.
        publisher.publish("mail.send", {"to": "b@example.com"}, delay=60)
    names = Names(namespace)
    queue = names.task_queue("mail.send")
    assert [found.id for found in drain(connection, queue)] == [job.id]
    assert (
        connection.channel().queue_declare(names.delay_queue(5), passive=True).method.message_count
        == 1
    )

    refused = _refused(url, lambda channel: channel.basic_get(queue))
    assert refused.startswith("403 ACCESS_REFUSED")
    assert _refused(url, lambda channel: channel.queue_declare(f"{namespace}.mine"))
    # Passive checks need no permission: verify works, without the settings probe.
    verify = topology("verify", "--url", url, "--app", app_path)
    assert verify.exit_code == 0, verify.output
    assert "57 not checked for settings (no configure permission)" in verify.stdout
    apply = topology("apply", "--url", url, "--app", app_path)
    assert apply.exit_code == 1
    assert "needs configure permission on the namespace" in apply.stderr


def test_routing_to_the_unroutable_queue_needs_no_permission(
    broker: Broker,
    app_path: str,
    applied: Names,
    namespace: str,
    connection: pika.BlockingConnection,
    user: Callable[[], tuple[str, str]],
) -> None:
    """A publisher's job that the ladder's exchanges pass on to delay.out while it
    publishes (a key of zeros) reaches the alternate exchange with the publisher's
    grants alone: no role needs anything on <ns>.unroutable."""
    names = Names(namespace)
    url, printed = granted_user(broker, user, "--role", "publisher", "--namespace", namespace)
    assert "unroutable" not in printed
    with confirming_channel(url) as channel:  # neither refused nor returned
        channel.basic_publish(
            names.delay_exchange(0),
            delay_routing_key(0, "nobody.home"),
            b"{}",
            pika.BasicProperties(delivery_mode=2),
            mandatory=True,
        )
    depth = connection.channel().queue_declare(names.unroutable_queue, passive=True)
    assert depth.method.message_count == 1


@pytest.mark.also_on_rabbitmq_4
def test_worker_permissions_allow_consuming_its_queues_only(
    broker: Broker,
    app_path: str,
    namespace: str,
    connection: pika.BlockingConnection,
    user: Callable[[], tuple[str, str]],
) -> None:
    names = Names(namespace)
    app = App(namespace=namespace)
    app.declare("mail.send", Mail)
    declare(connection, app.topology(ladder=False))
    url, _printed = granted_user(broker, user, "--role", "worker", "--app", app_path)
    with confirming_channel(url) as channel:
        channel.basic_publish(names.work_exchange, "mail.send", b"{}", mandatory=True)
        method, _, _ = channel.basic_get(names.task_queue("mail.send"), auto_ack=True)
        assert method is not None
    dead = names.dead_letter_queue("mail.send")
    assert _refused(url, lambda channel: channel.basic_get(dead)).startswith("403")


def test_worker_permissions_allow_sending_on_unroutable_delayed_jobs(
    broker: Broker,
    app_path: str,
    applied: Names,
    connection: pika.BlockingConnection,
    user: Callable[[], tuple[str, str]],
) -> None:
    """What a worker does at each connection (broker_jobs.worker.rerouting) with the
    printed grants: reads <ns>.unroutable, sends a job whose task has a queue on to
    it, puts back one whose task has none."""
    names = applied
    url, printed = granted_user(broker, user, "--role", "worker", "--app", app_path)
    assert f"jobs back to {names.unroutable_queue}" in printed
    channel = connection.channel()
    for task in ("mail.send", "nobody.home"):  # as the ladder's end sends them there
        key = delay_routing_key(0, task)
        channel.basic_publish(names.unroutable_exchange, key, b"{}", pika.BasicProperties())
    wait_until(
        lambda: (
            channel.queue_declare(names.unroutable_queue, passive=True).method.message_count == 2
        ),
        within=10,
        what="both in the unroutable queue",
    )
    rerouted = reroute(url, names)
    assert (rerouted.moved, rerouted.kept) == ({"mail.send": 1}, {"nobody.home": 1})
    depth = channel.queue_declare(names.task_queue("mail.send"), passive=True)
    assert depth.method.message_count == 1


def test_a_worker_granted_without_the_unroutable_queue_says_so_once_and_consumes(
    broker: Broker,
    applied: Names,
    user: Callable[[], tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker user granted before workers sent unroutable jobs on: the worker is
    refused the queue, says so once, tries again only when it connects again (not
    at each look), and runs its jobs."""
    names = applied
    name, password = user()
    escaped = names.namespace.replace(".", r"\.")
    broker.controllable().ctl(
        *("set_permissions", "-p", "/", name, "^$"),
        rf"^({escaped}\.work|{escaped}\.dead|{escaped}\.delay\.[0-9]{{2}})$",
        rf"^{escaped}\.task\..+$",
    )
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(broker.url))) as admin:
        key = delay_routing_key(0, "nobody.home")
        admin.channel().basic_publish(names.unroutable_exchange, key, b"{}")
    passes: list[object] = []  # reroute called: a pass, or a look that may make one
    looks: list[object] = []  # the worker's looks, each every LOOK_EVERY seconds

    def counted_pass(*args: Any, **kwargs: Any) -> Any:
        passes.append(args)
        return reroute(*args, **kwargs)

    look = rerouting.Rerouting.look

    async def counted_look(self: rerouting.Rerouting) -> None:
        looks.append(self)
        await look(self)

    monkeypatch.setattr(rerouting, "reroute", counted_pass)
    monkeypatch.setattr(rerouting.Rerouting, "look", counted_look)
    monkeypatch.setattr(rerouting, "LOOK_EVERY", 0.05)
    app = App(namespace=names.namespace)
    ran = threading.Event()

    @app.task("mail.send")
    def send(payload: Mail) -> None:
        ran.set()

    with Publisher(broker.url, app) as publisher:
        publisher.publish("mail.send", {"to": "a@example.com"})
    url = with_credentials(broker.url, name, password)
    running = WorkerThread(Worker(url, app, MemoryStore(), WorkerSettings(declare=False)))
    try:
        assert ran.wait(30), "the worker ran nothing"
        wait_until(lambda: len(looks) >= 5, within=30, what="five looks")
    finally:
        running.stop()
    assert len(passes) == 1  # at its connection; none at its looks after the refusal
    refused = [r for r in caplog.records if r.name == rerouting.__name__]
    assert [r.levelno for r in refused] == [logging.WARNING]
    assert "403 ACCESS_REFUSED" in refused[0].getMessage()
    assert "broker-jobs topology permissions --role worker" in refused[0].getMessage()
    with pytest.raises(AccessRefusedError, match="403 ACCESS_REFUSED"):
        reroute(url, names)  # the library's error, as the operator's command meets it


def test_beat_permissions_allow_leading_and_emitting(
    broker: Broker,
    app_path: str,
    applied: Names,
    namespace: str,
    connection: pika.BlockingConnection,
    user: Callable[[], tuple[str, str]],
) -> None:
    """A beat user with the printed permissions declares its election queue and
    exchange, wins the election and emits, on a topology an operator applied."""
    url, _printed = granted_user(broker, user, "--role", "beat", "--namespace", namespace)
    app = App(namespace=namespace)
    app.declare("mail.send", Mail)
    app.schedule("often", "mail.send", every=0.2, payload={"to": "ops@example.com"})
    emitted: list[Job] = []
    beat = Beat(
        url,
        app,
        load_schedules(app),
        MemoryStore(),
        BeatSettings(declare=False),
        on_emitted=lambda schedule, fire, job: emitted.append(job),
    )

    async def until_two_fires() -> None:
        running = asyncio.create_task(beat.run())
        while len(emitted) < 2 and not running.done():
            await asyncio.sleep(0.02)  # polling the fires the callback collects
        beat.stop()
        await running

    asyncio.run(until_two_fires())
    queued = drain(connection, Names(namespace).task_queue("mail.send"))
    assert {job.idempotency_key for job in emitted} <= {job.idempotency_key for job in queued}
    assert all(job.idempotency_key.startswith("beat:often:") for job in queued)


def _refused(url: str, action: Callable[[Any], object]) -> str:
    """The broker's refusal of ``action`` on a channel of ``url``'s user ("" if none)."""
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as conn:
        try:
            action(conn.channel())
        except pika.exceptions.ChannelClosedByBroker as error:
            return f"{error.reply_code} {error.reply_text}"
    return ""
