"""A fork waits until no thread of the process is inside SQLite.

SQLite keeps process-wide state in C: its mutexes, and the unix VFS's bookkeeping of
the locks its connections hold on each file (and on its -shm). ``fork()`` copies that
state as the other threads left it: a mutex one of them held mid-statement stays held
in the child forever, and a write lock one held mid-transaction is counted as the
child's own. The child then hangs in its first ``sqlite3.connect`` or ``BEGIN
IMMEDIATE`` (seen: 31 of 100 children of a process writing from two threads,
tests/test_sqlite_fork_gate.py). Forgetting the parent's connections in the child
(:class:`~broker_jobs.fork_watch.ForkWatch`) cannot undo that.

So every SQLite store of the process enters this gate around each statement and each
transaction, and a fork (``os.register_at_fork``'s ``before``) closes it: new
entries wait, and the fork waits until the threads inside have left. A thread that
forks while inside itself (a transactional handler) is not waited for, and a fork
waits at most :data:`FORK_WAIT` for the others, then goes on with a warning: a fork
is never held forever by a long transaction.
"""

from __future__ import annotations

import logging
import os
import threading
from types import TracebackType
from typing import ClassVar

log = logging.getLogger(__name__)

#: The longest a fork waits for the other threads to leave SQLite (statements take
#: milliseconds; only a transaction held open by a handler takes longer).
FORK_WAIT = 10.0


class SQLiteForkGate:
    """Entered (``with gate:``) by a thread for each span it spends inside SQLite;
    re-entrant per thread. One per process: :meth:`of_process`."""

    _process_gate: ClassVar[SQLiteForkGate | None] = None
    _made: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def of_process(cls) -> SQLiteForkGate:
        """The process's gate, made (and its fork hooks registered) on first use."""
        with cls._made:
            if cls._process_gate is None:
                gate = cls._process_gate = cls()
                os.register_at_fork(
                    before=gate._before_fork,
                    after_in_parent=gate._after_fork_in_parent,
                    after_in_child=gate._after_fork_in_child,
                )
            return cls._process_gate

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._inside = 0  # spans of all threads, nested ones included
        self._forks = 0  # forks between their before and after hooks (threads may fork at once)
        self._depth = threading.local()  # this thread's open spans

    def __enter__(self) -> None:
        depth = getattr(self._depth, "spans", 0)
        with self._lock:
            if depth == 0 and self._forks:  # nested spans pass: the fork waits for them
                self._changed.wait_for(self._no_fork)
            self._inside += 1
        self._depth.spans = depth + 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._depth.spans -= 1
        with self._lock:
            self._inside -= 1
            if self._forks:
                self._changed.notify_all()

    def _no_fork(self) -> bool:
        return self._forks == 0

    def _before_fork(self) -> None:
        mine = getattr(self._depth, "spans", 0)
        with self._lock:
            self._forks += 1
            quiet = self._changed.wait_for(lambda: self._inside <= mine, FORK_WAIT)
            inside = self._inside - mine
        if not quiet:
            log.warning(
                "a fork went on after waiting %g s for other threads to leave SQLite (%d"
                " span(s) still inside, a long transaction): a child that uses an SQLite"
                " store may hang; open the store in each process after forking",
                FORK_WAIT,
                inside,
            )

    def _after_fork_in_parent(self) -> None:
        with self._lock:
            self._forks -= 1
            self._changed.notify_all()

    def _after_fork_in_child(self) -> None:
        # The child has only the forking thread: its own spans are all that is inside.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._inside = getattr(self._depth, "spans", 0)
        self._forks = 0
