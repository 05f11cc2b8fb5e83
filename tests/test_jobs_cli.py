"""``broker-jobs jobs list / show / cancel`` against the ledger, on SQLite and
PostgreSQL. The ledger's state is set up through the Store API with fixed times."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from broker_jobs import Job
from broker_jobs.cli import main
from broker_jobs.store import ClaimOutcome, Status, Store, open_store
from broker_jobs.store.base import Output, json_text

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LEASE = 300.0
A, B = "worker-a", "worker-b"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(key: str, task: str = "mail.send", attempt: int = 1, **fields: Any) -> Job:
    return Job(id=f"id-{key}", task=task, idempotency_key=key, attempt=attempt, **fields)


def jobs(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(main, ["jobs", *args], env=env)


def json_of(result: Result, code: int = 0) -> Any:
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A ledger's URL: an SQLite file, or a PostgreSQL schema of its own (dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"  # four slashes: an absolute path
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"cli_{uuid.uuid4().hex[:12]}"
    yield f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    import psycopg  # noqa: PLC0415 - only the PostgreSQL runs need it

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def ledger(store_url: str) -> Iterator[Store]:
    """The store the commands read, for setting up its state (it creates the file)."""
    with open_store(store_url) as store:
        yield store


def run_to(store: Store, key: str, outcome: str, start: float, task: str = "mail.send") -> None:
    """Claim ``key`` at ``start`` and record ``outcome`` one second later."""
    store.claim(job(key, task), A, LEASE, now=at(start))
    if outcome == "succeeded":
        store.succeed(key, A, now=at(start + 1))
    elif outcome == "failed":
        store.fail(key, A, "ValueError: bad address", now=at(start + 1))
    elif outcome == "retrying":
        store.retry(key, A, "TimeoutError: smtp", due_at=at(60), now=at(start + 1))
    elif outcome == "dead":
        store.dead(key, A, "exhausted", now=at(start + 1))


#: Newest updated first; ties (tie-a, tie-b at 12 s) by key descending.
ORDER = [
    "tie-b",
    "tie-a",
    "thumb-4",
    "thumb-3",
    "thumb-2",
    "thumb-1",
    "order-3",
    "order-2",
    "order-1",
]


@pytest.fixture
def listed(ledger: Store) -> Store:
    """Nine jobs of two tasks in every state, updated at distinct times but two."""
    ledger.record_published([job("order-1")], now=at(1))  # queued
    run_to(ledger, "order-2", "succeeded", 2)  # updated at 3
    run_to(ledger, "order-3", "failed", 4, task="image.resize")  # 5
    run_to(ledger, "thumb-1", "retrying", 6, task="image.resize")  # 7
    run_to(ledger, "thumb-2", "dead", 8, task="image.resize")  # 9
    ledger.record_published([job("thumb-3", due_at=at(3600))], now=at(10))  # scheduled
    ledger.claim(job("thumb-4"), A, LEASE, now=at(11))  # running
    ledger.record_published([job("tie-a"), job("tie-b")], now=at(12))
    return ledger


#: A cursor whose time has no zone (the shape of a real one otherwise).
NAIVE_CURSOR = base64.urlsafe_b64encode(b'["2026-03-01T12:00:10","k"]').decode().rstrip("=")


def keys(document: dict[str, Any]) -> list[str]:
    return [record["idempotency_key"] for record in document["jobs"]]


# -- list ----------------------------------------------------------------------------


def test_list_shows_every_job_newest_first_with_its_fields(listed: Store, store_url: str) -> None:
    document = json_of(jobs("list", "--store", store_url, "--json"))
    assert keys(document) == ORDER
    assert document["next"] is None
    by_key = {record["idempotency_key"]: record for record in document["jobs"]}
    assert by_key["thumb-1"] == {
        "idempotency_key": "thumb-1",
        "job_id": "id-thumb-1",
        "task": "image.resize",
        "state": "retrying",
        "attempts": 1,
        "created_at": "2026-03-01T12:00:06Z",
        "updated_at": "2026-03-01T12:00:07Z",
        "worker": A,
        "lease_until": None,
        "due_at": "2026-03-01T12:01:00Z",
        "last_error": "TimeoutError: smtp",
        "released": False,
    }
    assert by_key["thumb-3"]["state"] == "scheduled"
    assert by_key["thumb-3"]["due_at"] == "2026-03-01T13:00:00Z"
    assert by_key["thumb-4"]["lease_until"] == "2026-03-01T12:05:11Z"

    people = jobs("list", "--store", store_url)
    assert people.exit_code == 0, people.output
    rows = [line.split() for line in people.stdout.splitlines()]
    assert [row[0] for row in rows if row and row[0] in ORDER] == ORDER
    thumb = next(row for row in rows if row and row[0] == "thumb-1")
    assert thumb[:7] == [
        "thumb-1",
        "image.resize",
        "retrying",
        "1",
        "2026-03-01T12:00:07Z",
        A,
        "2026-03-01T12:01:00Z",
    ]
    assert "TimeoutError: smtp" in people.stdout
    assert "more:" not in people.stdout


def test_values_from_messages_are_printed_with_their_control_characters_escaped(
    ledger: Store, store_url: str
) -> None:
    ledger.record_published([job("evil\x1b[2J\nkey")], now=at(1))
    listed = jobs("list", "--store", store_url)
    shown = jobs("show", "evil\x1b[2J\nkey", "--store", store_url)
    for result in (listed, shown):
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.stdout
        assert "evil\\x1b[2J\\nkey" in result.stdout


def test_a_job_given_back_at_a_stop_is_listed_as_queued_not_running(
    listed: Store, store_url: str
) -> None:
    listed.release("thumb-4", A, now=at(13))  # claimed, then its worker stopped

    queued = json_of(jobs("list", "--store", store_url, "--state", "queued", "--json"))
    # (a release is no change of status: it keeps its claim's updated_at, 11)
    assert keys(queued) == ["tie-b", "tie-a", "thumb-4", "order-1"]
    assert queued["jobs"][2]["state"] == "queued"
    assert queued["jobs"][2]["released"] is True
    assert keys(json_of(jobs("list", "--store", store_url, "--state", "running", "--json"))) == []
    people = jobs("list", "--store", store_url, "--key", "thumb-4")
    assert people.exit_code == 0, people.output
    assert "queued (released)" in people.stdout
    shown = jobs("show", "thumb-4", "--store", store_url)
    assert "queued (released)" in shown.stdout


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--task", "image.resize"], ["thumb-2", "thumb-1", "order-3"]),
        (["--state", "retrying"], ["thumb-1"]),
        (["--state", "QUEUED"], ["tie-b", "tie-a", "order-1"]),
        (["--key", "thumb-"], ["thumb-4", "thumb-3", "thumb-2", "thumb-1"]),
        (["--key", "thumb_"], []),  # _ is a plain character, not a wildcard
        # --since is inclusive, --until exclusive
        (["--since", "2026-03-01T12:00:05Z", "--until", "2026-03-01T12:00:10Z"],
         ["thumb-2", "thumb-1", "order-3"]),
        (["--since", "2026-03-01T13:00:09+01:00"], ["tie-b", "tie-a", "thumb-4", "thumb-3",
                                                   "thumb-2"]),
        (["--task", "mail.send", "--state", "queued", "--key", "tie"], ["tie-b", "tie-a"]),
    ],
)  # fmt: skip
def test_list_filters(
    listed: Store, store_url: str, options: list[str], expected: list[str]
) -> None:
    assert keys(json_of(jobs("list", "--store", store_url, "--json", *options))) == expected


def test_list_pages_through_every_job_with_the_cursor(listed: Store, store_url: str) -> None:
    for limit, filters in [
        (2, []),
        (1, []),
        (3, ["--task", "mail.send"]),
        (2, ["--oldest-first"]),
    ]:
        seen: list[str] = []
        pages = 0
        after: list[str] = []
        while True:
            document = json_of(
                jobs(
                    "list", "--store", store_url, "--json", "--limit", str(limit), *filters, *after
                )
            )
            pages += 1
            assert len(document["jobs"]) <= limit
            seen += keys(document)
            if document["next"] is None:
                break
            after = ["--after", document["next"]]
        everything = keys(json_of(jobs("list", "--store", store_url, "--json", *filters)))
        assert seen == everything, (limit, filters)  # each once, in order, ties included
        assert pages == -(-len(everything) // limit)


def test_list_oldest_first_is_newest_first_reversed(listed: Store, store_url: str) -> None:
    newest = keys(json_of(jobs("list", "--store", store_url, "--json")))
    oldest = keys(json_of(jobs("list", "--store", store_url, "--json", "--oldest-first")))
    assert len(newest) > 2
    assert oldest == newest[::-1]


def test_list_for_people_prints_the_cursor_of_the_next_page(listed: Store, store_url: str) -> None:
    first = jobs("list", "--store", store_url, "--limit", "4")
    assert first.exit_code == 0, first.output
    (more,) = [line for line in first.stdout.splitlines() if line.startswith("more:")]
    token = more.split("--after ")[1].split()[0]
    assert token == json_of(jobs("list", "--store", store_url, "--limit", "4", "--json"))["next"]
    second = json_of(jobs("list", "--store", store_url, "--json", "--limit", "4", "--after", token))
    assert keys(second) == ORDER[4:8]


def test_list_of_a_task_the_ledger_never_had_says_so_and_its_tasks(
    listed: Store, store_url: str
) -> None:
    """A typo in --task printed "no jobs match", as for a task with no job in that
    state: now it names the ledger's tasks and the likely one."""
    typo = jobs("list", "--store", store_url, "--task", "image.resise")
    assert typo.exit_code == 0, typo.output
    assert typo.stdout.strip() == (
        "no jobs match: this ledger has no job of task 'image.resise' (did you mean"
        " 'image.resize'?); its tasks: image.resize, mail.send"
    )
    known = jobs("list", "--store", store_url, "--task", "image.resize", "--state", "queued")
    assert known.stdout.strip() == "no jobs match"  # the task is there, not in that state


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--until", "2026-03-01T12:00:10"], "has no time zone"),
        (["--since", "yesterday"], "is not an ISO 8601 time"),
        (["--after", "not-a-cursor"], "is not a cursor printed by"),
        (["--after", NAIVE_CURSOR], "is not a cursor printed by"),
        (["--state", "sleeping"], "Invalid value for '--state'"),
        (["--limit", "0"], "Invalid value for '--limit'"),
    ],
)
def test_list_usage_errors(ledger: Store, store_url: str, options: list[str], message: str) -> None:
    result = jobs("list", "--store", store_url, *options)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


