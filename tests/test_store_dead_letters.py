"""The ledger's index of dead letters (broker_jobs.store.dead_letter_index), on every
store: indexed with the record that makes a job dead or apart, listed in the order
first indexed, filtered as ``DeadLetterFilter.matches`` filters, counted, dropped and
swept by a pass; bodies of any bytes kept, large ones as their size; seen by a second
store on the same data."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker_jobs import Job
from broker_jobs.dead_letter import DeadLetter, DeadLetterFilter, dead_letter_from
from broker_jobs.ops.dead_letter_ledger import FLUSH_EVERY, IndexKeeper
from broker_jobs.store import PostgresStore, SQLiteStore, Status, Store
from broker_jobs.store import sqlite as sqlite_module
from broker_jobs.store.base import MAX_PAYLOAD_BYTES
from tests.test_store import LEASE, A, Kit, _admin, at

TASK = "mail.send"
DEAD_AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def letter(
    n: int,
    *,
    task: str = TASK,
    reason: str = "exhausted",
    error: str = "SMTPError: 421 try later",
    body: bytes | None = None,
    message_id: str | None = "",
    minutes: int = 0,
) -> DeadLetter:
    """A dead letter as a worker makes it (its headers as the wire page gives them)."""
    job_id = f"job-{n}" if message_id == "" else message_id
    return dead_letter_from(
        task,
        {
            "bj-idempotency-key": f"key-{n}",
            "bj-dead-reason": reason,
            "bj-dead-error": error,
            "bj-dead-attempts": 3,
            "bj-dead-worker": "w1",
            "bj-dead-at": (DEAD_AT + timedelta(minutes=minutes)).isoformat(),
            "x-death": [{"reason": "rejected", "time": DEAD_AT}],
        },
        {"message_id": job_id, "content_type": "application/json", "type": task},
        body if body is not None else b'{"to": "a@example.com", "n": %d}' % n,
    )


def ids(store: Store, where: DeadLetterFilter | None = None, **kwargs: int) -> list[str | None]:
    return [e.letter.job_id for e in store.dead_letters([TASK], where, **kwargs)]


def test_a_dead_letter_is_indexed_with_the_record_that_makes_its_job_dead(store: Store) -> None:
    job = Job(id="job-1", task=TASK, payload={"n": 1}, idempotency_key="key-1")
    store.claim(job, A, LEASE, now=at(0))
    dead = letter(1)
    store.dead("key-1", A, "SMTPError", job=job, now=at(1), letter=dead)

    record = store.get("key-1")
    assert record is not None
    assert record.status is Status.DEAD
    [entry] = store.dead_letters([TASK])
    assert entry.letter == DeadLetter.from_json(dead.to_json(), dead.body)
    assert (entry.letter.reason, entry.letter.error, entry.letter.dead_at) == (
        "exhausted",
        "SMTPError: 421 try later",
        DEAD_AT,
    )
    assert entry.letter.payload == {"to": "a@example.com", "n": 1}
    assert entry.letter.headers["x-death"][0]["reason"] == "rejected"  # as JSON values
    assert (entry.body_kept, entry.body_size) == (True, len(dead.body))
    assert store.dead_letter_counts([TASK, "other.task"]) == {TASK: 1, "other.task": 0}


def test_entries_list_in_the_order_first_indexed_and_a_second_copy_keeps_its_place(
    store: Store,
) -> None:
    store.index_dead_letters([letter(3), letter(1)])
    store.index_dead_letters([letter(2)])
    store.index_dead_letters([letter(3, error="again")])  # a second copy: one entry

    assert ids(store) == ["job-3", "job-1", "job-2"]
    assert store.dead_letters([TASK])[0].letter.error == "again"
    assert ids(store, limit=2, offset=1) == ["job-1", "job-2"]
    assert ids(store, limit=1, offset=5) == []


def test_the_filter_is_the_one_the_queue_pass_applies(store: Store) -> None:
    letters = [
        letter(1, reason="exhausted", error="SMTPError: 421", minutes=0),
        letter(2, reason="permanent", error="ValueError: bad address", minutes=10),
        letter(3, reason="schema", error="validation ERROR in field to", minutes=20),
        letter(4, task="other.task", reason="permanent", minutes=30),
    ]
    store.index_dead_letters(letters)
    filters = [
        DeadLetterFilter(),
        DeadLetterFilter(reasons=frozenset({"permanent", "schema"})),
        DeadLetterFilter(error="error"),  # any case
        DeadLetterFilter(since=DEAD_AT + timedelta(minutes=10)),
        DeadLetterFilter(until=DEAD_AT + timedelta(minutes=10)),
        DeadLetterFilter(ref="key-2"),
        DeadLetterFilter(ref="job-3"),
        DeadLetterFilter(ref="job-4"),  # another task's
        DeadLetterFilter(reasons=frozenset({"permanent"}), error="bad", ref="job-2"),
    ]
    for where in filters:
        expected = [x.job_id for x in letters if x.task == TASK and where.matches(x)]
        assert ids(store, where) == expected, where
        assert store.dead_letter_counts([TASK], where) == {TASK: len(expected)}, where
    both = store.dead_letters(
        [TASK, "other.task"], DeadLetterFilter(reasons=frozenset({"permanent"}))
    )
    assert [e.letter.job_id for e in both] == ["job-2", "job-4"]
    assert store.dead_letters([]) == []


def test_any_body_is_kept_and_a_large_one_as_its_size(store: Store) -> None:
    odd = b"\xff\x00not json"
    text_with_nul = b'"a\x00b"'
    large = b'{"blob": "' + b"x" * MAX_PAYLOAD_BYTES + b'"}'
    store.index_dead_letters(
        [
            letter(1, body=odd, reason="json"),
            letter(2, body=text_with_nul),
            letter(3, body=large),
            letter(4, body=b"no id", message_id=None, reason="json"),
        ]
    )
    entries = {e.letter.letter_id: e for e in store.dead_letters([TASK])}
    assert entries["job-1"].letter.body == odd
    assert entries["job-1"].letter.payload is None
    assert entries["job-2"].letter.body == text_with_nul
    assert entries["job-3"].body_kept is False
    assert (entries["job-3"].body_size, entries["job-3"].letter.body) == (len(large), b"")
    no_id = letter(4, body=b"no id", message_id=None)
    assert no_id.letter_id.startswith("sha256:")
    assert entries[no_id.letter_id].letter.job_id is None


def test_a_pass_sweeps_what_it_did_not_see_and_keeps_what_came_meanwhile(store: Store) -> None:
    store.index_dead_letters([letter(1), letter(2), letter(3)])
    mark = store.dead_letter_mark(TASK)
    assert mark > 0
    assert store.dead_letter_mark("other.task") == 0
    # The pass sees 1 (kept) and takes 2 (dropped); 3 left the queue another way;
    # 4 is dead-lettered while the pass runs.
    store.index_dead_letters([letter(1)], pass_id="pass-a")
    assert store.unindex_dead_letters(TASK, [letter(2), letter(9)]) == 1
    store.index_dead_letters([letter(4)])
    assert store.sweep_dead_letters(TASK, up_to=mark, pass_id="pass-a") == 1

    assert ids(store) == ["job-1", "job-4"]
    assert store.dead_letter_mark(TASK) > mark


def test_a_letter_taken_by_a_pass_that_dies_again_before_the_pass_writes_stays_indexed(
    store: Store,
) -> None:
    """A replay reuses the job id; the worker indexes the job's new dead letter before
    the pass writes the drop of the old one: neither the drop nor the sweep takes it."""
    store.index_dead_letters([letter(1), letter(2), letter(3)])
    keeper = IndexKeeper.start(store, TASK)
    keeper.saw(letter(1), taken=True)  # replayed: its write waits for the ack
    keeper.saw(letter(2), taken=False)
    store.index_dead_letters([letter(1, minutes=5, error="again")])  # dead again
    keeper.saw(letter(3), taken=True)
    keeper.finish()

    [entry] = store.dead_letters([TASK], DeadLetterFilter(ref="job-1"))
    assert (entry.letter.error, entry.letter.dead_at) == ("again", DEAD_AT + timedelta(minutes=5))
    assert ids(store) == ["job-2", "job-1"]  # the new dead letter is placed last
    assert keeper.dropped == 1  # job-3's entry; job-1's old one was replaced, not dropped
    # A pass that takes the new one drops it.
    keeper = IndexKeeper.start(store, TASK)
    keeper.saw(letter(1, minutes=5), taken=True)
    keeper.finish()
    assert ids(store) == []


def test_a_pass_writes_what_it_took_within_a_quarter_second_not_only_by_batches(
    store: Store,
) -> None:
    """A replay killed midway leaves the entries of what it took in its last moments
    only (docs/operations.md): the keeper writes at least every FLUSH_EVERY seconds."""
    store.index_dead_letters([letter(n) for n in range(4)])
    now = [0.0]
    keeper = IndexKeeper.start(store, TASK)
    keeper.clock = lambda: now[0]
    keeper.saw(letter(0), taken=True)
    keeper.saw(letter(1), taken=True)
    assert ids(store) == ["job-0", "job-1", "job-2", "job-3"]  # held for the batch
    now[0] = FLUSH_EVERY
    keeper.saw(letter(2), taken=True)  # 0 and 1 are acked by now: written
    assert ids(store) == ["job-2", "job-3"]
    keeper.finish()
    assert ids(store) == []  # 2 taken, 3 unseen: swept
    assert keeper.dropped == 4


def test_a_second_store_on_the_same_data_reads_the_index(kit: Kit) -> None:
    kit.store.index_dead_letters([letter(1)])
    other = kit.reopen()
    assert [e.letter.job_id for e in other.dead_letters([TASK])] == ["job-1"]


@pytest.mark.parametrize("count", [250])
def test_many_entries_page_and_count(store: Store, count: int) -> None:
    store.index_dead_letters([letter(n) for n in range(count)])
    assert store.dead_letter_counts([TASK]) == {TASK: count}
    assert ids(store, limit=3, offset=count - 2) == [f"job-{count - 2}", f"job-{count - 1}"]


def test_an_sqlite_file_without_the_index_gets_it_on_open(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with SQLiteStore(path):
        pass
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("DROP TABLE broker_jobs_dead_letters")  # as an older broker-jobs left it
    finally:
        db.close()
    with SQLiteStore(path) as store:
        store.index_dead_letters([letter(1)])
        assert ids(store) == ["job-1"]
    db = sqlite3.connect(path)
    try:  # an addition without a version: older workers keep sharing the file
        assert db.execute("SELECT version FROM broker_jobs_schema").fetchall() == [
            (sqlite_module.SCHEMA_VERSION,)
        ]
    finally:
        db.close()


@contextlib.contextmanager
def role_without_the_index(dsn: str, schema: str) -> Iterator[str]:
    """The DSN of a new role that may write the records and executions of ``schema``,
    and nothing of the dead letters' table; dropped afterwards."""
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415

    role = f"r_{uuid.uuid4().hex[:12]}"
    with _admin(dsn) as conn:
        conn.execute(f'CREATE ROLE "{role}"')
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{schema}".broker_jobs_records,'
            f' "{schema}".broker_jobs_executions TO "{role}"'
        )
        conn.execute(f'GRANT SELECT ON "{schema}".broker_jobs_schema TO "{role}"')
    try:
        yield make_conninfo(dsn, options=f"-c role={role}")
    finally:
        with _admin(dsn) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def test_a_postgres_role_that_may_not_write_the_index_records_dead_jobs_without_it(
    postgres_dsn: str, pg_schema: str
) -> None:
    PostgresStore(postgres_dsn, schema=pg_schema).close()
    with _admin(postgres_dsn) as conn:  # an older database: the owner adds it on open
        conn.execute(f'DROP TABLE "{pg_schema}".broker_jobs_dead_letters')
    with role_without_the_index(postgres_dsn, pg_schema) as limited_dsn:
        with PostgresStore(limited_dsn, schema=pg_schema) as limited:
            assert limited.indexes_dead_letters is False
            job = Job(id="job-1", task=TASK, payload={"n": 1}, idempotency_key="key-1")
            limited.claim(job, A, LEASE, now=at(0))
            limited.dead("key-1", A, "SMTPError", job=job, now=at(1), letter=letter(1))
            record = limited.get("key-1")
            assert record is not None
            assert record.status is Status.DEAD
            limited.index_dead_letters([letter(2)])  # nothing to do, no error
        with PostgresStore(postgres_dsn, schema=pg_schema) as owner:  # adds the table
            assert owner.indexes_dead_letters is True
            owner.index_dead_letters([letter(3)])
            assert ids(owner) == ["job-3"]


