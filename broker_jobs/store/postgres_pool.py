"""The PostgreSQL store's connections: a few autocommit connections, made on demand
and shared by the store's callers' threads. Not psycopg_pool: this needs no
background thread and no extra dependency. A broken connection is dropped (and the
idle ones with it: after a server restart they are most likely dead too), so the
next call reconnects instead of failing once per stale connection.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from broker_jobs.fork_watch import ForkWatch
from broker_jobs.store.errors import StoreError

with contextlib.suppress(ImportError):  # the store says what to install
    import psycopg
    from psycopg.pq import TransactionStatus


class Pool:
    """Up to ``size`` connections made by ``connect``; a caller beyond them waits up
    to ``wait`` seconds for one. ``owner``: the store, named in errors."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        size: int,
        wait: float,
        owner: object,
    ) -> None:
        self._connect, self._size, self._wait, self._owner = connect, size, wait, owner
        self._idle: list[psycopg.Connection[Any]] = []
        self._open = 0
        self._closed = False
        self._cond = threading.Condition()
        #: The parent's connections, in a forked child: kept, never used nor closed
        #: (a close sends a Terminate on the parent's session).
        self._inherited: list[psycopg.Connection[Any]] = []
        ForkWatch.add(self)

    def after_fork_in_child(self) -> None:
        """(:class:`~broker_jobs.fork_watch.ForkWatch`) In a forked child: its own
        connections from now on; those in use by the parent's other threads at the
        fork stay with their (gone) callers."""
        self._inherited.extend(self._idle)
        self._idle, self._open = [], 0
        self._cond = threading.Condition()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        conn = self._acquire()
        try:
            yield conn
        finally:
            self._release(conn)

    def _acquire(self) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + self._wait
        with self._cond:
            while True:
                if self._closed:
                    raise StoreError(f"{self._owner!r} is closed; open a new store")
                if self._idle:
                    return self._idle.pop()
                if self._open < self._size:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreError(
                        f"{self._owner!r}: all {self._size} connections stayed busy for"
                        f" {self._wait:g} s; raise max_connections (or look for a slow"
                        " succeed_with effects function)"
                    )
                self._cond.wait(left)
        try:
            return self._connect()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _release(self, conn: psycopg.Connection[Any]) -> None:
        healthy = not conn.closed and not conn.broken
        reusable = healthy and conn.info.transaction_status == TransactionStatus.IDLE
        stale: list[psycopg.Connection[Any]] = []
        with self._cond:
            if reusable and not self._closed:
                self._idle.append(conn)
                self._cond.notify()
                return
            self._open -= 1
            if not healthy:
                # The server restarted or the network broke: the idle ones are most
                # likely dead too; reconnect on demand rather than fail once each.
                stale, self._idle = self._idle, []
                self._open -= len(stale)
            self._cond.notify_all()
        for dead in [conn, *stale]:
            with contextlib.suppress(Exception):
                dead.close()

    def close(self) -> None:
        """Close the idle connections now; those in use are closed when given back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()
