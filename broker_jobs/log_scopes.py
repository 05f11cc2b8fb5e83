"""Log filters that act only where broker-jobs itself is at work.

A driver below us (pika, aiormq, psycopg) logs what our own error or our own single
line says already: a failed connect, a pipeline ended in error. Such a line is
adjusted only while our call runs, in its thread or task (a ContextVar), so the
driver's lines about other code's work reach the user's log as they are. The filter
is put on its loggers on first use, not at import: a process that never makes such
a call keeps them untouched. (A logger's own filters see only the records made on
it, not its children's: each logger is named.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import ClassVar


class ScopedFilter(logging.Filter):
    """A subclass names its ``loggers``, a ContextVar ``_active`` of its own, and
    :meth:`keep`, which may change the record; records made outside
    :meth:`active` pass untouched."""

    loggers: ClassVar[tuple[str, ...]]
    _active: ClassVar[ContextVar[bool]]

    def filter(self, record: logging.LogRecord) -> bool:
        return not self._active.get() or self.keep(record)

    def keep(self, record: logging.LogRecord) -> bool:
        """Whether ``record``, made in our call, reaches the handlers (it may be
        changed on the way)."""
        raise NotImplementedError

    @classmethod
    @contextmanager
    def active(cls) -> Iterator[None]:
        """Around one of our calls, in the caller's thread or task."""
        for name in cls.loggers:
            logger = logging.getLogger(name)
            if not any(isinstance(each, cls) for each in logger.filters):
                logger.addFilter(cls())
        token = cls._active.set(True)
        try:
            yield
        finally:
            cls._active.reset(token)
