"""``broker-jobs beat``: run a beat process, or show the beat's state.

    broker-jobs beat --app MODULE:APP [--schedules FILE.toml ...]     run one beat
    broker-jobs beat status --app MODULE:APP [--schedules FILE.toml]  leader, last and next fires

The app may also be given as the first argument, as before (``beat MODULE:APP``).

Run several beats for availability: one leads and emits, the others wait.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import click

from broker_jobs.app import App
from broker_jobs.app_loader import load_app
from broker_jobs.cli.options import (
    app_argument,
    app_option,
    chosen_app,
    daemon_options,
    store_option,
)
from broker_jobs.cli.output import echo_json, json_option
from broker_jobs.clock import utc_now
from broker_jobs.errors import BrokerJobsError
from broker_jobs.observe.beat_metrics import BeatMetrics
from broker_jobs.observe.logs import configure_logging
from broker_jobs.observe.server import Health, process_registry, serving
from broker_jobs.ops.readable import when
from broker_jobs.store.base import Store
from broker_jobs.store.records import LeaderRecord
from broker_jobs.store.urls import open_store
from broker_jobs.store.waiting import open_store_when_up
from broker_jobs.urls import BrokerURLs
from scheduler.beat import Beat, BeatSettings, fire_key
from scheduler.config import load_schedules
from scheduler.digests import Mismatch, schedule_digests
from scheduler.schedules import Schedule
from scheduler.status import is_stale, status_document

schedules_option = click.option(
    "--schedules",
    "schedule_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A TOML file of [[schedule]] tables (repeatable), besides the app's own.",
)


class _BeatGroup(click.Group):
    """``beat MODULE:APP`` runs a beat; ``beat status ...`` is a subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("beat", cls=_BeatGroup)
def beat_group() -> None:
    """Emit scheduled jobs (cron, interval, one-off) from an elected leader.

    \b
    Examples:
      broker-jobs beat --app myproject.tasks:app
      broker-jobs beat --app myproject.tasks:app --url amqp://u:p@mq1/,amqp://u:p@mq2/
      broker-jobs beat status --app myproject.tasks:app --json
    """


@beat_group.command("run")
@daemon_options
@schedules_option
@click.option(
    "--heartbeat",
    default=5,
    show_default=True,
    help="AMQP heartbeat (s): a paused leader is replaced about two heartbeats later.",
)
@click.option("--identity", help="This beat's name in `beat status` (default host:pid).")
def run_command(  # noqa: PLR0917 - click passes every option positionally
    url: BrokerURLs,
    app_argument: str | None,
    app_option: str | None,
    schedule_files: tuple[Path, ...],
    store_url: str,
    heartbeat: int,
    identity: str | None,
    no_declare: bool,
    metrics_port: int | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run one beat process for the app's schedules (the default subcommand).

    With --metrics-port: /metrics, /healthz (the event loop turns) and /readyz
    (connected to the broker, leading or following)."""
    app_path = chosen_app(app_option, app_argument)
    configure_logging(log_level.lower(), log_format)
    try:
        app = load_app(app_path)
        schedules = load_schedules(app, schedule_files)
        settings = BeatSettings(identity=identity, heartbeat=heartbeat, declare=not no_declare)
        with open_store_when_up(store_url) as store:
            asyncio.run(_run(url, app, schedules, store, settings, metrics_port))
    except BrokerJobsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)


async def _run(  # noqa: PLR0917 - the run command's settings, passed on
    url: BrokerURLs,
    app: App,
    schedules: Sequence[Schedule],
    store: Store,
    settings: BeatSettings,
    metrics_port: int | None,
) -> None:
    registry = process_registry()
    metrics = BeatMetrics(registry, app.namespace, [schedule.name for schedule in schedules])
    beat = Beat(url, app, schedules, store, settings, metrics=metrics)
    beat.install_signal_handlers()
    if metrics_port is None:
        await beat.run()
    else:
        async with serving(registry, Health(beat.readiness), metrics_port):
            await beat.run()


@beat_group.command("status")
@app_argument
@app_option
@schedules_option
@store_option
@json_option
def status_command(
    app_argument: str | None,
    app_option: str | None,
    schedule_files: tuple[Path, ...],
    store_url: str,
    as_json: bool,
) -> None:
    """Show the leader (as it last announced itself) and each schedule's last and next
    fire. Read-only: an SQLite ledger that does not exist is an error."""
    app_path = chosen_app(app_option, app_argument)
    try:
        app = load_app(app_path)
        schedules = load_schedules(app, schedule_files)
        with open_store(store_url, must_exist=True) as store:
            now = utc_now()
            if as_json:
                echo_json(status_document(app, schedules, store, now))
                return
            lines = status_lines(app, schedules, store, now)
    except BrokerJobsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    click.echo("\n".join(lines))


def agreement_lines(leader: LeaderRecord, schedules: Sequence[Schedule]) -> list[str]:
    """The leader's schedules, and how those given here differ from them."""
    if leader.schedules is None:
        return ["leader's schedules: not recorded (a beat of an older broker-jobs)"]
    mismatch = Mismatch.between(schedule_digests(schedules), leader.schedules)
    listed = ", ".join(sorted(leader.schedules)) or "none"
    if not mismatch:
        return [f"leader's schedules: {listed} (the same as these)"]
    return [
        f"leader's schedules: {listed}",
        f"  differ from these: {mismatch.describe()}; only the leader's fire: deploy the"
        " same schedules to every beat",
    ]


def status_lines(app: App, schedules: Sequence[Schedule], store: Store, now: datetime) -> list[str]:
    """The leader as last announced, and one line per schedule."""
    leader = store.leader(app.namespace)
    if leader is None:
        lines = ["leader: none has led yet"]
    else:
        age = (now - leader.seen_at).total_seconds()
        stale = is_stale(leader.seen_at, now)
        lines = [
            f"leader: {leader.identity} since {when(leader.since)},"
            f" last seen {age:.0f} s ago{' (stale: no beat leads now?)' if stale else ''}",
            *agreement_lines(leader, schedules),
        ]
    lines.append(
        f"{'schedule':<20} {'task':<20} {'when':<28} {'catch-up':<8} {'last fire':<20} next fire"
    )
    for schedule in schedules:
        last = store.last_fire(fire_key(app.namespace, schedule.name))
        upcoming = schedule.timing.next_fire(now)
        lines.append(
            f"{schedule.name:<20} {schedule.task:<20} {schedule.timing!s:<28}"
            f" {schedule.catch_up.value:<8} {when(last):<20} {when(upcoming)}"
        )
    return lines
