"""The ``broker-jobs`` command line.

Each command's module is imported when that command runs (or ``--help`` lists them
all): a worker process does not load the dashboard's web stack, nor a publish from
a shell script the beat's. A process of the CLI starts in about two thirds of the
time it took with every command imported.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click
from click.exceptions import NoArgsIsHelpError

from broker_jobs import __version__

#: Each command, and where it is defined (``module:attribute``).
COMMANDS = {
    "beat": "broker_jobs.cli.beat:beat_group",
    "dashboard": "broker_jobs.cli.dashboard:dashboard_command",
    "dlq": "broker_jobs.cli.dlq:dlq_group",
    "exporter": "broker_jobs.cli.exporter:exporter_command",
    "jobs": "broker_jobs.cli.jobs:jobs_group",
    "pause": "broker_jobs.cli.pausing:pause_command",
    "publish": "broker_jobs.cli.publish:publish_command",
    "resume": "broker_jobs.cli.pausing:resume_command",
    "status": "broker_jobs.cli.status:status_command",
    "topology": "broker_jobs.cli.topology:topology_group",
    "worker": "broker_jobs.cli.worker:worker_command",
    "workers": "broker_jobs.cli.workers:workers_command",
}


class _Commands(click.Group):
    """A group whose commands are imported when looked up, and whose usage errors
    are one line, as every other error of the CLI (click prints three: the usage,
    a hint, then the error)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        run = functools.partial(super().main, args, prog_name, complete_var, False, **extra)
        if not standalone_mode:
            return run()
        try:
            outcome: Any = run()
        except NoArgsIsHelpError as error:
            error.show()  # a group without its command: its help
            sys.exit(error.exit_code)
        except click.UsageError as error:
            message = error.format_message()
            if error.ctx is not None:
                message = f"{message.rstrip('.')} (see '{error.ctx.command_path} --help')"
            _fail(message, error.exit_code)
        except click.ClickException as error:
            _fail(error.format_message(), error.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(outcome if isinstance(outcome, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attribute = target.split(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command


def _fail(message: str, code: int) -> NoReturn:
    from broker_jobs.cli.output import fail  # noqa: PLC0415 - rich, on errors only

    fail(message, code)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="broker-jobs")
def main() -> None:
    """broker-jobs: RabbitMQ jobs that are not lost, duplicated or silently held."""
