"""The ``broker-jobs`` command line."""

from __future__ import annotations

import click

from broker_jobs import __version__
from broker_jobs.cli.beat import beat_group
from broker_jobs.cli.dashboard import dashboard_command
from broker_jobs.cli.dlq import dlq_group
from broker_jobs.cli.exporter import exporter_command
from broker_jobs.cli.jobs import jobs_group
from broker_jobs.cli.publish import publish_command
from broker_jobs.cli.status import status_command
from broker_jobs.cli.topology import topology_group
from broker_jobs.cli.worker import worker_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="broker-jobs")
def main() -> None:
    """broker-jobs: RabbitMQ jobs that are not lost, duplicated or silently held."""


main.add_command(publish_command)
main.add_command(topology_group)
main.add_command(worker_command)
main.add_command(beat_group)
main.add_command(status_command)
main.add_command(jobs_group)
main.add_command(dlq_group)
main.add_command(exporter_command)
main.add_command(dashboard_command)
