"""``broker-jobs jobs purge TASK``: delete a task's pending jobs, after a count and a
confirmation (:mod:`broker_jobs.ops.task_purge`)."""

from __future__ import annotations

import click

from broker_jobs.amqp.connecting import connect_first_blocking
from broker_jobs.cli.options import app_option, store_option, url_option
from broker_jobs.cli.output import ask_first, echo_json, fail, json_option
from broker_jobs.cli.tasks import chosen_tasks
from broker_jobs.errors import BrokerJobsError
from broker_jobs.ops.status import CONNECT_TIMEOUT
from broker_jobs.ops.task_purge import pending, purge_pending
from broker_jobs.store.urls import open_store
from broker_jobs.urls import BrokerURLs
from topology.names import InvalidNameError


@click.command("purge")
@click.argument("task")
@url_option
@app_option
@click.option("--namespace", help="The namespace, without --app.")
@store_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
def purge_command(  # noqa: PLR0917 - click passes every option positionally
    task: str,
    url: BrokerURLs,
    app_option: str | None,
    namespace: str | None,
    store_url: str,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete TASK's pending jobs: its queues' ready messages, and the ledger's
    queued, scheduled and retrying jobs (recorded cancelled).

    Counts first and asks unless --yes (without a terminal, --yes is required).
    Running jobs finish. A job a worker holds but has not started, or a delayed job
    the ledger knows, is skipped when it comes (cancelled). Pause the task first
    (broker-jobs pause) to stop workers taking new jobs meanwhile.

    \b
    Example:
      broker-jobs jobs purge image.resize --app myproject.tasks:app
    """
    try:
        chosen = chosen_tasks(app_option, namespace, (task,), "to purge")
    except InvalidNameError as error:
        raise click.BadParameter(str(error), param_hint="TASK") from None
    lanes = None if chosen.lanes is None else chosen.lanes.get(task)
    try:
        with open_store(store_url, must_exist=True) as store:
            connection, _ = connect_first_blocking(
                url, timeout=CONNECT_TIMEOUT, connection_name="broker-jobs jobs purge"
            )
            try:
                counted = pending(connection, chosen.names, task, store, lanes)
                if not yes:
                    ask_first(
                        f"delete {counted.ready} ready message(s) of {', '.join(counted.queues)}"
                        f" and cancel {counted.waiting} waiting job(s) of {task} in the ledger?",
                        deletes="jobs",
                    )
                # The queues counted: found once, not looked for again.
                done = purge_pending(connection, chosen.names, task, store, counted.queues)
            finally:
                if connection.is_open:
                    connection.close()
    except BrokerJobsError as error:
        fail(str(error))
    if as_json:
        echo_json(done.document())
        return
    click.echo(
        f"purged {done.purged} message(s) of {task} and cancelled {done.cancelled} waiting"
        " job(s) in the ledger; running jobs finish"
    )
