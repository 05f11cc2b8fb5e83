"""Where ``broker-jobs topology`` reads the wanted topology from: the app's registered
tasks (``--app module:attr``), a TOML file (``--file``, ``docs/operations.md``), or for
``preflight`` and ``permissions`` a bare ``--namespace``. Each becomes one
:class:`~topology.file.NamespaceSpec`, so that every command sees the same objects."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from broker_jobs.app_loader import load_app
from broker_jobs.cli.options import from_environment
from topology import Names
from topology.file import NamespaceSpec, load_file
from topology.names import DEFAULT_NAMESPACE

F = TypeVar("F", bound=Callable[..., Any])


def source_options(function: F) -> F:
    """``--app`` and ``--file``: the command function gets ``app_path`` and
    ``file_path``; pass them to :func:`namespace_spec`."""
    function = click.option(
        "--file",
        "file_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="TOML file describing the namespace (for operators without the app's code).",
    )(function)
    return click.option(
        "--app",
        "app_path",
        metavar="MODULE:ATTR",
        envvar="BROKER_JOBS_APP",
        help="The App object, e.g. myproject.tasks:app (imported from the current directory;"
        " $BROKER_JOBS_APP, which --file or --namespace overrides).",
    )(function)


def namespace_option(function: F) -> F:
    """``--namespace``, for a command that can do without the topology's objects."""
    return click.option(
        "--namespace",
        help=f"Namespace without --app/--file (default {DEFAULT_NAMESPACE!r}).",
    )(function)


def namespace_spec(
    app_path: str | None,
    file_path: Path | None,
    *,
    namespace: str | None = None,
    required: bool = True,
) -> NamespaceSpec:
    """The namespace of the options given (one of them); without any, a usage error
    when ``required``, else the namespace alone (``--namespace`` or the default). An
    app from ``BROKER_JOBS_APP`` gives way to an explicit --file or --namespace."""
    if app_path and (file_path or namespace is not None) and from_environment("app_path"):
        app_path = None
    given = [option for option, value in [("--app", app_path), ("--file", file_path)] if value]
    if namespace is not None:
        given.append("--namespace")
    if len(given) > 1:
        raise click.UsageError(f"give one of {' and '.join(given)}, not both")
    if app_path:
        app = load_app(app_path)
        return NamespaceSpec(app.names, tuple((task.name, task.queue) for task in app))
    if file_path:
        return load_file(file_path)
    if required:
        raise click.UsageError(
            "give the topology: --app MODULE:ATTR (the App object) or --file topology.toml"
        )
    return NamespaceSpec(Names(namespace or DEFAULT_NAMESPACE))
