"""A fork waits until no other thread is inside SQLite (broker_jobs/store/sqlite_fork_gate.py).

Without the gate, a child forked while a thread of its parent was mid-statement or
mid-transaction hung in its first SQLite call (the first test).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker_jobs.store import sqlite_fork_gate
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.store.sqlite_fork_gate import SQLiteForkGate

#: A child still busy after this many seconds is taken for hung (it does two statements).
CHILD_LIMIT = 30


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "ledger.db")
    yield store
    store.close()


def fork_and_wait(in_child: object = None) -> int:
    """Fork; the child runs ``in_child()`` (exit 0 if it returns, 1 if it raises, killed
    by SIGALRM if it hangs); the parent gets the child's exit code."""
    child = os.fork()
    if child == 0:  # never returns into pytest
        code = 1
        try:
            signal.alarm(CHILD_LIMIT)
            if callable(in_child):
                in_child()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


#: A process writing to its SQLite store from two threads while its main thread forks
#: children that use the store; it prints the children's exit codes and the fewest
#: writes of a thread. In a fresh interpreter, as a web server's process is. Without
#: the gate, 31 of 100 children hung.
FORKING_WRITER = """
import os, signal, sys, threading
from datetime import UTC, datetime, timedelta
from broker_jobs.store.sqlite import SQLiteStore

store = SQLiteStore(sys.argv[1])
children = int(sys.argv[2])
stop = threading.Event()
written = [0, 0]

def write(n):
    at = datetime.now(UTC)
    while not stop.is_set():
        store.record_fire(f"parent-{n}-{written[n] % 20}", at + timedelta(seconds=written[n]))
        store.last_fire(f"parent-{n}-1")
        written[n] += 1

writers = [threading.Thread(target=write, args=(n,)) for n in range(2)]
for writer in writers:
    writer.start()
codes = []
for n in range(children):
    child = os.fork()
    if child == 0:
        code = 1
        try:
            signal.alarm(int(sys.argv[3]))  # a hung child dies of SIGALRM: -14
            store.record_fire(f"child-{n}", datetime(2026, 1, 1, tzinfo=UTC))
            code = 0 if store.last_fire(f"child-{n}") == datetime(2026, 1, 1, tzinfo=UTC) else 1
        finally:
            os._exit(code)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
stop.set()
for writer in writers:
    writer.join()
store.close()
print(codes, min(written))
"""


def test_children_forked_while_threads_write_use_the_store_and_never_hang(
    tmp_path: Path,
) -> None:
    children = 40
    ledger = tmp_path / "ledger.db"
    done = subprocess.run(
        [sys.executable, "-c", FORKING_WRITER, str(ledger), str(children), str(CHILD_LIMIT)],
        capture_output=True,
        text=True,
        timeout=100,  # under pytest-timeout's 120 s; a hung child takes CHILD_LIMIT
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    codes, written = done.stdout.split("] ")
    assert codes == "[" + ", ".join(["0"] * children)  # -14: a child hung; 1: it failed
    assert int(written) > children  # the parent's threads wrote while it forked
    store = SQLiteStore(ledger)
    try:
        assert set(store.last_fires("child-")) == {f"child-{n}" for n in range(children)}
    finally:
        store.close()


@contextmanager
def span_of_another_thread(gate: SQLiteForkGate, events: list[str]) -> Iterator[threading.Event]:
    """A thread inside ``gate`` from entry to exit of the block, or until the event
    yielded is set; it appends "span left" to ``events`` as it leaves."""
    inside, release = threading.Event(), threading.Event()

    def hold_a_span() -> None:
        with gate:
            inside.set()
            release.wait()
            events.append("span left")

    holder = threading.Thread(target=hold_a_span)
    holder.start()
    inside.wait()
    try:
        yield release
    finally:
        release.set()
        holder.join()


def test_a_fork_waits_for_another_threads_span_and_new_spans_wait_for_the_fork() -> None:
    gate = SQLiteForkGate.of_process()
    events: list[str] = []

    def enter_after() -> None:
        with gate:
            events.append("new span entered")

    codes: list[int] = []

    def fork() -> None:
        codes.append(fork_and_wait())
        events.append("forked")

    with span_of_another_thread(gate, events) as release:
        forker = threading.Thread(target=fork)
        forker.start()
        with gate._changed:  # the fork has closed the gate and waits for the span
            gate._changed.wait_for(lambda: gate._forks > 0)
        latecomer = threading.Thread(target=enter_after)
        latecomer.start()
        release.set()
        for thread in (forker, latecomer):
            thread.join()
    assert codes == [0]
    assert events[0] == "span left"  # before the fork and the new span, in either order
    assert sorted(events[1:]) == ["forked", "new span entered"]


def test_threads_forking_at_once_all_wait_for_the_span() -> None:
    gate = SQLiteForkGate.of_process()
    events: list[str] = []

    def fork() -> None:
        events.append(f"forked {fork_and_wait()}")

    with span_of_another_thread(gate, events) as release:
        forkers = [threading.Thread(target=fork) for _ in range(2)]
        for forker in forkers:
            forker.start()
        with gate._changed:  # both forks wait for the span
            gate._changed.wait_for(lambda: gate._forks == 2)
        release.set()
        for forker in forkers:
            forker.join()
    assert events == ["span left", "forked 0", "forked 0"]
    assert gate._forks == 0


def test_a_thread_that_forks_inside_its_own_span_is_not_waited_for(
    store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=sqlite_fork_gate.__name__)

    def in_child() -> None:  # the gate of the child is open, its own span counted
        store.record_fire("from the child", datetime(2026, 1, 1, tzinfo=UTC))

    with SQLiteForkGate.of_process():
        assert fork_and_wait(in_child) == 0
    assert [r for r in caplog.records if r.name == sqlite_fork_gate.__name__] == []
    assert store.last_fire("from the child") == datetime(2026, 1, 1, tzinfo=UTC)


def test_a_fork_held_by_a_long_span_goes_on_after_the_wait_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sqlite_fork_gate, "FORK_WAIT", 0.05)
    with span_of_another_thread(SQLiteForkGate.of_process(), []):
        assert fork_and_wait() == 0
    (warning,) = [r for r in caplog.records if r.name == sqlite_fork_gate.__name__]
    assert "after waiting 0.05 s for other threads to leave SQLite (1 span(s)" in (
        warning.getMessage()
    )
    assert "open the store in each process after forking" in warning.getMessage()
