"""Options shared by the command groups of the ``broker-jobs`` command line."""

from __future__ import annotations

import logging

import click

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"

url_option = click.option(
    "--url",
    envvar="BROKER_JOBS_URL",
    default=DEFAULT_URL,
    show_default="$BROKER_JOBS_URL or amqp://guest:***@localhost:5672/",
    help="AMQP URL of the broker (amqps:// for TLS).",
)

#: The embedded default: an SQLite file in the working directory.
DEFAULT_STORE = "sqlite:///broker-jobs.db"

store_option = click.option(
    "--store",
    "store_url",
    envvar="BROKER_JOBS_STORE",
    default=DEFAULT_STORE,
    show_default=True,
    help="Idempotency store: sqlite:///path.db, postgresql://..., memory://.",
)


def configure_logging() -> None:
    """INFO for broker-jobs' own daemons; pika's connection chatter only from WARNING."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("pika").setLevel(logging.WARNING)