# -- show ------------------------------------------------------------------------------


def test_show_lists_every_execution_by_key_or_job_id(ledger: Store, store_url: str) -> None:
    ledger.claim(job("invoice-42"), A, LEASE, now=at(0))
    ledger.retry("invoice-42", A, "ConnectionError: flaky\nTraceback ...", due_at=at(10), now=at(2))
    ledger.claim(job("invoice-42", attempt=2), B, LEASE, now=at(10))
    ledger.succeed("invoice-42", B, now=at(10.5))

    by_key = json_of(jobs("show", "invoice-42", "--store", store_url, "--json"))
    assert by_key["job"]["state"] == "succeeded"
    assert by_key["job"]["attempts"] == 2
    assert by_key["executions"] == [
        {
            "attempt": 1,
            "worker": A,
            "started_at": "2026-03-01T12:00:00Z",
            "finished_at": "2026-03-01T12:00:02Z",
            "duration_seconds": 2.0,
            "outcome": "retrying",
            "error": "ConnectionError: flaky\nTraceback ...",
        },
        {
            "attempt": 2,
            "worker": B,
            "started_at": "2026-03-01T12:00:10Z",
            "finished_at": "2026-03-01T12:00:10.500000Z",
            "duration_seconds": 0.5,
            "outcome": "succeeded",
            "error": None,
        },
    ]
    assert json_of(jobs("show", "id-invoice-42", "--store", store_url, "--json")) == by_key

    people = jobs("show", "id-invoice-42", "--store", store_url)
    assert people.exit_code == 0, people.output
    lines = people.stdout.splitlines()
    assert "key:         invoice-42" in lines
    assert "state:       succeeded" in lines
    rows = [line.split() for line in lines]
    assert ["1", A, "2026-03-01T12:00:00Z", "2026-03-01T12:00:02Z", "2.0s", "retrying"] in [
        row[:6] for row in rows
    ]
    assert ["2", B, "2026-03-01T12:00:10Z", "2026-03-01T12:00:10Z", "500ms", "succeeded", "-"] in [
        row[:7] for row in rows
    ]


