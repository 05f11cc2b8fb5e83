"""Connections a forked child must not use: each holder drops its own in the child.

A child made by ``fork()`` (gunicorn's ``--preload``, ``multiprocessing``'s fork
start) inherits its parent's sockets, and with them the parent's AMQP and database
sessions: a frame or a query the child sends there, or a reply it reads, breaks the
parent's session (a pika connection's epoll shared too; a psycopg connection read by
two processes hung the parent). Holders of such connections (a sync publisher, the
SQLite and PostgreSQL stores) register here; in the child, at once and while it has
a single thread, each forgets what it inherited, without closing it (a close would
speak on the parent's session too), and opens its own on its next use. One fork hook
serves them all: hooks cannot be removed, and one per holder would pile up in a
process that makes many.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import ClassVar, Protocol


class ForgetsAtFork(Protocol):
    def after_fork_in_child(self) -> None:
        """Forget the connections inherited from the parent (not closing them)."""


class ForkWatch:
    """The process's holders of connections (not kept alive for it)."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _holders: ClassVar[weakref.WeakSet[ForgetsAtFork] | None] = None

    @classmethod
    def add(cls, holder: ForgetsAtFork) -> None:
        with cls._lock:
            if cls._holders is None:
                cls._holders = weakref.WeakSet()
                os.register_at_fork(after_in_child=cls._after_fork_in_child)
            cls._holders.add(holder)

    @classmethod
    def _after_fork_in_child(cls) -> None:
        cls._lock = threading.Lock()  # a parent's thread may have held it at the fork
        for holder in list(cls._holders or ()):
            holder.after_fork_in_child()
