"""A daemon's ledger that is not there yet: an outage is waited out (said once), a
mistake in the store's URL is raised at once (docs/store.md, "When the ledger fails")."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_jobs.store import SQLiteStore, StoreError, StoreUnavailableError, open_store
from broker_jobs.store.base import Store
from broker_jobs.store.waiting import open_store_when_up
from broker_jobs.testing.postgres_node import PostgresNode
from tests.support import unavailable


class Said(logging.Handler):
    """Sets ``waiting`` when the wait for the ledger is said."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if "cannot be opened for now" in record.getMessage():
            self.waiting.set()


@pytest.fixture
def said() -> Iterator[Said]:
    handler = Said()
    logger = logging.getLogger("broker_jobs.store.waiting")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)


def test_a_worker_started_before_its_postgresql_waits_for_it(tmp_path: Path, said: Said) -> None:
    if not PostgresNode.available():
        unavailable("no PostgreSQL server installed: apt-get install postgresql")
    node = PostgresNode.create(tmp_path)  # its port chosen, nothing listening yet
    opened: list[Store] = []
    try:
        opening = threading.Thread(target=lambda: opened.append(open_store_when_up(node.dsn)))
        opening.start()
        assert said.waiting.wait(30), said.lines
        # One line: libpq's message spans two ("...refused\n\tIs the server running").
        assert all("\n" not in line for line in said.lines), said.lines
        node.start()
        opening.join(60)
        assert not opening.is_alive(), "still waiting for a ledger that answers"
        (store,) = opened
        store.close()
        assert sum("cannot be opened for now" in line for line in said.lines) == 1, said.lines
        assert any("answers after" in line for line in said.lines), said.lines
        # A mistake to fix is not waited for: a role that does not exist.
        wrong_role = node.dsn.replace("postgres@", "no_such_role@", 1)
        with pytest.raises(StoreError) as caught:
            open_store_when_up(wrong_role)
        assert not isinstance(caught.value, StoreUnavailableError)
        assert "no_such_role" in str(caught.value)
    finally:
        node.cleanup()


def test_a_locked_sqlite_file_is_an_outage_and_a_missing_directory_a_mistake(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    SQLiteStore(path).close()
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailableError, match="locked by another process"):
            SQLiteStore(path, busy_timeout=0.05)
    finally:
        holder.rollback()
        holder.close()
    with pytest.raises(StoreError) as caught:
        open_store_when_up(f"sqlite:///{tmp_path / 'no-such-dir' / 'ledger.db'}")
    assert not isinstance(caught.value, StoreUnavailableError)
    assert "Create the directory" in str(caught.value)
    open_store(f"sqlite:///{path}").close()
