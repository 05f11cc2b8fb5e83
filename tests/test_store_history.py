"""Job history: every execution of a job (one per claim that ran it) on every store,
with fixed clocks; the version 1 -> 2 migration of SQLite and PostgreSQL; and a real
worker whose job fails once, then succeeds.

The stores and their fixtures are those of ``tests/test_store.py``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from broker_jobs import App, Job, Publisher
from broker_jobs.cli import main
from broker_jobs.cli import worker as worker_cli
from broker_jobs.retry import RetryPolicy
from broker_jobs.store import (
    Execution,
    ExecutionOutcome,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    Store,
    StoreError,
)
from broker_jobs.store import postgres as postgres_module
from broker_jobs.store import sqlite as sqlite_module
from broker_jobs.worker import Worker, WorkerSettings
from tests import test_store as _store_tests
from tests.support import Broker
from tests.test_store import LEASE, A, B, Kit, _admin, at, durable_only, job

# The parametrised stores of tests/test_store.py (pytest finds fixtures by name here).
make_store = _store_tests.make_store
pg_schema = _store_tests.pg_schema
kit = _store_tests.kit
store = _store_tests.store

SUCCEEDED, RETRYING, FAILED, DEAD, RELEASED, LOST = (
    ExecutionOutcome.SUCCEEDED,
    ExecutionOutcome.RETRYING,
    ExecutionOutcome.FAILED,
    ExecutionOutcome.DEAD,
    ExecutionOutcome.RELEASED,
    ExecutionOutcome.LOST,
)


def summary(store: Store, key: str = "key-1") -> list[tuple[object, ...]]:
    """(attempt, worker, started, finished, outcome, error) of each execution, times
    as seconds after T0."""
    return [
        (
            e.attempt,
            e.worker,
            (e.started_at - at(0)).total_seconds(),
            None if e.finished_at is None else (e.finished_at - at(0)).total_seconds(),
            e.outcome,
            e.error,
        )
        for e in store.executions(key)
    ]


# --- one execution per claim ------------------------------------------------------------------


def test_claim_then_succeed_is_one_execution(store: Store) -> None:
    assert store.executions("key-1") == []
    store.claim(job(), A, LEASE, now=at(0))
    (running,) = store.executions("key-1")
    assert running == Execution("key-1", "id-key-1", 1, A, at(0), None, None, None)
    assert running.duration is None

    store.renew("key-1", A, LEASE, now=at(5))  # a renewal is no new execution
    store.claim(job(), A, LEASE, now=at(6))  # nor a redelivery to the holder
    store.succeed("key-1", A, now=at(7.5))

    (done,) = store.executions("key-1")
    assert (done.finished_at, done.outcome, done.error) == (at(7.5), SUCCEEDED, None)
    assert done.duration == timedelta(seconds=7.5)
    assert store.claim(job(), B, LEASE, now=at(8)).outcome.value == "done"
    assert len(store.executions("key-1")) == 1  # a duplicate runs nothing


def test_a_retry_then_the_next_attempt_are_two_executions(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.retry("key-1", A, "ConnectionError: flaky", due_at=at(10), now=at(2))
    store.claim(job(attempt=2), B, LEASE, now=at(10))
    store.succeed("key-1", B, now=at(11))

    assert summary(store) == [
        (1, A, 0, 2, RETRYING, "ConnectionError: flaky"),
        (2, B, 10, 11, SUCCEEDED, None),  # the record keeps last_error; the run had none
    ]


def test_fail_and_dead_close_the_execution_with_the_error(store: Store) -> None:
    store.claim(job("k-fail"), A, LEASE, now=at(0))
    store.fail("k-fail", A, "ValueError: bad input", now=at(1))
    store.claim(job("k-dead"), A, LEASE, now=at(0))
    store.dead("k-dead", A, "exhausted", now=at(3))

    assert summary(store, "k-fail") == [(1, A, 0, 1, FAILED, "ValueError: bad input")]
    assert summary(store, "k-dead") == [(1, A, 0, 3, DEAD, "exhausted")]


def test_dead_without_a_worker_closes_a_dead_holders_execution(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.dead("key-1", None, "poison after a crash", now=at(LEASE + 1))
    assert summary(store) == [(1, A, 0, LEASE + 1, DEAD, "poison after a crash")]


def test_a_poison_message_never_claimed_has_no_execution(store: Store) -> None:
    store.dead("poison", None, "not a job", job_id="m-1", now=at(0))
    assert store.executions("poison") == []


def test_release_closes_the_execution_and_the_next_claim_opens_one(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.release("key-1", B, now=at(1))  # not the holder: nothing
    store.release("key-1", A, now=at(2))
    store.claim(job(), A, LEASE, now=at(3))  # the same worker again, after a restart
    store.succeed("key-1", A, now=at(4))

    assert summary(store) == [
        (1, A, 0, 2, RELEASED, None),
        (1, A, 3, 4, SUCCEEDED, None),
    ]


def test_a_lease_taken_over_closes_the_first_holders_execution(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    assert store.claim(job(), B, LEASE, now=at(LEASE - 1)).outcome.value == "busy"
    store.claim(job(), B, LEASE, now=at(LEASE + 5))  # A's lease lapsed: B takes over
    store.succeed("key-1", B, now=at(LEASE + 6))

    assert summary(store) == [
        (1, A, 0, LEASE + 5, LOST, None),
        (1, B, LEASE + 5, LEASE + 6, SUCCEEDED, None),
    ]


def test_succeed_with_closes_the_execution(store: Store) -> None:
    store.claim(job(), A, LEASE, now=at(0))
    store.succeed_with("key-1", A, lambda connection: None, now=at(2))
    assert summary(store) == [(1, A, 0, 2, SUCCEEDED, None)]


# --- batches ----------------------------------------------------------------------------------


def test_batches_record_an_execution_per_job(store: Store) -> None:
    fresh = [(Job(id=f"n{i}", task="image.resize"), A) for i in range(5)]
    claims = store.try_claim_many(fresh, LEASE) or store.claim_many(fresh, LEASE)
    assert [c.outcome.value for c in claims] == ["claimed"] * 5
    more = [(Job(id=f"m{i}", task="image.resize"), B) for i in range(3)]
    store.claim_many([*more, more[0]], LEASE)  # a copy of a job: claimed again, one run

    assert store.succeed_many([("n0", A), ("n1", A), ("m0", B), ("n2", B)]) == ["n2"]

    for key, worker, outcome in [
        ("n0", A, SUCCEEDED),
        ("n1", A, SUCCEEDED),
        ("n2", A, None),
        ("m0", B, SUCCEEDED),
        ("m1", B, None),
    ]:
        (execution,) = store.executions(key)
        assert (execution.worker, execution.outcome) == (worker, outcome)
        assert execution.duration is None or execution.duration >= timedelta(0)


def test_sqlite_try_claim_many_then_claim_many_is_one_execution(tmp_path: Path) -> None:
    """Keys the loop's try inserted before it gave up are claimed again by the store
    thread's way under the same holders: still one execution each."""
    with SQLiteStore(tmp_path / "jobs.db") as sqlite_store:
        sqlite_store.claim(Job(id="old", task="t"), B, LEASE)
        mixed = [(Job(id="new", task="t"), A), (Job(id="old", task="t"), B)]
        assert sqlite_store.try_claim_many(mixed, LEASE) is None  # "old" has a record
        sqlite_store.claim_many(mixed, LEASE)
        assert [e.worker for e in sqlite_store.executions("new")] == [A]
        assert [e.worker for e in sqlite_store.executions("old")] == [B]


