"""``broker-jobs pause TASK...`` and ``resume TASK...``: the operator's pause, a row
in the ledger every worker of the namespace follows (docs/operations.md, "pause and
resume"). ``--wait`` waits until every live worker of the tasks says, in its
heartbeat, that it follows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from broker_jobs.cli.options import app_option, store_option, who_asks
from broker_jobs.cli.output import echo_json, fail, json_option
from broker_jobs.cli.tasks import TaskSelection, chosen_tasks
from broker_jobs.cli.waiting import still_waiting
from broker_jobs.errors import BrokerJobsError
from broker_jobs.ops.processes import process_views
from broker_jobs.ops.readable import when
from broker_jobs.store.base import Store
from broker_jobs.store.processes import Liveness, ProcessKind
from broker_jobs.store.urls import open_store
from topology.names import InvalidNameError

F = TypeVar("F", bound=Callable[..., Any])

_tasks_argument = click.argument("task_names", metavar="TASK...", nargs=-1, required=True)
_namespace_option = click.option(
    "--namespace", help="The namespace, without --app (the tasks are named as arguments)."
)
_wait_option = click.option(
    "--wait",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Wait up to SECONDS until every live worker of the tasks follows (its"
    " heartbeat says so); exit 1 if one does not by then.",
)


def _control_options(function: F) -> F:
    """TASK..., --app, --namespace, --store, --wait, --json: pause's and resume's."""
    for option in reversed(
        (_tasks_argument, app_option, _namespace_option, store_option, _wait_option, json_option)
    ):
        function = option(function)
    return function


@click.command("pause")
@_control_options
def pause_command(  # noqa: PLR0917 - click passes every option positionally
    task_names: tuple[str, ...],
    app_option: str | None,
    namespace: str | None,
    store_url: str,
    wait: float | None,
    as_json: bool,
) -> None:
    """Pause tasks: every worker stops starting their jobs within a few seconds.

    Running jobs finish; jobs a worker holds but has not started go back to their
    queue; new jobs wait in it; a worker started meanwhile starts paused. Durable (a
    row in the ledger): it holds across worker and broker restarts until `resume`.

    \b
    Examples:
      broker-jobs pause image.resize --app myproject.tasks:app --wait 30
      broker-jobs pause mail.send --namespace jobs --store postgresql://ops@db/jobs
    """
    chosen = _chosen(app_option, namespace, task_names)
    namespace_name = chosen.names.namespace
    try:
        with open_store(store_url, must_exist=True) as store:
            pauses = [store.pause(namespace_name, task, who_asks()) for task in chosen.tasks]
            late = still_waiting(
                lambda: _not_following(store, namespace_name, chosen.tasks, paused=True), wait
            )
    except BrokerJobsError as error:
        fail(str(error))
    if as_json:
        echo_json(
            {
                "namespace": namespace_name,
                "paused": [{"task": p.task, "since": when(p.since), "by": p.by} for p in pauses],
                "not_following": late,
            }
        )
    else:
        for pause in pauses:
            click.echo(
                f"paused {pause.task} in namespace {namespace_name!r} (since"
                f" {when(pause.since)}, by {pause.by}): workers stop starting its jobs within a"
                " few seconds; running jobs finish"
            )
        _say_late(late, "paused")
        tasks = " ".join(chosen.tasks)
        click.echo(f"resume with: broker-jobs resume {tasks} --namespace {namespace_name}")
    if late:
        raise SystemExit(1)


@click.command("resume")
@_control_options
def resume_command(  # noqa: PLR0917 - click passes every option positionally
    task_names: tuple[str, ...],
    app_option: str | None,
    namespace: str | None,
    store_url: str,
    wait: float | None,
    as_json: bool,
) -> None:
    """Resume paused tasks: every worker consumes them again within a few seconds.

    \b
    Examples:
      broker-jobs resume image.resize --app myproject.tasks:app
    """
    chosen = _chosen(app_option, namespace, task_names)
    namespace_name = chosen.names.namespace
    try:
        with open_store(store_url, must_exist=True) as store:
            lifted = {task: store.resume(namespace_name, task) for task in chosen.tasks}
            late = still_waiting(
                lambda: _not_following(store, namespace_name, chosen.tasks, paused=False), wait
            )
    except BrokerJobsError as error:
        fail(str(error))
    if as_json:
        echo_json({"namespace": namespace_name, "resumed": lifted, "not_following": late})
    else:
        for task, was_paused in lifted.items():
            click.echo(
                f"resumed {task} in namespace {namespace_name!r}: workers consume it again within"
                " a few seconds"
                if was_paused
                else f"{task} in namespace {namespace_name!r} was not paused: nothing to do"
            )
        _say_late(late, "resumed")
    if late:
        raise SystemExit(1)


def _chosen(app: str | None, namespace: str | None, tasks: tuple[str, ...]) -> TaskSelection:
    try:
        return chosen_tasks(app, namespace, tasks, "to pause or resume")
    except InvalidNameError as error:
        raise click.BadParameter(str(error), param_hint="TASK") from None


def _not_following(store: Store, namespace: str, tasks: list[str], *, paused: bool) -> list[str]:
    follows: Callable[[tuple[str, ...], str], bool] = (
        (lambda held, task: task in held) if paused else (lambda held, task: task not in held)
    )
    return [
        view.record.id
        for view in process_views(store, namespace, tasks=tasks)
        if view.record.kind is ProcessKind.WORKER
        and view.liveness is Liveness.ALIVE
        and not all(follows(view.record.paused, t) for t in tasks if t in view.record.tasks)
    ]


def _say_late(late: list[str], done: str) -> None:
    if late:
        click.echo(
            f"not {done} yet on {len(late)} live worker(s): {', '.join(late)} (an older"
            " broker-jobs, or one that cannot read the ledger: see its log)",
            err=True,
        )
