"""Which tasks a command takes: every task of an app (``--app``, or those of them
given with ``--task``), or the ``--task`` names in ``--namespace`` (for an operator
without the app's code). One rule for ``status``, ``exporter`` and ``dlq``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from broker_jobs.app_loader import load_app
from broker_jobs.cli.options import app_option, from_environment
from topology.names import InvalidNameError, Names, check_task_name

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class TaskSelection:
    names: Names  # the namespace's names
    tasks: list[str]  # in the order given (the app's: sorted), each once
    app_path: str | None  # None: chosen by --namespace and --task
    #: The queues of each task that has several (priority levels, shards), from the
    #: app; None without it: found on the broker (``ops.status.lanes_found``).
    lanes: Mapping[str, tuple[str, ...]] | None = None


def task_options(purpose: str) -> Callable[[F], F]:
    """``--app``, ``--namespace`` and ``--task`` (repeatable); ``purpose`` ends the
    --task help ("to show", "to export"...). The command function gets
    ``app_option``, ``namespace`` and ``tasks``: pass them to :func:`chosen_tasks`."""

    def decorate(function: F) -> F:
        function = click.option(
            "--task",
            "tasks",
            multiple=True,
            metavar="NAME",
            help=f"A task {purpose} (repeatable): with --namespace, or a subset of the"
            " app's tasks (default: all of them).",
        )(function)
        function = click.option(
            "--namespace", help="The namespace, without --app (give its tasks with --task)."
        )(function)
        return app_option(function)

    return decorate


def chosen_tasks(
    app: str | None, namespace: str | None, tasks: tuple[str, ...], purpose: str
) -> TaskSelection:
    """The tasks the options name; a usage error (exit 2) saying what to add otherwise.
    An explicit --namespace wins over an app that only came from BROKER_JOBS_APP."""
    app_path = _app_path(app, namespace)
    if app_path is None:
        if namespace is None:
            raise click.UsageError(
                "no tasks given: add --app MODULE:APP, or --namespace NS with --task NAME"
            )
        if not tasks:
            raise click.UsageError(
                f"--namespace {namespace} needs the tasks {purpose}: add --task NAME (repeatable)"
            )
        return TaskSelection(
            _names(namespace), [_task_name(task) for task in dict.fromkeys(tasks)], None
        )
    loaded = load_app(app_path)
    unknown = [task for task in tasks if task not in loaded]
    known = sorted(task.name for task in loaded)
    if unknown:
        listed = ", ".join(known) or "none"
        raise click.UsageError(f"{unknown[0]!r} is not a task of {app_path} (it has {listed})")
    if not known:
        raise click.UsageError(f"--app {app_path} declares no tasks: declare some first")
    return TaskSelection(
        loaded.names, list(dict.fromkeys(tasks)) or known, app_path, loaded.lanes_by_task()
    )


def chosen_names(app: str | None, namespace: str | None) -> Names:
    """The namespace's names, from ``--app`` or ``--namespace``; a usage error (exit 2)
    saying what to add when neither is given."""
    app_path = _app_path(app, namespace)
    if app_path is not None:
        return load_app(app_path).names
    if namespace is None:
        raise click.UsageError("no namespace given: add --app MODULE:APP, or --namespace NS")
    return _names(namespace)


def _app_path(app: str | None, namespace: str | None) -> str | None:
    if app is None or namespace is None:
        return app
    if from_environment("app_option"):
        return None
    raise click.UsageError("give --app or --namespace (with --task), not both")


def _names(namespace: str) -> Names:
    try:
        return Names(namespace)
    except InvalidNameError as error:
        raise click.BadParameter(str(error), param_hint="--namespace") from None


def _task_name(task: str) -> str:
    """``task`` if it can be a task name; checked before connecting to anything."""
    try:
        return check_task_name(task)
    except InvalidNameError as error:
        raise click.BadParameter(str(error), param_hint="--task") from None
