"""``broker-jobs topology``: the operator's commands for the broker's objects.

The topology comes from the app (``--app module:attr``) or from a TOML file
(``--file``, see ``docs/operations.md``); both become one
:class:`~topology.file.NamespaceSpec`. ``plan`` and ``verify`` change nothing on
the broker, ``apply`` declares and never deletes. The options that name the
topology are :mod:`broker_jobs.cli.topology_source`'s; what plan, apply and verify
print is :mod:`broker_jobs.cli.topology_report`'s.

Exit codes: 0 in sync or done, 1 conflicts or any error (``error: ...`` on stderr,
passwords masked), 2 only from ``plan``, meaning changes are pending. Usage errors
exit 1 too here (click's default is 2), so that 2 from ``plan`` is unambiguous.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import pika
import pika.exceptions

from broker_jobs.amqp.connecting import connect_first_blocking
from broker_jobs.cli.options import url_option
from broker_jobs.cli.output import fail
from broker_jobs.cli.topology_report import (
    APPLY,
    EXIT_CONFLICT,
    LEFT_AS_THEY_ARE,
    PLAN,
    VERIFY,
    Report,
    bindings_line,
    fail_conflicts,
    ladder_names,
    report_options,
    with_conflicts,
)
from broker_jobs.cli.topology_source import namespace_option, namespace_spec, source_options
from broker_jobs.errors import BrokerJobsError
from broker_jobs.urls import BrokerURL, BrokerURLs
from topology import TopologyConflictError, declare
from topology.definitions import RABBITMQ_DEFINITIONS, definitions
from topology.errors import Conflict
from topology.file import NamespaceSpec, TopologyFileError
from topology.inspect import Inspection, Status, inspect_topology
from topology.names import InvalidNameError
from topology.permissions import Role, role_permissions
from topology.preflight import Level, Needs, preflight, rabbitmqctl

__all__ = ["topology_group"]

#: Seconds for the TCP and AMQP handshake of the operator's commands.
CONNECT_TIMEOUT = 10.0
EXIT_PENDING = 2


class _TopologyGroup(click.Group):
    """Usage errors exit 1, so that exit 2 from ``plan`` only means "changes"."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as error:
            error.exit_code = 1  # type: ignore[misc]  # click reads it from the instance
            raise


@click.group("topology", cls=_TopologyGroup)
def topology_group() -> None:
    """Plan, apply, verify and export the broker's exchanges and queues.

    \b
    The topology comes from the app's registered tasks (--app module:attr) or from
    a TOML file (--file topology.toml; see docs/operations.md).
    Exit codes: 0 in sync or done, 1 conflict or error, 2 (plan) changes pending.
    """


# -- commands -----------------------------------------------------------------------


@topology_group.command()
@url_option
@source_options
@report_options
def plan(
    url: BrokerURLs, app_path: str | None, file_path: Path | None, verbose: bool, as_json: bool
) -> None:
    """Show what exists, what apply would create and what conflicts. Read-only.

    Exit 0 when in sync, 2 when changes are pending, 1 on conflicts or errors.
    The delay ladder's levels are summed up in one line (conflicts always shown
    in full); --verbose lists each.

    \b
    Example:
      export BROKER_JOBS_URL='amqps://ops:PASSWORD@mq.internal/prod'
      broker-jobs topology plan --app myproject.tasks:app
    """
    with _errors():
        spec = namespace_spec(app_path, file_path)
        inspection, node = _inspect(url, spec, "plan")
    report = Report(PLAN, spec.names.namespace, node, inspection, ladder_names(spec))
    missing = len(inspection.having(Status.MISSING))
    conflicts = len(inspection.having(Status.CONFLICT))
    if as_json:
        report.echo_json()
    else:
        click.echo(f"namespace {report.namespace!r} on {node.masked}")
        report.echo_objects(verbose=verbose)
        click.echo(bindings_line(inspection))
        in_sync = len(inspection.objects) - missing - conflicts
        click.echo(f"plan: {missing} to create, {conflicts} conflicting, {in_sync} in sync")
    if conflicts:
        where = "each conflict's remedy" if as_json else "'to fix' above"
        fail(
            f"{conflicts} object(s) conflict with the wanted topology; resolve them (see"
            f" {where}), then run: broker-jobs topology apply",
            EXIT_CONFLICT,
        )
    if missing:
        if not as_json:
            click.echo("run `broker-jobs topology apply` to create them")
        sys.exit(EXIT_PENDING)


