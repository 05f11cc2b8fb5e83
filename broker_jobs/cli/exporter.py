"""``broker-jobs exporter``: serve the queues' and the ledger's figures to Prometheus.

    broker-jobs exporter --app MODULE:APP [--store STORE_URL] [--metrics-port 9102]
    broker-jobs exporter --namespace NS --task NAME [--task NAME ...]
    broker-jobs exporter --app MODULE:APP --once          one poll, the metrics on stdout

One per deployment (docs/metrics.md, "Exporter").
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click
from prometheus_client import CollectorRegistry, generate_latest

from broker_jobs.cli.options import log_options, url_option

# The app or namespace and tasks are chosen as `broker-jobs status` chooses them.
from broker_jobs.cli.tasks import chosen_tasks, task_options
from broker_jobs.errors import BrokerJobsError
from broker_jobs.observe.logs import configure_logging
from broker_jobs.observe.server import Health, process_registry, serving
from broker_jobs.ops.exporter import POLL_EVERY, Exporter
from broker_jobs.urls import BrokerURLs
from topology.names import InvalidNameError

DEFAULT_PORT = 9102


@click.command("exporter")
@url_option
@task_options("to export")
@click.option(
    "--store",
    "store_url",
    envvar="BROKER_JOBS_STORE",
    show_envvar=True,
    metavar="STORE_URL",
    help="The ledger the workers use, for its figures (default: none, broker figures only)."
    " Read-only: an SQLite file that does not exist is a failed poll, never created.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    envvar="BROKER_JOBS_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus /metrics, /healthz and /readyz on this port.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=POLL_EVERY,
    show_default=True,
    help="Seconds from the end of one poll to the start of the next.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Poll once, print the metrics text to stdout and exit (1 when the poll failed).",
)
@log_options
def exporter_command(  # noqa: PLR0917 - click passes every option positionally
    url: BrokerURLs,
    app_option: str | None,
    namespace: str | None,
    tasks: tuple[str, ...],
    store_url: str | None,
    metrics_port: int,
    interval: float,
    once: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Serve each task's queue depths and consumers, dead letters, the delay ladder,
    unroutable jobs and (with --store) the ledger's counts as Prometheus metrics.

    Polls the broker over AMQP (passive declares: no management plugin, nothing
    created) every --interval seconds and keeps serving the last figures when a
    poll fails (broker_jobs_exporter_up 0). /readyz: a poll succeeded, and the last
    one did.

    \b
    Examples:
      broker-jobs exporter --app myproject.tasks:app --store postgresql://ops@db/jobs
      broker-jobs exporter --namespace jobs --task mail.send --once
    """
    configure_logging(log_level.lower(), log_format)
    # pika logs each failed connect as several ERRORs with tracebacks; a poll's failure
    # is logged once per streak, masked and in one line, by the exporter itself.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    try:
        chosen = chosen_tasks(app_option, namespace, tasks, "to export")
        registry = process_registry()
        exporter = Exporter(
            url,
            chosen.names,
            chosen.tasks,
            registry,
            store_url=store_url,
            interval=interval,
            lanes=chosen.lanes,
        )
        if once:
            _once(exporter, registry)
        asyncio.run(_serve(exporter, registry, metrics_port))
    except (BrokerJobsError, InvalidNameError) as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)


def _once(exporter: Exporter, registry: CollectorRegistry) -> None:
    polled = exporter.poll()
    exporter.close()
    click.echo(generate_latest(registry).decode(), nl=False)
    sys.exit(0 if polled else 1)


async def _serve(exporter: Exporter, registry: CollectorRegistry, port: int) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    async with serving(registry, Health(exporter.ready), port):
        await exporter.run(stopping)
