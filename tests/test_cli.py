"""The ``broker-jobs`` command line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pika
import pika.exceptions
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from broker_jobs import App
from broker_jobs.cli import main
from broker_jobs.cli.options import url_option
from broker_jobs.store import SQLiteStore
from broker_jobs.urls import BrokerURLs
from scheduler.beat import fire_key
from scheduler.config import load_schedules
from scheduler.digests import schedule_digests
from tests.support import Broker, drain
from topology import declare


class Note(BaseModel):
    text: str


def test_version_and_help() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["--version"]).output.startswith("broker-jobs, version ")
    result = runner.invoke(main, ["publish", "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output
    assert "repeat --url or separate URLs with commas" in " ".join(result.output.split())


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


@click.command()
@url_option
def show_urls(url: BrokerURLs) -> None:
    click.echo(" ".join(f"{node.host}:{node.port}" for node in url))


def test_url_is_repeatable_takes_commas_and_the_environment() -> None:
    runner = CliRunner()
    given = ["--url", "amqp://u:p@mq1/,amqp://u:p@mq2:5673/", "--url", "amqps://u:p@mq3/"]
    assert runner.invoke(show_urls, given).output == "mq1:5672 mq2:5673 mq3:5671\n"
    listed = {"BROKER_JOBS_URL": "amqp://u:p@mq1/ amqp://u:p@mq2/,amqp://u:p@mq3/"}
    assert runner.invoke(show_urls, [], env=listed).output == "mq1:5672 mq2:5672 mq3:5672\n"
    assert runner.invoke(show_urls, ["--url", "amqp://mq9/"], env=listed).output == "mq9:5672\n"
    unset = {"BROKER_JOBS_URL": None}
    assert runner.invoke(show_urls, [], env=unset).output == "localhost:5672\n"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["--url", ""], "no broker URL given"),
        (["--url", "amqp://u:hunter2@mq1/", "--url", "http://u:hunter2@mq2/"], "unsupported"),
        (["--url", "amqp://u:hunter2@mq1,mq2/"], "a host cannot contain a comma"),
    ],
)
def test_bad_urls_are_usage_errors_without_the_password(given: list[str], message: str) -> None:
    result = CliRunner().invoke(show_urls, given)
    assert result.exit_code == 2
    assert "Invalid value for '--url'" in result.output
    assert message in result.output
    assert "hunter2" not in result.output


@pytest.mark.broker
def test_publish_goes_to_the_first_node_that_answers(
    broker: Broker, make_app: Callable[[], App], connection: pika.BlockingConnection
) -> None:
    app = make_app()
    app.declare("note.add", Note)
    declare(connection, app.topology(ladder=False))
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        down = f"amqp://u:hunter2@127.0.0.1:{probe.getsockname()[1]}/"
    result = CliRunner().invoke(
        main,
        ["publish", "--url", down, "--url", broker.url, "--namespace", app.namespace,
         "note.add", '{"text": "hi"}'],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (job,) = drain(connection, app.names.task_queue("note.add"))
    assert job.id == result.output.strip()


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


def test_beat_refuses_bad_schedules_at_start_up_naming_each(tmp_path: Path) -> None:
    schedules = tmp_path / "beat.toml"
    schedules.write_text(
        '[[schedule]]\nname = "nightly"\ntask = "report.nope"\ncron = "61 * * * *"\n'
        '[[schedule]]\nname = "often"\ntask = "beat.tick"\nevery = 0\n'
    )
    store = tmp_path / "beat.db"
    result = CliRunner().invoke(
        main,
        [
            "beat",
            "tests.beat_app:app",
            "--schedules",
            str(schedules),
            "--store",
            f"sqlite:///{store}",
        ],
    )
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.splitlines()
    assert lines[0] == "error: 3 schedule problems:"
    assert any(
        line.startswith("  - nightly (") and "unknown task 'report.nope'" in line for line in lines
    )
    assert any(
        line.startswith("  - nightly (") and "invalid cron expression" in line for line in lines
    )
    assert any(
        line.startswith("  - often (") and "every must be positive" in line for line in lines
    )
    assert not store.exists(), "nothing may start before the schedules are valid"


def test_beat_status_shows_the_leader_and_each_schedules_fires(tmp_path: Path) -> None:
    from tests.beat_app import app  # noqa: PLC0415 - the module the command imports too

    schedules = tmp_path / "beat.toml"
    schedules.write_text('[[schedule]]\nname = "hourly"\ntask = "beat.tick"\ncron = "0 * * * *"\n')
    last = datetime(2026, 11, 29, 13, 0, tzinfo=UTC)
    with SQLiteStore(tmp_path / "beat.db") as store:
        store.record_fire(fire_key(app.namespace, "hourly"), last)
        store.record_leader(app.namespace, "host-a:42", last - timedelta(minutes=5))
    result = CliRunner().invoke(
        main,
        [
            "beat", "status", "tests.beat_app:app",
            "--schedules", str(schedules), "--store", f"sqlite:///{tmp_path / 'beat.db'}",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    leader, agreement, header, row = result.output.splitlines()
    assert leader.startswith("leader: host-a:42 since 2026-11-29T12:55:00Z")
    assert agreement == "leader's schedules: not recorded (a beat of an older broker-jobs)"
    assert header.split()[:3] == ["schedule", "task", "when"]
    assert row.split()[:6] == ["hourly", "beat.tick", "cron", "0", "*", "*"]
    assert "2026-11-29T13:00:00Z" in row


def test_beat_status_shows_how_the_schedules_differ_from_the_leaders(tmp_path: Path) -> None:
    from tests.beat_app import app  # noqa: PLC0415 - the module the command imports too

    def toml(*entries: tuple[str, str]) -> str:
        return "".join(
            f'[[schedule]]\nname = "{name}"\ntask = "beat.tick"\ncron = "{cron}"\n'
            for name, cron in entries
        )

    ours = tmp_path / "ours.toml"
    ours.write_text(toml(("hourly", "0 * * * *"), ("nightly", "0 3 * * *"), ("new", "*/5 * * * *")))
    theirs = tmp_path / "theirs.toml"
    theirs.write_text(toml(("hourly", "0 * * * *"), ("nightly", "0 4 * * *"), ("old", "0 0 * * 0")))
    leaders = schedule_digests(load_schedules(app, [theirs]))
    with SQLiteStore(tmp_path / "beat.db") as store:
        store.record_leader(app.namespace, "host-b:7", datetime.now(UTC), schedules=leaders)

    def status(schedules: Path, *extra: str) -> str:
        result = CliRunner().invoke(
            main,
            [
                "beat", "status", "tests.beat_app:app", *extra,
                "--schedules", str(schedules), "--store", f"sqlite:///{tmp_path / 'beat.db'}",
            ],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        return result.output

    lines = status(ours).splitlines()
    assert lines[1] == "leader's schedules: hourly, nightly, old"
    assert lines[2] == (
        "  differ from these: only here: new; only on the leader: old; defined differently:"
        " nightly; only the leader's fire: deploy the same schedules to every beat"
    )
    document = json.loads(status(ours, "--json"))
    assert document["leader"]["schedules"] == dict(sorted(leaders.items()))
    assert document["mismatch"] == {
        "only_here": ["new"],
        "only_on_leader": ["old"],
        "defined_differently": ["nightly"],
    }
    assert {s["name"]: s["digest"] for s in document["schedules"]}["hourly"] == leaders["hourly"]

    same = status(theirs).splitlines()
    assert same[1] == "leader's schedules: hourly, nightly, old (the same as these)"
    assert json.loads(status(theirs, "--json"))["mismatch"] == {
        "only_here": [],
        "only_on_leader": [],
        "defined_differently": [],
    }


def test_beat_status_takes_the_app_as_an_option_and_prints_json(tmp_path: Path) -> None:
    from tests.beat_app import app  # noqa: PLC0415 - the module the command imports too

    schedules = tmp_path / "beat.toml"
    schedules.write_text('[[schedule]]\nname = "hourly"\ntask = "beat.tick"\ncron = "0 * * * *"\n')
    last = datetime(2026, 11, 29, 13, 0, tzinfo=UTC)
    with SQLiteStore(tmp_path / "beat.db") as store:
        store.record_fire(fire_key(app.namespace, "hourly"), last)
        store.record_leader(app.namespace, "host-a:42", last - timedelta(minutes=5), now=last)
    result = CliRunner().invoke(
        main,
        [
            "beat", "status", "--app", "tests.beat_app:app", "--json",
            "--schedules", str(schedules), "--store", f"sqlite:///{tmp_path / 'beat.db'}",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["namespace"] == app.namespace
    assert document["leader"] == {
        "identity": "host-a:42",
        "since": "2026-11-29T12:55:00Z",
        "seen_at": "2026-11-29T13:00:00Z",
        "stale": True,  # last seen long before the command ran
        "schedules": None,  # recorded without them
    }
    assert document["mismatch"] is None
    hourly = next(s for s in document["schedules"] if s["name"] == "hourly")
    assert (hourly["task"], hourly["catch_up"], hourly["last_fire"]) == (
        "beat.tick",
        "all",  # the default policy
        "2026-11-29T13:00:00Z",
    )
    assert datetime.fromisoformat(hourly["next_fire"]) > datetime.now(UTC)

    both = CliRunner().invoke(main, ["beat", "status", "tests.beat_app:app", "--app", "x:y"])
    assert both.exit_code == 2
    assert "two apps given" in both.output


def test_beat_status_refuses_a_ledger_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    result = CliRunner().invoke(
        main, ["beat", "status", "tests.beat_app:app", "--store", f"sqlite:///{missing}"]
    )
    assert result.exit_code == 1
    assert "no ledger at" in result.output
    assert "--store or BROKER_JOBS_STORE" in result.output
    assert not missing.exists(), "a read-only command must not create an empty ledger"


def _commands(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):  # the top level imports them here
            sub = command.get_command(context, name)
            assert sub is not None, name
            yield from _commands(sub, (*path, name))


def test_every_command_and_option_has_help_text() -> None:
    missing = []
    for path, command in _commands(main):
        if not command.help:
            missing.append(f"{' '.join(path)}: no help")
        missing += [
            f"{' '.join(path)} {param.opts[0]}"
            for param in command.params
            if isinstance(param, click.Option) and not param.hidden and not param.help
        ]
    assert len(list(_commands(main))) > 20  # every group was walked
    assert missing == []


def test_a_command_imports_only_its_own_module() -> None:
    """A worker's process (started once per process, many times a day) does not pay
    for the dashboard's web stack or the other commands."""
    probe = (
        "import sys\n"
        "from broker_jobs.cli import main\n"
        "main(['worker', '--help'], standalone_mode=False)\n"
        "loaded = [m for m in ('broker_jobs.cli.dashboard', 'starlette', 'jinja2',"
        " 'broker_jobs.cli.beat', 'broker_jobs.cli.exporter') if m in sys.modules]\n"
        "assert 'broker_jobs.cli.worker' in sys.modules\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).parent.parent,
    )
    assert done.returncode == 0, done.stderr