@topology_group.command()
@url_option
@source_options
@report_options
def apply(
    url: BrokerURLs, app_path: str | None, file_path: Path | None, verbose: bool, as_json: bool
) -> None:
    """Declare every exchange, queue and binding; change and delete nothing.

    Existing objects are left as they are; one with other settings is reported
    with each differing argument and the way to fix it (exit 1), and the rest is
    declared anyway. Needs a user with configure permission on the namespace.
    The delay ladder's levels are summed up in one line; --verbose lists each.

    \b
    Example:
      broker-jobs topology apply --file topology.toml --url "$OPERATOR_AMQP_URL"
    """
    conflicts: tuple[Conflict, ...] = ()
    with _errors():
        spec = namespace_spec(app_path, file_path)
        with _connection(url, "apply") as (connection, node):
            before = inspect_topology(connection, spec.topology())
            try:
                declared = declare(connection, spec.topology())
            except TopologyConflictError as error:
                conflicts = error.conflicts
            except pika.exceptions.ChannelClosedByBroker as error:
                fail(
                    f"the broker refused: {error.reply_code} {error.reply_text}. apply declares"
                    " exchanges and queues, which needs configure permission on the"
                    " namespace: run it as an operator user"
                )
    report = Report(
        APPLY, spec.names.namespace, node, with_conflicts(before, conflicts), ladder_names(spec)
    )
    if as_json:
        report.echo_json()
        if conflicts:
            fail(LEFT_AS_THEY_ARE.format(count=len(conflicts)), EXIT_CONFLICT)
        return
    if conflicts:
        fail_conflicts(conflicts)
    report.echo_objects(verbose=verbose)
    click.echo(
        f"applied namespace {report.namespace!r} on {node.masked}:"
        f" {len(before.having(Status.MISSING))} created,"
        f" {len(declared.exchanges) + len(declared.queues)} exchanges and queues in place,"
        f" {declared.bindings} bindings declared (nothing changed or deleted)"
    )


@topology_group.command()
@url_option
@source_options
@report_options
def verify(
    url: BrokerURLs, app_path: str | None, file_path: Path | None, verbose: bool, as_json: bool
) -> None:
    """Check that the broker holds the topology, for CI/CD and readiness probes.

    Read-only. Exit 0 when every exchange and queue exists as declared, 1 when one
    is missing or differs (or on an error). A user without configure permission
    (a worker's) can verify existence; settings are then reported as not checked.

    \b
    Example:
      broker-jobs topology verify --app myproject.tasks:app || exit 1
    """
    with _errors():
        spec = namespace_spec(app_path, file_path)
        inspection, node = _inspect(url, spec, "verify")
    report = Report(VERIFY, spec.names.namespace, node, inspection, ladder_names(spec))
    namespace = report.namespace
    if as_json:
        report.echo_json()
    if not inspection.in_sync:
        if not as_json:
            report.echo_objects(verbose=verbose)
        missing = len(inspection.having(Status.MISSING))
        conflicts = len(inspection.having(Status.CONFLICT))
        fail(
            f"namespace {namespace!r} is not in sync: {missing} missing,"
            f" {conflicts} conflicting. Run `broker-jobs topology plan` for details"
        )
    if as_json:
        return
    unchecked = len(inspection.having(Status.UNCHECKED))
    note = f"; {unchecked} not checked for settings (no configure permission)" if unchecked else ""
    click.echo(
        f"in sync: namespace {namespace!r}, {len(inspection.objects)} exchanges and queues"
        f" exist{note} (bindings cannot be listed over AMQP; apply re-declares them)"
    )


@topology_group.command()
@source_options
@click.option(
    "--format",
    "output_format",
    type=click.Choice([RABBITMQ_DEFINITIONS]),
    default=RABBITMQ_DEFINITIONS,
    show_default=True,
    help="The file's format: RabbitMQ definitions JSON (rabbitmqctl import_definitions,"
    " load_definitions).",
)
@click.option("--vhost", default="/", show_default=True, help="The vhost the objects go to.")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file instead of stdout.",
)
def export(
    app_path: str | None,
    file_path: Path | None,
    output_format: str,
    vhost: str,
    output: Path | None,
) -> None:
    """Write the topology as RabbitMQ definitions JSON (no broker needed).

    The file holds exchanges, queues and bindings of one vhost (no users or
    permissions) for `rabbitmqctl import_definitions` or the load_definitions
    setting. The vhost must exist before importing.

    \b
    Example:
      broker-jobs topology export --app myproject.tasks:app --vhost / -o jobs.json
      rabbitmqctl import_definitions jobs.json
    """
    del output_format  # one format so far; the option keeps the command line stable
    with _errors():
        spec = namespace_spec(app_path, file_path)
        document = definitions(spec.topology(), vhost)
        text = json.dumps(document, indent=2) + "\n"
        if output is None:
            click.echo(text, nl=False)
            return
        output.write_text(text, encoding="utf-8")
    counts = ", ".join(f"{len(document[key])} {key}" for key in ("exchanges", "queues", "bindings"))
    click.echo(f"wrote {counts} for vhost {vhost!r} to {output}", err=True)


