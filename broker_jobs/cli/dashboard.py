"""``broker-jobs dashboard``: serve the web dashboard (docs/dashboard.md) with uvicorn.

Safe by default: it listens on 127.0.0.1, is read-only unless ``--allow-actions``,
and refuses to start with actions on another address without a token.
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from broker_jobs.app_loader import load_app
from broker_jobs.cli.beat import schedules_option
from broker_jobs.cli.options import log_options, store_option, url_option
from broker_jobs.cli.output import fail
from broker_jobs.cli.tasks import chosen_tasks, task_options
from broker_jobs.dashboard.settings import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    TOKEN_VARIABLE,
    DashboardSettings,
    check_binding,
)
from broker_jobs.errors import BrokerJobsError
from broker_jobs.observe.logs import configure_logging
from broker_jobs.store.urls import open_store
from broker_jobs.urls import BrokerURLs
from scheduler.config import load_schedules

logger = logging.getLogger("broker_jobs.dashboard")


@click.command("dashboard")
@url_option
@task_options("to show")
@store_option
@schedules_option
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="The address to listen on. Another than 127.0.0.1 reaches other hosts: with"
    " --allow-actions it needs --token.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="The port to serve the pages and /api/ on.",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Allow cancel, replay and purge (read-only without it).",
)
@click.option(
    "--token",
    envvar=TOKEN_VARIABLE,
    show_envvar=True,
    help="A secret every action must give (required with --allow-actions on another"
    " address than 127.0.0.1).",
)
@log_options
def dashboard_command(  # noqa: PLR0917 - click passes every option positionally
    url: BrokerURLs,
    app_option: str | None,
    namespace: str | None,
    tasks: tuple[str, ...],
    store_url: str,
    schedule_files: tuple[Path, ...],
    host: str,
    port: int,
    allow_actions: bool,
    token: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the web dashboard: tasks, jobs, dead letters, schedules.

    \b
    Example:
      broker-jobs dashboard --app myproject.tasks:app --store sqlite:///jobs.db
      broker-jobs dashboard --app myproject.tasks:app --host 0.0.0.0 --allow-actions \\
          --token "$BROKER_JOBS_DASHBOARD_TOKEN"
    """
    import uvicorn  # noqa: PLC0415 - only this command serves

    from broker_jobs.dashboard.app import create_app  # noqa: PLC0415

    try:
        check_binding(host, allow_actions=allow_actions, token=token)
    except BrokerJobsError as error:
        fail(str(error))
    selection = chosen_tasks(app_option, namespace, tasks, "to show")
    configure_logging(log_level, log_format)
    try:
        app = load_app(selection.app_path) if selection.app_path else None
        schedules = tuple(load_schedules(app, schedule_files)) if app else ()
        store = open_store(store_url, must_exist=True)
    except BrokerJobsError as error:
        fail(str(error))
    try:
        settings = DashboardSettings(
            store=store,
            urls=url,
            names=selection.names,
            tasks=tuple(selection.tasks),
            app=app,
            schedules=schedules,
            allow_actions=allow_actions,
            token=token or None,
            host=host,
        )
        logger.info(
            "dashboard on http://%s:%d/ (%s) for %s, broker %s",
            host,
            port,
            "actions allowed" if allow_actions else "read-only",
            ", ".join(settings.tasks),
            url.masked,
        )
        uvicorn.run(create_app(settings), host=host, port=port, log_config=None)
    finally:
        store.close()
