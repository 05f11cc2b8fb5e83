"""psycopg's line about a pipeline of ours that ended in an error, kept out of the
user's log.

When a statement of a pipelined batch fails (a standby after a failover, or
``default_transaction_read_only``, refuses the writes), psycopg raises the error, and
then, as the ``with conn.pipeline()`` block exits, logs ``WARNING psycopg: error
ignored terminating <psycopg.Pipeline [INERROR, pipeline=ON] ...>: pipeline aborted``:
the same failure again, once a try, about a line a second a worker for as long as the
server refuses (the ledger gate says the outage once, with the error). While one of
our pipelines runs, in that thread only, that line is lowered to DEBUG; psycopg's
other lines, and those about other code's pipelines, are kept as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from broker_jobs.log_scopes import ScopedFilter

#: psycopg's logger, and the format of its line about a pipeline (or a copy) whose
#: block raised and whose end failed as well.
PSYCOPG_LOGGER = "psycopg"
ENDED_IN_ERROR = "error ignored terminating %r: %s"


class _OurPipelineEnded(ScopedFilter):
    """Lowers to DEBUG psycopg's line about one of our pipelines that ended in error."""

    loggers = (PSYCOPG_LOGGER,)
    _active = ContextVar("broker_jobs_pipelining", default=False)

    def keep(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and record.msg == ENDED_IN_ERROR:
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


#: Around statements psycopg pipelines on its own (``executemany``).
ours = _OurPipelineEnded.active


@contextmanager
def pipelined(conn: Any) -> Iterator[None]:
    """``conn.pipeline()``, whose end after an error (raised to the caller) is not
    said again at WARNING."""
    with ours(), conn.pipeline():
        yield