def test_show_a_job_never_claimed_and_a_running_one(ledger: Store, store_url: str) -> None:
    ledger.record_published([job("waiting")], now=at(0))
    ledger.claim(job("busy"), A, LEASE, now=at(1))

    waiting = jobs("show", "waiting", "--store", store_url)
    assert waiting.exit_code == 0, waiting.output
    assert "state:       queued" in waiting.stdout
    assert "executions: none (no worker has claimed it)" in waiting.stdout
    assert json_of(jobs("show", "waiting", "--store", store_url, "--json"))["executions"] == []

    (running,) = json_of(jobs("show", "busy", "--store", store_url, "--json"))["executions"]
    assert (running["finished_at"], running["duration_seconds"], running["outcome"]) == (
        None,
        None,
        None,
    )
    assert "running" in jobs("show", "busy", "--store", store_url).stdout


def test_show_an_unknown_job_exits_1_with_a_hint(ledger: Store, store_url: str) -> None:
    result = jobs("show", "nope", "--store", store_url, "--json")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: no job with key or id 'nope' in the ledger")
    assert "published with the ledger" in result.stderr
    assert len(result.stderr.splitlines()) == 1


# -- cancel ----------------------------------------------------------------------------


def cancel(store_url: str, ref: str, code: int) -> dict[str, Any]:
    document: dict[str, Any] = json_of(jobs("cancel", ref, "--store", store_url, "--json"), code)
    return document