# --- pruning ----------------------------------------------------------------------------------


def test_prune_deletes_the_executions_of_the_records_it_deletes(store: Store) -> None:
    store.claim(job("old"), A, LEASE, now=at(0))
    store.retry("old", A, "flaky", due_at=at(1), now=at(1))
    store.claim(job("old", attempt=2), A, LEASE, now=at(2))
    store.succeed("old", A, now=at(3))
    store.claim(job("running"), A, LEASE, now=at(0))
    store.claim(job("recent"), A, LEASE, now=at(0))
    store.succeed("recent", A, now=at(100))

    assert store.prune(at(50)) == 1
    assert store.executions("old") == []
    assert len(store.executions("running")) == 1
    assert len(store.executions("recent")) == 1

    store.claim(job("old"), B, LEASE, now=at(200))  # a pruned key runs again: from one
    assert summary(store, "old") == [(1, B, 200, None, None, None)]


# --- schema -----------------------------------------------------------------------------------


@durable_only
def test_the_executions_table_is_indexed_by_key(kit: Kit) -> None:
    assert kit.sql is not None
    kit.store.claim(job(), A, LEASE, now=at(0))
    rows = kit.sql("SELECT idempotency_key, attempt, worker FROM broker_jobs_executions")
    assert rows == [("key-1", 1, A)]
    assert kit.sql("SELECT version FROM broker_jobs_schema") == [(4,)]