def test_dash_h_is_help_everywhere() -> None:
    for command in ([], ["worker"], ["beat"], ["topology", "plan"], ["publish"]):
        result = CliRunner().invoke(main, [*command, "-h"])
        assert result.exit_code == 0, (command, result.output)
        assert "Usage:" in result.output


@pytest.mark.broker
def test_publish_with_the_app_validates_delays_and_prints_json(
    broker: Broker, connection: pika.BlockingConnection, cleanup_topology: Callable[..., object]
) -> None:
    from tests.cli_publish_app import app  # noqa: PLC0415 - what --app imports too

    cleanup_topology(app.topology())
    runner = CliRunner()
    base = ["publish", "--url", broker.url, "--app", "tests.cli_publish_app:app"]
    invalid = runner.invoke(main, [*base, "note.add", '{"text": 5}'])
    assert invalid.exit_code == 1
    assert "payload for task 'note.add' is invalid" in invalid.output
    before = datetime.now(UTC)
    result = runner.invoke(main, [*base, "--delay", "60", "--json", "note.add", '{"text": "hi"}'])
    assert result.exit_code == 0, result.output
    job = json.loads(result.output)
    assert job["task"] == "note.add"
    due = datetime.fromisoformat(job["due_at"])
    assert before + timedelta(seconds=59) < due < datetime.now(UTC) + timedelta(seconds=61)
    eta = runner.invoke(main, [*base, "--eta", "2030-01-01T00:00:00", "note.add", "{}"])
    assert eta.exit_code == 2
    assert "no time zone" in eta.output
    assert not drain(connection, app.names.task_queue("note.add")), "delayed: in the ladder"


