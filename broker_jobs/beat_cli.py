"""``broker-jobs beat``: run a beat process, or show the beat's state.

    broker-jobs beat MODULE:APP [--schedules FILE.toml ...]     run one beat
    broker-jobs beat status MODULE:APP [--schedules FILE.toml]  leader, last and next fires

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
from broker_jobs.cli_options import configure_logging, store_option, url_option
from broker_jobs.envelope import utc_now
from broker_jobs.errors import BrokerJobsError
from broker_jobs.store.base import Store
from broker_jobs.store.urls import open_store
from broker_jobs.urls import BrokerURLs
from scheduler.beat import ANNOUNCE_EVERY, Beat, BeatSettings, fire_key
from scheduler.config import load_schedules
from scheduler.schedules import Schedule

#: A leader that has not announced itself for this many announce periods is shown
#: as stale (it died, or lost the broker, since).
STALE_AFTER_ANNOUNCES = 3

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
      broker-jobs beat myproject.tasks:app
      broker-jobs beat myproject.tasks:app --url amqp://u:p@mq1/,amqp://u:p@mq2/
      broker-jobs beat status myproject.tasks:app
    """


@beat_group.command("run")
@url_option
@click.argument("app_path", metavar="MODULE:APP")
@schedules_option
@store_option
@click.option(
    "--heartbeat",
    default=5,
    show_default=True,
    help="AMQP heartbeat (s): a paused leader is replaced about two heartbeats later.",
)
@click.option("--identity", help="This beat's name in `beat status` (default host:pid).")
@click.option(
    "--no-declare", is_flag=True, help="Declare nothing; the topology is operator-managed."
)
def run_command(  # noqa: PLR0917 - click passes every option positionally
    url: BrokerURLs,
    app_path: str,
    schedule_files: tuple[Path, ...],
    store_url: str,
    heartbeat: int,
    identity: str | None,
    no_declare: bool,
) -> None:
    """Run one beat process for MODULE:APP's schedules (the default subcommand)."""
    configure_logging()
    try:
        app = load_app(app_path)
        schedules = load_schedules(app, schedule_files)
        settings = BeatSettings(identity=identity, heartbeat=heartbeat, declare=not no_declare)
        with open_store(store_url) as store:
            asyncio.run(_run(url, app, schedules, store, settings))
    except BrokerJobsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)


async def _run(
    url: BrokerURLs, app: App, schedules: Sequence[Schedule], store: Store, settings: BeatSettings
) -> None:
    beat = Beat(url, app, schedules, store, settings)
    beat.install_signal_handlers()
    await beat.run()


@beat_group.command("status")
@click.argument("app_path", metavar="MODULE:APP")
@schedules_option
@store_option
def status_command(app_path: str, schedule_files: tuple[Path, ...], store_url: str) -> None:
    """Show the leader (as it last announced itself) and each schedule's last and next fire."""
    try:
        app = load_app(app_path)
        schedules = load_schedules(app, schedule_files)
        with open_store(store_url, must_exist=True) as store:
            lines = status_lines(app, schedules, store, utc_now())
    except BrokerJobsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    click.echo("\n".join(lines))


def status_lines(app: App, schedules: Sequence[Schedule], store: Store, now: datetime) -> list[str]:
    """The leader as last announced, and one line per schedule."""
    leader = store.leader(app.namespace)
    if leader is None:
        lines = ["leader: none has led yet"]
    else:
        age = (now - leader.seen_at).total_seconds()
        stale = age > STALE_AFTER_ANNOUNCES * ANNOUNCE_EVERY
        lines = [
            f"leader: {leader.identity} since {_when(leader.since)},"
            f" last seen {age:.0f} s ago{' (stale: no beat leads now?)' if stale else ''}"
        ]
    lines.append(
        f"{'schedule':<20} {'task':<20} {'when':<28} {'catch-up':<8} {'last fire':<20} next fire"
    )
    for schedule in schedules:
        last = store.last_fire(fire_key(app.namespace, schedule.name))
        upcoming = schedule.timing.next_fire(now)
        lines.append(
            f"{schedule.name:<20} {schedule.task:<20} {schedule.timing!s:<28}"
            f" {schedule.catch_up.value:<8} {_when(last):<20} {_when(upcoming)}"
        )
    return lines


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