def _downgrade_sqlite_to_version_1(path: Path) -> None:
    """The file as version 1 left it: no executions table, no triggers."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER broker_jobs_executions_on_insert")
        conn.execute("DROP TRIGGER broker_jobs_executions_on_update")
        conn.execute("DROP TABLE broker_jobs_executions")
        conn.execute("DROP TABLE broker_jobs_payloads")  # version 4's
        conn.execute("UPDATE broker_jobs_schema SET version = 1")
    finally:
        conn.close()


def test_sqlite_migrates_a_version_1_file(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    with SQLiteStore(path) as old:
        old.claim(job("done"), A, LEASE, now=at(0))
        old.succeed("done", A, now=at(1))
        old.claim(job("held"), A, LEASE, now=at(2))
    _downgrade_sqlite_to_version_1(path)

    with SQLiteStore(path) as migrated:
        assert migrated.get("done") is not None  # the ledger is untouched
        assert migrated.executions("done") == []  # history starts with the migration
        # A job held at the migration gets its open execution, started at its claim.
        assert summary(migrated, "held") == [(1, A, 2, None, None, None)]
        migrated.succeed("held", A, now=at(3))
        assert summary(migrated, "held") == [(1, A, 2, 3, SUCCEEDED, None)]
        migrated.claim(job("new"), B, LEASE, now=at(4))
        assert len(migrated.executions("new")) == 1
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT version FROM broker_jobs_schema").fetchall() == [
            (sqlite_module.SCHEMA_VERSION,)
        ]
    finally:
        conn.close()
    with SQLiteStore(path) as again:  # opening a migrated file changes nothing
        assert len(again.executions("held")) == 1


def test_postgres_migrates_a_version_1_database(postgres_dsn: str, pg_schema: str) -> None:
    with PostgresStore(postgres_dsn, schema=pg_schema) as old:
        old.claim(job("held"), A, LEASE, now=at(2))
    with _admin(postgres_dsn) as conn:
        conn.execute(f'DROP TABLE "{pg_schema}".broker_jobs_executions CASCADE')
        conn.execute(
            f'DROP TRIGGER broker_jobs_executions_track ON "{pg_schema}".broker_jobs_records'
        )
        conn.execute(
            f'DROP TRIGGER broker_jobs_executions_forget ON "{pg_schema}".broker_jobs_records'
        )
        conn.execute(f'DROP TABLE "{pg_schema}".broker_jobs_payloads')  # version 4's
        conn.execute(f'UPDATE "{pg_schema}".broker_jobs_schema SET version = 1')

    with PostgresStore(postgres_dsn, schema=pg_schema) as migrated:
        assert summary(migrated, "held") == [(1, A, 2, None, None, None)]
        migrated.succeed("held", A, now=at(3))
        assert summary(migrated, "held") == [(1, A, 2, 3, SUCCEEDED, None)]
    with _admin(postgres_dsn) as conn:
        (version,) = conn.execute(
            f'SELECT max(version) FROM "{pg_schema}".broker_jobs_schema'
        ).fetchone()
    assert version == postgres_module.SCHEMA_VERSION


@contextmanager
def limited_role(dsn: str, schema: str) -> Iterator[tuple[str, str]]:
    """A role with the privileges a worker needs on the records (and none on the
    executions), and a DSN that uses it; dropped afterwards."""
    import uuid  # noqa: PLC0415

    from psycopg.conninfo import make_conninfo  # noqa: PLC0415

    role = f"r_{uuid.uuid4().hex[:12]}"
    with _admin(dsn) as conn:
        conn.execute(f'CREATE ROLE "{role}"')
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{schema}".broker_jobs_records TO "{role}"'
        )
        conn.execute(f'GRANT SELECT ON "{schema}".broker_jobs_schema TO "{role}"')
    try:
        yield role, make_conninfo(dsn, options=f"-c role={role}")
    finally:
        with _admin(dsn) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def test_postgres_a_role_without_privileges_on_executions_still_records_them(
    postgres_dsn: str, pg_schema: str
) -> None:
    """The triggers write the executions with their owner's rights: a worker's role
    needs SELECT on the table only to read them."""
    PostgresStore(postgres_dsn, schema=pg_schema).close()
    with limited_role(postgres_dsn, pg_schema) as (role, limited_dsn):
        with PostgresStore(limited_dsn, schema=pg_schema) as limited:
            limited.claim(job(), A, LEASE, now=at(0))
            limited.succeed("key-1", A, now=at(1))
            with pytest.raises(StoreError, match=r"Grant this user SELECT on .*executions"):
                limited.executions("key-1")
            with _admin(postgres_dsn) as conn:
                conn.execute(f'GRANT SELECT ON "{pg_schema}".broker_jobs_executions TO "{role}"')
            assert [e.outcome for e in limited.executions("key-1")] == [SUCCEEDED]
            assert limited.prune(at(2)) == 1
        with PostgresStore(postgres_dsn, schema=pg_schema) as owner:
            owner.claim(job("k2"), A, LEASE, now=at(0))
            assert len(owner.executions("k2")) == 1
            assert owner.executions("key-1") == []  # pruned with its record


# --- a real worker ----------------------------------------------------------------------------


class Flaky(BaseModel):
    key: str


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_job_that_fails_once_then_succeeds_has_two_executions(
    broker: Broker,
    make_app: Callable[[], App],
    tmp_path: Path,
    kind: str,
) -> None:
    app = make_app()
    runs: Counter[str] = Counter()
    quick = RetryPolicy(max_attempts=3, base_delay=0.2, max_delay=0.2, jitter=False)

    @app.task("history.flaky", retry=quick)
    def flaky(payload: Flaky) -> None:
        runs[payload.key] += 1
        if runs[payload.key] == 1:
            raise ConnectionError("flaky, first run")

    with Publisher(broker.url, app) as publisher:
        published = publisher.publish("history.flaky", {"key": "once"})
    ledger: Store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "jobs.db")
    with ledger:
        settings = WorkerSettings(burst=True, concurrency=2)
        outcomes = asyncio.run(Worker(broker.url, app, ledger, settings).run())
        assert (outcomes["retried"], outcomes["succeeded"]) == (1, 1)

        first, second = ledger.executions(published.idempotency_key)
    assert (first.attempt, first.outcome) == (1, RETRYING)
    assert "flaky, first run" in (first.error or "")
    assert (second.attempt, second.outcome, second.error) == (2, SUCCEEDED, None)
    assert first.finished_at is not None
    assert second.finished_at is not None
    assert first.started_at <= first.finished_at <= second.started_at <= second.finished_at


# --- the worker command's --retention ---------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "env", "days"),
    [
        ([], {}, 7.0),
        (["--retention", "0.5"], {}, 0.5),
        ([], {"BROKER_JOBS_RETENTION_DAYS": "30"}, 30),
    ],
)
def test_the_worker_command_passes_the_retention(
    monkeypatch: pytest.MonkeyPatch, arguments: list[str], env: dict[str, str], days: float
) -> None:
    seen: list[WorkerSettings] = []

    async def run(
        url: object, app: object, store: object, settings: WorkerSettings, *rest: object
    ) -> dict[str, int]:
        seen.append(settings)
        return {}

    app = App(namespace="history-cli")

    @app.task("history.noop")
    def noop(payload: Flaky) -> None:
        del payload

    monkeypatch.setattr(worker_cli, "_run", run)
    monkeypatch.setattr(worker_cli, "load_app", lambda path: app)
    command = [
        "worker",
        "--url",
        "amqp://guest:guest@127.0.0.1:1/",
        "m:app",
        "--store",
        "memory://",
    ]
    result = CliRunner().invoke(main, [*command, *arguments], env=env)
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert settings.retention == timedelta(days=days)


def test_the_worker_command_refuses_a_retention_of_zero() -> None:
    result = CliRunner().invoke(main, ["worker", "m:app", "--retention", "0"])
    assert result.exit_code == 2
    assert "--retention" in result.output
