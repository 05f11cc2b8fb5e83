"""The ``broker-jobs`` command line."""

from __future__ import annotations

import click

from broker_jobs import __version__
from broker_jobs.beat_cli import beat_group
from broker_jobs.dashboard_cli import dashboard_command
from broker_jobs.dlq_cli import dlq_group
from broker_jobs.exporter_cli import exporter_command
from broker_jobs.jobs_cli import jobs_group
from broker_jobs.publish_cli import publish_command
from broker_jobs.status_cli import status_command
from broker_jobs.topology_cli import topology_group
from broker_jobs.worker_cli import worker_command


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