@pytest.mark.broker
def test_publish_without_an_app_declares_nothing_and_names_the_namespace(
    broker: Broker,
    namespace: str,
    connection: pika.BlockingConnection,
    make_app: Callable[[], App],
) -> None:
    runner = CliRunner()
    missing = runner.invoke(
        main, ["publish", "--url", broker.url, "--namespace", namespace, "note.add", "{}"]
    )
    assert missing.exit_code == 1
    assert "topology apply" in missing.output
    assert f"namespace {namespace!r}" in missing.output  # perhaps not the one meant
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        channel.exchange_declare(f"{namespace}.work", passive=True)  # nothing left behind
    app = make_app()
    app.declare("note.add", Note)
    declare(connection, app.topology(ladder=False))
    unroutable = runner.invoke(
        main, ["publish", "--url", broker.url, "--namespace", app.namespace, "note.typo", "{}"]
    )
    assert unroutable.exit_code == 1
    assert f"namespace {app.namespace!r}" in unroutable.output


def test_the_worker_takes_its_app_as_app_or_as_its_argument() -> None:
    runner = CliRunner()
    neither = runner.invoke(main, ["worker", "--burst"])
    assert neither.exit_code == 2
    assert "add --app MODULE:APP" in neither.output
    both = runner.invoke(main, ["worker", "a:app", "--app", "b:app"])
    assert both.exit_code == 2
    assert "two apps given" in both.output
    for args in (["--app", "no_such_module:app"], ["no_such_module:app"]):
        result = runner.invoke(main, ["worker", *args, "--store", "memory://"])
        assert result.exit_code == 1
        assert "--app 'no_such_module:app': no module named 'no_such_module'" in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["worker", "--nosuch"], "error: No such option '--nosuch' (see 'broker-jobs worker -"),
        (["nosuch"], "error: No such command 'nosuch' (see 'broker-jobs --help')"),
        (["jobs", "show"], "error: Missing argument 'ID_OR_KEY' (see 'broker-jobs jobs show -"),
        (
            ["status", "--url", "amqp://u:hunter2@mq1,mq2/"],
            "error: Invalid value for '--url': broker URL 'amqp://u:***@mq1,mq2/'",
        ),
        # A worker's numbers out of range: before, --lease 0 started a worker whose
        # every claim failed, and the others gave a traceback.
        (
            ["worker", "tests.cli_publish_app:app", "--lease", "0"],
            "error: Invalid value for '--lease': 0.0 is not in the range x>0",
        ),
        (
            ["worker", "tests.cli_publish_app:app", "--grace", "-1"],
            "error: Invalid value for '--grace': -1.0 is not in the range x>=0",
        ),
        (
            ["worker", "tests.cli_publish_app:app", "--concurrency", "0"],
            "error: Invalid value for '--concurrency': 0 is not in the range x>=1",
        ),
        (
            ["worker", "tests.cli_publish_app:app", "--concurrency", "4", "--prefetch", "2"],
            "error: prefetch (2) must be at least the concurrency (4)",
        ),
    ],
)
def test_usage_errors_are_one_line_with_where_to_look(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(main, args, prog_name="broker-jobs")
    assert result.exit_code == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(expected), line
    assert "hunter2" not in line


def test_a_group_without_its_command_prints_its_help() -> None:
    result = CliRunner().invoke(main, ["dlq"], prog_name="broker-jobs")
    assert result.exit_code == 2
    assert "Usage: broker-jobs dlq" in result.stderr
    assert "replay" in result.stderr


def test_broker_jobs_app_names_the_app_of_publish_and_topology_too(tmp_path: Path) -> None:
    env = {"BROKER_JOBS_APP": "tests.cli_publish_app:app"}
    runner = CliRunner()
    exported = runner.invoke(main, ["topology", "export", "--vhost", "/"], env=env)
    assert exported.exit_code == 0, exported.output
    queues = {queue["name"] for queue in json.loads(exported.stdout)["queues"]}
    assert "clipublish.task.note.add" in queues
    # An explicit --file wins over the environment's app.
    spec = tmp_path / "topology.toml"
    spec.write_text('namespace = "fromfile"\n[tasks."x.y"]\n')
    from_file = runner.invoke(main, ["topology", "export", "--file", str(spec)], env=env)
    assert from_file.exit_code == 0, from_file.output
    assert "fromfile.task.x.y" in {q["name"] for q in json.loads(from_file.stdout)["queues"]}
    # publish validates against the environment's app before it connects anywhere.
    invalid = runner.invoke(
        main, ["publish", "--url", "amqp://127.0.0.1:1/", "note.add", '{"text": 5}'], env=env
    )
    assert invalid.exit_code != 0
    assert "note.add" in invalid.stderr
    assert "text" in invalid.stderr


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("30", 30.0), ("2.5", 2.5), ("5m", 300.0), ("1h30m", 5400.0), ("1d", 86400.0)],
)
def test_a_delay_is_seconds_or_a_duration_as_beats_schedules_take_it(
    given: str, seconds: float
) -> None:
    """`publish --delay 5m` was "'5m' is not a valid float range" while a schedule's
    TOML took "5m"."""
    from broker_jobs.cli.options import Duration  # noqa: PLC0415

    assert Duration().convert(given, None, None) == seconds


@pytest.mark.parametrize("given", ["-3", "abc", "nan", "5 parsecs"])
def test_a_delay_that_is_no_duration_is_a_usage_error(given: str) -> None:
    result = CliRunner().invoke(
        main, ["publish", "x.y", "{}", "--delay", given], prog_name="broker-jobs"
    )
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: Invalid value for '--delay'"), line
