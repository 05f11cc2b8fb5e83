"""Logging of the daemons (worker, beat, exporter): a level and a format for people
(``text``) or for log shippers (``json``: one object per line).

A JSON line has ``time`` (ISO 8601 UTC), ``level``, ``logger`` and ``message``, plus
every field a log call passes in ``extra`` (a job's ``job_id``, ``key``, ``task``,
``attempt``, ``duration_s``, ``worker``, ``error_type``, ``error``...), and the
traceback as ``exc_info`` when there is one. Every message, text or JSON, goes
through :func:`broker_jobs.urls.mask_text` and the store's DSN masking once more, so
a password that reached a log call by mistake is still not written.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from broker_jobs.job_context import HANDLER_LOGGER
from broker_jobs.printable import printable, printable_lines
from broker_jobs.store.base import mask_dsn
from broker_jobs.urls import mask_text

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Loggers of the AMQP drivers below us. Their lines about connections (aiormq logs
#: an ERROR per failed connection attempt) are shown as DEBUG: broker-jobs logs an
#: outage itself, once, and an alert on ERROR lines must not fire on a routine
#: broker restart.
_QUIET = ("pika", "aiormq", "aio_pika")


class DemoteDrivers(logging.Filter):
    """The drivers' records at DEBUG, kept only when the handler's level shows DEBUG."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self._level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.partition(".")[0] not in _QUIET:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self._level <= logging.DEBUG


class MaskPasswords(logging.Filter):
    """Masks passwords in the formatted message (and its arguments) of every record;
    the formatters mask tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = _masked(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def _masked(text: str) -> str:
    return mask_dsn(mask_text(text))


class _Text(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        # One record, one line: a newline or an escape sequence from a message's text
        # (a job id, a handler's error) must not forge a line or reach the terminal.
        record.message = printable(record.message)
        line = super().formatMessage(record)
        job_id = getattr(record, "job_id", None)
        if record.name != HANDLER_LOGGER or job_id is None:
            return line  # the worker's own lines name their job in the message
        # A handler's lines (JobContext.log) carry the job's fields: shown after it.
        task, attempt = getattr(record, "task", "?"), getattr(record, "attempt", "?")
        return f"{line} [{task} job {job_id} attempt {attempt}]"

    def formatException(self, ei: Any) -> str:
        return printable_lines(_masked(super().formatException(ei)))


class _JsonLines(JsonFormatter):
    def formatException(self, ei: Any) -> str:
        # The base may return lines (exc_info_as_array), which this formatter never sets.
        formatted = super().formatException(ei)
        assert isinstance(formatted, str)
        return _masked(formatted)

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data.setdefault("level", record.levelname)
        log_data.setdefault("logger", record.name)


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """Send the root logger's records to stderr at ``level`` in ``log_format``
    (replacing handlers set before: a daemon configures its logging once)."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(DemoteDrivers(logging.getLevelName(level.upper())))
    handler.addFilter(MaskPasswords())
    if log_format == "json":
        handler.setFormatter(
            _JsonLines(
                "%(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                timestamp="time",
            )
        )
    else:
        handler.setFormatter(_Text(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
