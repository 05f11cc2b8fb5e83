"""The ``broker-jobs`` command line."""

from __future__ import annotations

import json
import sys

import click

from broker_jobs import __version__
from broker_jobs.beat_cli import beat_group
from broker_jobs.cli_options import url_option
from broker_jobs.errors import BrokerJobsError
from broker_jobs.publisher import Publisher
from broker_jobs.topology_cli import topology_group
from broker_jobs.urls import BrokerURLs
from broker_jobs.worker_cli import worker_command
from topology.names import DEFAULT_NAMESPACE


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="broker-jobs")
def main() -> None:
    """broker-jobs: RabbitMQ jobs that are not lost, duplicated or silently held."""


@main.command()
@url_option
@click.option("--namespace", default=DEFAULT_NAMESPACE, show_default=True)
@click.option("--key", "idempotency_key", help="Idempotency key (defaults to the job id).")
@click.option(
    "--no-declare", is_flag=True, help="Declare nothing; the topology is operator-managed."
)
@click.argument("task")
@click.argument("payload", default="{}")
def publish(  # noqa: PLR0917 - click passes every option positionally
    url: BrokerURLs,
    namespace: str,
    idempotency_key: str | None,
    no_declare: bool,
    task: str,
    payload: str,
) -> None:
    """Publish one job of TASK with a JSON object PAYLOAD and print its id once confirmed.

    \b
    Examples:
      broker-jobs publish image.resize '{"url": "https://example.com/a.png", "width": 128}'
      broker-jobs publish --url amqp://u:p@mq1/ --url amqp://u:p@mq2/ report.build
    """
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="PAYLOAD") from None
    if not isinstance(data, dict):
        raise click.BadParameter(
            "must be a JSON object, e.g. '{\"width\": 128}'", param_hint="PAYLOAD"
        )
    try:
        with Publisher(url, namespace=namespace, declare=not no_declare) as publisher:
            job = publisher.publish(task, data, idempotency_key=idempotency_key)
    except BrokerJobsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    click.echo(job.id)


main.add_command(topology_group)
main.add_command(worker_command)
main.add_command(beat_group)
