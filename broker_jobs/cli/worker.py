"""``broker-jobs worker``: run a worker daemon for some task types of an app."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import click

from broker_jobs.app import App
from broker_jobs.app_loader import load_app
from broker_jobs.cli.options import chosen_app, daemon_options
from broker_jobs.errors import BrokerJobsError, ConfigurationError, HandlerStuckError
from broker_jobs.observe.logs import configure_logging
from broker_jobs.observe.server import Health, process_registry, serving
from broker_jobs.observe.worker_metrics import WorkerMetrics
from broker_jobs.store.base import DEFAULT_RETENTION, Store
from broker_jobs.store.waiting import open_store_when_up
from broker_jobs.urls import BrokerURLs
from broker_jobs.watched_loop import WatchedLoop
from broker_jobs.worker import Worker, WorkerSettings, frame_reading
from broker_jobs.worker.daemon import runnable_tasks
from broker_jobs.worker.success_summary import SUCCESS_LINES
from broker_jobs.worker.supervisor import Supervisor, parse_processes


class ProcessCount(click.ParamType):  # type: ignore[type-arg]
    """``--processes``: a number of worker processes (1 or more) or ``auto``."""

    name = "N|auto"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_processes(str(value))
        except ConfigurationError as error:
            self.fail(str(error), param, ctx)


@dataclass(frozen=True)
class WorkerRun:
    """Everything one worker process needs, as parsed options: picklable, so that a
    supervisor hands it to the children it spawns."""

    url: BrokerURLs
    app_path: str
    store_url: str
    settings: WorkerSettings
    log_level: str
    log_format: str
    metrics_port: int | None

    def for_child(self, index: int) -> WorkerRun:
        """Child ``index``'s run: it serves metrics on ``--metrics-port`` + index (port
        0, any free port, stays 0)."""
        if not self.metrics_port:
            return self
        return replace(self, metrics_port=self.metrics_port + index)


@click.command("worker")
@daemon_options
@click.option(
    "--task", "tasks", multiple=True, help="A task type to run (repeatable); default: all."
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Jobs run at once.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=1),
    help="Unacked deliveries held per queue (default 2 x concurrency + 64, 4 x that"
    " while jobs run short: docs/worker.md, Prefetch); a value given is kept as given.",
)
@click.option("--burst", is_flag=True, help="Exit once the queues are empty (tests, batch jobs).")
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to finish jobs on SIGTERM.",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds a claim lasts without renewal: the jobs a dead worker had claimed"
    " (running, and waiting in its prefetch) wait up to this long, less when a worker on"
    " the same host sees its process gone (docs/worker.md).",
)
@click.option(
    "--overrun-grace",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    envvar="BROKER_JOBS_OVERRUN_GRACE",
    show_envvar=True,
    help="Seconds a sync handler interrupted at its time limit has to return; one still"
    " running then makes the worker exit with code 70 to be replaced (docs/worker.md,"
    " Time limits).",
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
@click.option(
    "--processes",
    type=ProcessCount(),
    default="1",
    show_default=True,
    envvar="BROKER_JOBS_PROCESSES",
    show_envvar=True,
    help="Worker processes run by one supervisor (auto: one per CPU); each has its own"
    " broker connection and store handle, and serves --metrics-port + its index"
    " (docs/worker.md, Processes).",
)
@click.option(
    "--log-successes",
    "success_lines",
    type=click.Choice(SUCCESS_LINES),
    default="summary",
    show_default=True,
    envvar="BROKER_JOBS_LOG_SUCCESSES",
    show_envvar=True,
    help="summary: one INFO line a second counts the jobs that succeeded (each one's"
    " line at DEBUG); each: a line per success at INFO. Failures, retries and dead"
    " letters have a line each either way (docs/metrics.md, Logs).",
)
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
    overrun_grace: float,
    reconnect_timeout: float | None,
    consumer_timeout: float,
    retention: float,
    processes: int,
    success_lines: str,
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
    deleted); 70 a handler stuck past its time limit and --overrun-grace (restart
    the worker); 75 no broker for --reconnect-timeout seconds. With --processes N > 1:
    0 when every process exited 0, else the first non-zero exit (docs/worker.md).
    """
    settings = _settings(
        tasks=tasks or None,
        concurrency=concurrency,
        prefetch=prefetch,
        burst=burst,
        grace=grace,
        declare=not no_declare,
        lease=lease,
        overrun_grace=overrun_grace,
        consumer_timeout=consumer_timeout,
        reconnect_timeout=reconnect_timeout,
        retention=timedelta(days=retention),
        processes=processes,
        success_lines=success_lines,
    )
    run = WorkerRun(
        url=url,
        app_path=chosen_app(app_option, app_argument),
        store_url=store_url,
        settings=settings,
        log_level=log_level.lower(),
        log_format=log_format,
        metrics_port=metrics_port,
    )
    if processes == 1:
        run_worker(run)  # as it always was: no supervisor process
        return
    if metrics_port and metrics_port + processes - 1 > 65535:
        raise click.BadParameter(
            f"{metrics_port} + {processes - 1}: the last process's port would exceed 65535",
            param_hint="--metrics-port",
        )
    configure_logging(run.log_level, log_format)
    supervisor = Supervisor(functools.partial(run_child, run), processes, grace=grace, burst=burst)
    sys.exit(supervisor.run())


def _settings(**given: Any) -> WorkerSettings:
    """The worker's settings, or a usage error naming what does not fit together (a
    --prefetch below --concurrency): one line, not a traceback."""
    try:
        return WorkerSettings(**given)
    except ConfigurationError as error:
        raise click.UsageError(str(error)) from None


def run_child(run: WorkerRun, index: int) -> None:
    """A supervised child process's work (module-level: the spawn context pickles it)."""
    run_worker(run.for_child(index))


def run_worker(run: WorkerRun) -> None:
    """One worker in this process; exits with the error's code on a BrokerJobsError,
    prints the outcomes' summary at its end."""
    configure_logging(run.log_level, run.log_format)
    try:
        app = load_app(run.app_path)
        runnable_tasks(app, run.settings.tasks)  # before a store file is made for nothing
        # A WatchedLoop: handler threads report to it without a self-pipe write
        # while it is busy (broker_jobs/watched_loop.py).
        with (
            open_store_when_up(run.store_url) as store,
            asyncio.Runner(loop_factory=WatchedLoop) as loop,
        ):
            outcomes = loop.run(_run(run.url, app, store, run.settings, run.metrics_port))
    except HandlerStuckError as error:
        # At once: a stuck handler thread would hold up the interpreter's exit, and
        # its job's next attempt is due a few seconds from now.
        click.echo(f"error: {error}", err=True)
        logging.shutdown()
        os._exit(error.exit_code)
    except BrokerJobsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    click.echo(
        ", ".join(f"{name}: {count}" for name, count in sorted(outcomes.items())) or "no jobs"
    )


async def _run(
    url: BrokerURLs, app: App, store: Store, settings: WorkerSettings, metrics_port: int | None
) -> dict[str, int]:
    # The worker's own process: aiormq reads whole frames in one step
    # (broker_jobs/worker/frame_reading.py), as the WatchedLoop above is its own loop.
    with frame_reading.reading_whole_frames():
        if metrics_port is None:
            worker = Worker(url, app, store, settings)
            worker.install_signal_handlers()
            return dict(await worker.run())
        registry = process_registry()
        worker = Worker(url, app, store, settings, metrics=WorkerMetrics(registry))
        worker.install_signal_handlers()
        async with serving(registry, Health(worker.readiness), metrics_port):
            return dict(await worker.run())
