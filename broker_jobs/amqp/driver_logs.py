"""The AMQP drivers' own lines about a connection attempt of ours, dropped.

A failed connect makes pika log ten lines (seven at ERROR) and aiormq one ERROR, in
the log of whatever process publishes: a web service with its broker down logged
them for every request. Our error names each node tried and why, so while one of
our connects runs, in that thread or task only, those lines are dropped; the
drivers' DEBUG lines, their lines about anything else, and other code's connects
are kept.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar

#: The loggers pika logs a connect's failure to (each logger's own filters see only
#: records made on it, not its children's).
PIKA_CONNECT_LOGGERS = (
    "pika.adapters.base_connection",
    "pika.adapters.utils.connection_workflow",
    "pika.adapters.utils.io_services_utils",
    "pika.connection",
)
#: aiormq's one line, and the beginning of its message. aiormq starts its reader task
#: inside the connect, so that task inherits the flag below: its lines are kept by
#: matching this one only.
AIORMQ_LOGGER = "aiormq.connection"
AIORMQ_CONNECT_FAILED = "error when creating transport"

_connecting: ContextVar[bool] = ContextVar("broker_jobs_connecting", default=False)


class _DuringOurConnect(logging.Filter):
    """Drops a record above DEBUG made while one of our connects runs in the caller's
    context (aiormq's: only its connect failure)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not _connecting.get():
            return True
        if record.name == AIORMQ_LOGGER:
            message = record.msg
            return not (isinstance(message, str) and message.startswith(AIORMQ_CONNECT_FAILED))
        return False


@contextlib.contextmanager
def connect_lines_dropped() -> Iterator[None]:
    """Around one of our connection attempts: its driver's lines are dropped."""
    _install()
    token = _connecting.set(True)
    try:
        yield
    finally:
        _connecting.reset(token)


def _install() -> None:
    """The filter on the drivers' loggers, once per process (on first use, not at
    import: a process that never connects through us keeps them untouched)."""
    for name in (*PIKA_CONNECT_LOGGERS, AIORMQ_LOGGER):
        logger = logging.getLogger(name)
        if not any(isinstance(each, _DuringOurConnect) for each in logger.filters):
            logger.addFilter(_DuringOurConnect())
