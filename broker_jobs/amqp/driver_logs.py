"""The AMQP drivers' own lines about a connection of ours, dropped.

A failed connect makes pika log ten lines (seven at ERROR) and aiormq one ERROR, in
the log of whatever process publishes: a web service with its broker down logged
them for every request. A connection of the sync publisher that the broker drops
(a restart, a heartbeat missed while idle: an RST) made pika log about thirty lines
and two tracebacks at its next publish. Our own error or WARNING names the node and
why, so while one of our connects runs, or the sync publisher's link turns pika's
loop, in that thread or task only, those lines are dropped; the drivers' DEBUG
lines, their lines about anything else, and other code's connections are kept.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from broker_jobs.log_scopes import ScopedFilter

#: The loggers pika logs a connect's failure to (each logger's own filters see only
#: records made on it, not its children's).
PIKA_CONNECT_LOGGERS = (
    "pika.adapters.base_connection",
    "pika.adapters.blocking_connection",  # the topology's declaring connection
    "pika.channel",
    "pika.adapters.utils.connection_workflow",
    "pika.adapters.utils.io_services_utils",
    "pika.connection",
)
#: aiormq's one line, and the beginning of its message. aiormq starts its reader task
#: inside the connect, so that task inherits the flag below: its lines are kept by
#: matching this one only.
AIORMQ_LOGGER = "aiormq.connection"
AIORMQ_CONNECT_FAILED = "error when creating transport"


class _DuringOurConnections(ScopedFilter):
    """Drops a record above DEBUG made while our code drives a connection (aiormq's:
    only its connect failure)."""

    loggers = (*PIKA_CONNECT_LOGGERS, AIORMQ_LOGGER)
    _active = ContextVar("broker_jobs_connecting", default=False)

    def keep(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return True
        if record.name == AIORMQ_LOGGER:
            message = record.msg
            return not (isinstance(message, str) and message.startswith(AIORMQ_CONNECT_FAILED))
        return False


#: Around one of our connection attempts: its driver's lines are dropped.
connect_lines_dropped = _DuringOurConnections.active
#: Around a turn of pika's loop by the sync publisher's link (which meets a lost
#: connection there, and closes its own): pika's lines are dropped.
link_lines_dropped = _DuringOurConnections.active
