"""Options shared by the command groups of the ``broker-jobs`` command line."""

from __future__ import annotations

import click

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"

url_option = click.option(
    "--url",
    envvar="BROKER_JOBS_URL",
    default=DEFAULT_URL,
    show_default="$BROKER_JOBS_URL or amqp://guest:***@localhost:5672/",
    help="AMQP URL of the broker (amqps:// for TLS).",
)