def test_cancel_a_queued_a_scheduled_and_a_retrying_job(ledger: Store, store_url: str) -> None:
    now = datetime.now(UTC)
    ledger.record_published([job("queued")], now=now)
    ledger.record_published([job("delayed", due_at=now + timedelta(hours=1))], now=now)
    ledger.claim(job("retried"), A, LEASE, now=now)
    ledger.retry("retried", A, "TimeoutError", due_at=now + timedelta(minutes=5), now=now)
    assert ledger.get("delayed").status is Status.SCHEDULED  # type: ignore[union-attr]

    people = jobs("cancel", "queued", "--store", store_url)
    assert people.exit_code == 0, people.output
    assert people.stdout.startswith("cancelled: job 'queued' (mail.send) will not run")
    document = cancel(store_url, "id-delayed", 0)  # by job id
    assert document["outcome"] == "cancelled"
    assert document["job"]["idempotency_key"] == "delayed"
    assert document["job"]["state"] == "cancelled"
    assert document["job"]["due_at"] is None
    assert cancel(store_url, "retried", 0)["outcome"] == "cancelled"

    for key, attempt in [("queued", 1), ("delayed", 1), ("retried", 2)]:
        record = ledger.get(key)
        assert record is not None
        assert record.status is Status.CANCELLED, key
        claim = ledger.claim(job(key, attempt=attempt), B, LEASE)
        assert claim.outcome is ClaimOutcome.CANCELLED, key  # a worker acks it unrun

    again = jobs("cancel", "queued", "--store", store_url)
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("already cancelled: job 'queued'")
    assert "nothing changed" in again.stdout
    assert cancel(store_url, "delayed", 0)["outcome"] == "already-cancelled"


def test_cancel_leaves_a_running_job_running_and_a_finished_one_finished(
    ledger: Store, store_url: str
) -> None:
    ledger.claim(job("busy"), A, LEASE)
    run_to(ledger, "done", "succeeded", 0)

    people = jobs("cancel", "busy", "--store", store_url)
    assert people.exit_code == 3, people.output
    assert people.stdout.startswith(f"running: job 'busy' (mail.send) attempt 1 is claimed by {A}")
    assert "waiting for a handler thread" in people.stdout  # claimed need not mean started
    document = cancel(store_url, "busy", 3)
    assert (document["outcome"], document["job"]["state"]) == ("running", "running")
    record = ledger.get("busy")
    assert record is not None
    assert (record.status, record.worker) == (Status.RUNNING, A)
    ledger.succeed("busy", A)  # the holder still records its outcome

    finished = jobs("cancel", "done", "--store", store_url)
    assert finished.exit_code == 3, finished.output
    assert finished.stdout.startswith("finished: job 'done' (mail.send) is succeeded already")
    assert cancel(store_url, "busy", 3)["outcome"] == "finished"


def test_cancel_an_unknown_job_exits_1_with_a_hint(ledger: Store, store_url: str) -> None:
    people = jobs("cancel", "nope", "--store", store_url)
    assert people.exit_code == 1
    assert people.stdout == ""
    assert people.stderr.startswith("error: no job with key or id 'nope' in the ledger")
    assert "published with the ledger" in people.stderr
    assert cancel(store_url, "nope", 1) == {"outcome": "unknown", "job": None}


