"""``broker-jobs jobs reroute``: send the delayed jobs of ``<ns>.unroutable`` on to
their task queues (:mod:`broker_jobs.ops.unroutable`)."""

from __future__ import annotations

import click

from broker_jobs.cli.options import app_option, url_option
from broker_jobs.cli.output import echo_json, fail, json_option
from broker_jobs.cli.tasks import chosen_names
from broker_jobs.errors import BrokerJobsError
from broker_jobs.ops.unroutable import NOT_A_LADDER_KEY, Rerouted, reroute
from broker_jobs.plural import plural
from broker_jobs.urls import BrokerURLs


@click.command("reroute")
@url_option
@app_option
@click.option("--namespace", help="The namespace, without --app.")
@json_option
def reroute_command(
    url: BrokerURLs, app_option: str | None, namespace: str | None, as_json: bool
) -> None:
    """Send the delayed jobs waiting in <ns>.unroutable on to their task queues.

    The delay ladder puts a job there when its task has no queue, or when the broker
    released it while starting, before its queue's binding was back. Each job whose
    task has a queue now is published to it (confirmed) and removed; the others stay,
    in their order. Workers do the same each time they connect.

    \b
    Example:
      broker-jobs jobs reroute --namespace jobs
    """
    names = chosen_names(app_option, namespace)
    try:
        rerouted = reroute(url, names, connection_name="broker-jobs jobs reroute")
    except BrokerJobsError as error:
        fail(str(error))
    if as_json:
        echo_json(rerouted.document())
        return
    for line in summary_lines(rerouted):
        click.echo(line)


def summary_lines(rerouted: Rerouted) -> list[str]:
    """What a pass did, for people: a line for what was sent on, one per task key
    still without a queue; one line when the queue was empty (or does not exist)."""
    if not rerouted.depth:
        return [f"nothing waits in {rerouted.queue}"]
    moved = sum(rerouted.moved.values())
    lines = [f"sent on {plural(moved, 'job')} from {rerouted.queue} to their task queues"]
    lines += [f"  {count} to {key}" for key, count in sorted(rerouted.moved.items())]
    for key, count in sorted(rerouted.kept.items()):
        if key == NOT_A_LADDER_KEY:
            lines.append(
                f"kept {plural(count, 'message')} that did not come out of the delay ladder"
                " (no task in its routing key): read or purge them with rabbitmqctl or the"
                " management UI"
            )
        else:
            lines.append(
                f"kept {plural(count, 'job')} for {key}: no queue is bound for it; declare"
                " the task (broker-jobs topology apply) and run this again"
            )
    return lines