@topology_group.command("preflight")
@url_option
@source_options
@namespace_option
@click.option(
    "--max-task-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="The longest a task may run; checked against the broker's consumer_timeout.",
)
@click.option(
    "--rabbitmqctl",
    "ctl_command",
    metavar="COMMAND",
    help="A rabbitmqctl command line reaching the node (e.g. 'rabbitmqctl -n rabbit@mq1'"
    " or 'docker compose exec -T rabbitmq rabbitmqctl'): reads feature flags and"
    " consumer_timeout instead of probing.",
)
def preflight_command(  # noqa: PLR0917 - click passes every option positionally
    url: BrokerURLs,
    app_path: str | None,
    file_path: Path | None,
    namespace: str | None,
    max_task_timeout: float | None,
    ctl_command: str | None,
) -> None:
    """Check that the broker can hold the topology: version, features, timeouts.

    Without --rabbitmqctl, features are probed with temporary queues named
    <namespace>.preflight.* (declared and deleted at once). Exit 1 when something
    required is missing; each problem comes with its fix.

    \b
    Example:
      broker-jobs topology preflight --app myproject.tasks:app --max-task-timeout 600
      broker-jobs topology preflight --rabbitmqctl 'docker compose exec -T rabbitmq rabbitmqctl'
    """
    with _errors():
        spec = namespace_spec(app_path, file_path, namespace=namespace, required=False)
        nodes: list[BrokerURL] = []  # the node checked: reconnects go to it first

        def connect() -> pika.BlockingConnection:
            connection, node = connect_first_blocking(
                url.starting_at(nodes[0] if nodes else None),
                timeout=CONNECT_TIMEOUT,
                connection_name="broker-jobs topology preflight",
            )
            nodes[:] = [node]
            return connection

        checks = preflight(
            connect,
            Needs.of(spec.topology(), max_task_timeout),
            spec.names.namespace,
            rabbitmqctl(ctl_command) if ctl_command else None,
        )
    click.echo(f"preflight of {nodes[0].masked if nodes else url.masked}")
    for check in checks:
        click.echo(f"  {check.level.value:<8} {check.title}: {check.detail}")
        if check.fix:
            label = "to fix" if check.level is Level.PROBLEM else "to check"
            click.echo(f"  {'':<8} {label}: {check.fix}")
    problems = [check for check in checks if check.level is Level.PROBLEM]
    if problems:
        fail(f"{len(problems)} problem(s): {', '.join(check.title for check in problems)}")


@topology_group.command()
@click.option(
    "--role",
    type=click.Choice([role.value for role in Role]),
    required=True,
    help="Who the user is.",
)
@source_options
@namespace_option
@click.option(
    "--vhost", default="/", show_default=True, help="The vhost the permissions are for."
)
@click.option("--user", help="The RabbitMQ user (default <namespace>-<role>).")
def permissions(  # noqa: PLR0917 - click passes every option positionally
    role: str,
    app_path: str | None,
    file_path: Path | None,
    namespace: str | None,
    vhost: str,
    user: str | None,
) -> None:
    """Print the least-privilege rabbitmqctl set_permissions command for a role.

    With the topology applied by an operator, no role needs configure permission.
    A worker reads the task queues of --app/--file, or every task queue of
    --namespace.

    \b
    Example:
      rabbitmqctl add_user jobs-publisher 's3cret'
      broker-jobs topology permissions --role publisher --namespace jobs | sh
    """
    with _errors():
        spec = namespace_spec(app_path, file_path, namespace=namespace, required=False)
        tasks = spec.task_names if app_path or file_path else None
        granted = role_permissions(Role(role), spec.names, tasks)
    namespace = spec.names.namespace
    click.echo(f"# {role} of namespace {namespace!r} in vhost {vhost!r}:")
    for note in granted.notes:
        click.echo(f"#   {note}")
    click.echo(granted.command(user or f"{namespace}-{role}", vhost))


# -- helpers ------------------------------------------------------------------------


@contextmanager
def _connection(
    urls: BrokerURLs, command: str
) -> Iterator[tuple[pika.BlockingConnection, BrokerURL]]:
    """A connection to the first node that answers, and that node."""
    connection, node = connect_first_blocking(
        urls, timeout=CONNECT_TIMEOUT, connection_name=f"broker-jobs topology {command}"
    )
    try:
        yield connection, node
    finally:
        if connection.is_open:
            connection.close()


def _inspect(urls: BrokerURLs, spec: NamespaceSpec, command: str) -> tuple[Inspection, BrokerURL]:
    with _connection(urls, command) as (connection, node):
        return inspect_topology(connection, spec.topology()), node


@contextmanager
def _errors() -> Iterator[None]:
    """Turn every expected failure into one masked ``error:`` line and exit 1."""
    try:
        yield
    except (BrokerJobsError, TopologyFileError, InvalidNameError) as error:
        fail(str(error))
    except pika.exceptions.AMQPError as error:
        fail(f"the broker failed the command: {type(error).__name__}: {error}")
    except OSError as error:
        fail(f"{error.filename or 'I/O'}: {error.strerror or error}")