# -- the store ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["list"], ["list", "--json"], ["show", "k"], ["cancel", "k"]])
@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_missing_sqlite_ledger_is_refused_not_created(
    tmp_path: Path, command: list[str], how: str
) -> None:
    path = tmp_path / "typo.db"
    url = f"sqlite:///{path}"
    if how == "option":
        result = jobs(*command, "--store", url)
    else:
        result = jobs(*command, env={"BROKER_JOBS_STORE": url})
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: no ledger at {url!r}")
    assert "--store" in result.stderr
    assert "BROKER_JOBS_STORE" in result.stderr
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []  # no -wal or -journal file either


def test_a_store_error_is_one_line_with_the_password_masked() -> None:
    url = "postgresql://app:s3cret@127.0.0.1:1/db?connect_timeout=2"
    result = jobs("list", "--store", url)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.splitlines()) == 1
    assert "s3cret" not in result.output


def test_every_command_has_help_with_an_example() -> None:
    for command in ["list", "show", "cancel"]:
        result = jobs(command, "-h")
        assert result.exit_code == 0, result.output
        assert "Example:" in result.output
        assert "--store" in result.output


def test_show_prints_the_payload_the_ledger_keeps(ledger: Store, store_url: str) -> None:
    note = {"to": "ann@example.com", "body": "<b>hi</b>\x1b[31m"}
    ledger.record_published([job("kept", payload=note)], now=at(0))
    ledger.claim(job("failed", payload=note), A, LEASE, now=at(0))
    ledger.fail("failed", A, "boom", now=at(1), payload=note)
    ledger.claim(job("plain"), A, LEASE, now=at(0))

    for key in ("kept", "failed"):
        document = json_of(jobs("show", key, "--store", store_url, "--json"))
        assert document["payload"]["payload"] == note
        assert document["payload"]["too_large"] is False
        shown = jobs("show", key, "--store", store_url)
        assert shown.exit_code == 0, shown.output
        assert 'payload:     {\n               "to": "ann@example.com",' in shown.stdout
        assert "\\u001b[31m" in shown.stdout  # a terminal escape is printed escaped
        assert "\x1b" not in shown.stdout
    plain = jobs("show", "plain", "--store", store_url)
    assert "payload:     not kept: the ledger keeps a job's payload when it was published" in (
        plain.stdout
    )
    assert json_of(jobs("show", "plain", "--store", store_url, "--json"))["payload"] is None


def test_show_says_a_payload_was_too_large_to_keep(ledger: Store, store_url: str) -> None:
    ledger.record_published([job("big", payload={"blob": "x" * 70_000})], now=at(0))
    assert "payload:     Too large to keep: its JSON is 70,011 bytes" in (
        jobs("show", "big", "--store", store_url).stdout
    )
    document = json_of(jobs("show", "big", "--store", store_url, "--json"))["payload"]
    assert (document["payload"], document["too_large"], document["bytes"]) == (None, True, 70_011)


def test_show_prints_the_result_and_the_follow_ups_the_ledger_keeps(
    ledger: Store, store_url: str
) -> None:
    follow_up = job("kept>1", task="mail.next")
    ledger.claim(job("kept"), A, LEASE, now=at(0))
    ledger.succeed("kept", A, now=at(1), output=Output(json_text({"sent": 3}), (follow_up,)))
    ledger.claim(job("plain"), A, LEASE, now=at(0))
    ledger.succeed("plain", A, now=at(1))

    shown = jobs("show", "kept", "--store", store_url)
    assert shown.exit_code == 0, shown.output
    assert 'result:      {\n               "sent": 3\n             }' in shown.stdout
    assert "follow-ups:  1, not confirmed yet: the job's next delivery publishes them" in (
        shown.stdout
    )
    assert f"mail.next key kept>1 (id {follow_up.id})" in shown.stdout
    document = json_of(jobs("show", "kept", "--store", store_url, "--json"))
    assert document["result"]["value"] == {"sent": 3}
    assert document["follow_ups"]["jobs"][0]["idempotency_key"] == "kept>1"
    plain = json_of(jobs("show", "plain", "--store", store_url, "--json"))
    assert (plain["result"], plain["follow_ups"]) == (None, {"jobs": [], "sent_at": None})
    assert "result:      none kept" in jobs("show", "plain", "--store", store_url).stdout
