"""``broker-jobs worker``: run a worker daemon for some task types of an app."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

import click
from prometheus_client import CollectorRegistry

from broker_jobs.app import App
from broker_jobs.app_loader import load_app
from broker_jobs.cli_options import (
    app_argument,
    app_option,
    chosen_app,
    log_options,
    metrics_port_option,
    store_option,
    url_option,
)
from broker_jobs.errors import BrokerJobsError
from broker_jobs.observe.logs import configure_logging
from broker_jobs.observe.server import Health, serving
from broker_jobs.observe.worker_metrics import WorkerMetrics
from broker_jobs.store.base import DEFAULT_RETENTION, Store
from broker_jobs.store.urls import open_store
from broker_jobs.urls import BrokerURLs
from broker_jobs.worker import Worker, WorkerSettings


@click.command("worker")
@url_option
@app_argument
@app_option
@click.option(
    "--task", "tasks", multiple=True, help="A task type to run (repeatable); default: all."
)
@click.option("--concurrency", default=4, show_default=True, help="Jobs run at once.")
@click.option(
    "--prefetch", type=int, help="Unacked deliveries held (default 2 x concurrency + 64)."
)
@store_option
@click.option("--burst", is_flag=True, help="Exit once the queues are empty (tests, batch jobs).")
@click.option("--grace", default=30.0, show_default=True, help="Seconds to finish jobs on SIGTERM.")
@click.option(
    "--no-declare", is_flag=True, help="Declare nothing; the topology is operator-managed."
)
@click.option(
    "--lease",
    default=60.0,
    show_default=True,
    help="Seconds a claim lasts without renewal; a dead worker's jobs wait this long.",
)
@click.option(
    "--reconnect-timeout",
    type=click.FloatRange(min=0, min_open=True),
    envvar="BROKER_JOBS_RECONNECT_TIMEOUT",
    help="Seconds without a broker after which the worker exits with code 75 so that"
    " a supervisor restarts it (default: keep reconnecting, logging every 30 s).",
)
@click.option(
    "--consumer-timeout",
    default=1800.0,
    show_default=True,
    help="The broker's consumer_timeout in seconds; longer task time limits are refused.",
)
@click.option(
    "--retention",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_RETENTION / timedelta(days=1),
    show_default=True,
    envvar="BROKER_JOBS_RETENTION_DAYS",
    show_envvar=True,
    metavar="DAYS",
    help="Days finished jobs (and their executions) stay in the ledger before the"
    " worker prunes them; a pruned job runs again if it is delivered again, so keep"
    " it longer than any redelivery or replay.",
)
@log_options
@metrics_port_option
def worker_command(  # noqa: PLR0917 - click passes every option positionally
    url: BrokerURLs,
    app_argument: str | None,
    app_option: str | None,
    tasks: tuple[str, ...],
    concurrency: int,
    prefetch: int | None,
    store_url: str,
    burst: bool,
    grace: float,
    no_declare: bool,
    lease: float,
    reconnect_timeout: float | None,
    consumer_timeout: float,
    retention: float,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Consume and run jobs of the app, acking each only once its outcome is recorded.

    \b
    Example:
      broker-jobs worker --app myproject.tasks:app --task image.resize --concurrency 8

    \b
    Exit codes: 0 stopped by SIGTERM/SIGINT (or drained, with --burst); 1 an error
    the message explains; 69 the broker cancelled a consumer (its queue was
    deleted); 75 no broker for --reconnect-timeout seconds.
    """
    app_path = chosen_app(app_option, app_argument)
    configure_logging(log_level.lower(), log_format)
    try:
        app = load_app(app_path)
        settings = WorkerSettings(
            tasks=tasks or None,
            concurrency=concurrency,
            prefetch=prefetch,
            burst=burst,
            grace=grace,
            declare=not no_declare,
            lease=lease,
            consumer_timeout=consumer_timeout,
            reconnect_timeout=reconnect_timeout,
            retention=timedelta(days=retention),
        )
        with open_store(store_url) as store:
            outcomes = asyncio.run(_run(url, app, store, settings, metrics_port))
    except BrokerJobsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    click.echo(
        ", ".join(f"{name}: {count}" for name, count in sorted(outcomes.items())) or "no jobs"
    )


async def _run(
    url: BrokerURLs, app: App, store: Store, settings: WorkerSettings, metrics_port: int | None
) -> dict[str, int]:
    if metrics_port is None:
        worker = Worker(url, app, store, settings)
        worker.install_signal_handlers()
        return dict(await worker.run())
    registry = CollectorRegistry()
    worker = Worker(url, app, store, settings, metrics=WorkerMetrics(registry))
    worker.install_signal_handlers()
    async with serving(registry, Health(worker.readiness), metrics_port):
        return dict(await worker.run())