def test_a_postgres_role_without_grants_on_the_index_reads_it_empty(
    postgres_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The table exists (its owner made it) but this role may not write it: the store
    opens, says so once, records dead jobs, and its calls on the index do nothing."""
    with PostgresStore(postgres_dsn, schema=pg_schema) as owner:
        owner.index_dead_letters([letter(1)])
        mark = owner.dead_letter_mark(TASK)
    with role_without_the_index(postgres_dsn, pg_schema) as limited_dsn:
        with PostgresStore(limited_dsn, schema=pg_schema) as limited:
            assert limited.indexes_dead_letters is False
            assert any(
                "broker_jobs_dead_letters" in r.getMessage() and r.levelname == "WARNING"
                for r in caplog.records
            )
            job = Job(id="job-2", task=TASK, payload={"n": 2}, idempotency_key="key-2")
            limited.claim(job, A, LEASE, now=at(0))
            limited.dead("key-2", A, "SMTPError", job=job, now=at(1), letter=letter(2))
            record = limited.get("key-2")
            assert record is not None
            assert record.status is Status.DEAD
            assert limited.dead_letters([TASK]) == []
            assert limited.dead_letter_counts([TASK]) == {TASK: 0}
            assert limited.dead_letter_mark(TASK) == 0
            assert limited.unindex_dead_letters(TASK, [letter(1)]) == 0
            assert limited.sweep_dead_letters(TASK, up_to=mark, pass_id="p") == 0
        with PostgresStore(postgres_dsn, schema=pg_schema) as owner:  # untouched
            assert ids(owner) == ["job-1"]
