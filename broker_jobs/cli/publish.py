"""``broker-jobs publish``: one job from the shell, printed once the broker confirmed it."""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import datetime
from typing import Any

import click

from broker_jobs.app_loader import load_app
from broker_jobs.cli.options import Duration, from_environment, url_option
from broker_jobs.errors import (
    BrokerJobsError,
    ConfigurationError,
    TopologyMissingError,
    UnroutableError,
)
from broker_jobs.publish.publisher import Publisher
from broker_jobs.store import Store, open_store
from broker_jobs.urls import BrokerURLs
from topology.names import DEFAULT_NAMESPACE


@click.command("publish")
@url_option
@click.option(
    "--app",
    "app_path",
    metavar="MODULE:APP",
    envvar="BROKER_JOBS_APP",
    help="Validate PAYLOAD against the task's model and take the namespace from the app"
    " (its topology is declared unless --no-declare; $BROKER_JOBS_APP, which --namespace"
    " overrides).",
)
@click.option(
    "--namespace",
    help=f"Namespace of the jobs, without --app (default {DEFAULT_NAMESPACE!r}).",
)
@click.option("--key", "idempotency_key", help="Idempotency key (default: the job id).")
@click.option(
    "--delay",
    type=Duration(),
    help="Run it this long from now: seconds (30) or a duration (90s, 5m, 1h30m, 1d).",
)
@click.option(
    "--eta",
    help="Run it at this time: ISO 8601 with a time zone, e.g. 2026-12-24T18:00:00Z.",
)
@click.option(
    "--priority",
    help="high, normal, low or 0-9 (7-9 high, 0-2 low), for a task declared with"
    " priorities (its queue of that level).",
)
@click.option(
    "--no-declare",
    is_flag=True,
    help="With --app: declare nothing (the topology is operator-managed). Without --app"
    " nothing is declared anyway.",
)
@click.option(
    "--ledger",
    "ledger_url",
    metavar="STORE_URL",
    help="Record the job as queued (or scheduled) in this store, the workers' --store,"
    " once confirmed: `broker-jobs jobs` then lists it and can cancel it before it runs."
    " Without it the ledger knows the job from its first claim.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the job as one JSON object.")
@click.argument("task")
@click.argument("payload", default="{}")
def publish_command(  # noqa: PLR0917 - click passes every option positionally
    url: BrokerURLs,
    app_path: str | None,
    namespace: str | None,
    idempotency_key: str | None,
    delay: float | None,
    eta: str | None,
    priority: str | None,
    no_declare: bool,
    ledger_url: str | None,
    as_json: bool,
    task: str,
    payload: str,
) -> None:
    """Publish one job of TASK with a JSON object PAYLOAD; print its id once confirmed.

    \b
    Examples:
      broker-jobs publish image.resize '{"url": "https://example.com/a.png", "width": 128}'
      broker-jobs publish --app myproject.tasks:app --delay 30 report.build '{}'
      broker-jobs publish --url amqp://u:p@mq1/ --url amqp://u:p@mq2/ report.build
    """
    data = _payload(payload)
    used = namespace or DEFAULT_NAMESPACE
    try:
        with contextlib.ExitStack() as stack:
            ledger = stack.enter_context(open_store(ledger_url)) if ledger_url else None
            publisher, used = _publisher(url, app_path, namespace, no_declare, ledger)
            with publisher:
                job = publisher.publish(
                    task,
                    data,
                    idempotency_key=idempotency_key,
                    delay=delay,
                    eta=_eta(eta),
                    priority=priority,
                )
    except TopologyMissingError as error:
        declaring = "without --no-declare" if app_path else "with --app module:app"
        click.echo(
            f"error: the broker says {error.broker_message!r}: namespace {used!r} has no"
            " topology there. Declare it: `broker-jobs topology apply --app module:app`, or"
            f" publish {declaring} (the app's topology is declared then); if the task lives"
            " in another namespace, pass --namespace",
            err=True,
        )
        sys.exit(1)
    except UnroutableError as error:
        click.echo(
            f"error: {error} (namespace {used!r}: if the task lives in another one, pass"
            " --namespace or --app)",
            err=True,
        )
        sys.exit(1)
    except BrokerJobsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    if as_json:
        click.echo(json.dumps(_job_summary(job.model_dump(mode="json"))))
    else:
        click.echo(job.id)


def _publisher(
    url: BrokerURLs,
    app_path: str | None,
    namespace: str | None,
    no_declare: bool,
    ledger: Store | None,
) -> tuple[Publisher, str]:
    """The publisher and its namespace. With an app: typed, in its namespace,
    declaring its topology unless told not to. Without: untyped, declaring nothing
    (a typo in a task or a namespace must not leave exchanges behind)."""
    if app_path is not None and namespace is not None and from_environment("app_path"):
        app_path = None
    if app_path is None:
        namespace = namespace or DEFAULT_NAMESPACE
        return Publisher(url, namespace=namespace, declare=False, ledger=ledger), namespace
    app = load_app(app_path)
    if namespace is not None and namespace != app.namespace:
        raise ConfigurationError(
            f"--namespace {namespace!r} contradicts the app's namespace {app.namespace!r}:"
            " leave --namespace out with --app"
        )
    return Publisher(url, app, declare=not no_declare, ledger=ledger), app.namespace


def _payload(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="PAYLOAD") from None
    if not isinstance(data, dict):
        raise click.BadParameter(
            "must be a JSON object, e.g. '{\"width\": 128}'", param_hint="PAYLOAD"
        )
    return data


def _eta(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 time: use e.g. 2026-12-24T18:00:00Z",
            param_hint="--eta",
        ) from None
    if moment.tzinfo is None:
        raise click.BadParameter(
            f"{text!r} has no time zone: add Z (UTC) or an offset such as +01:00",
            param_hint="--eta",
        )
    return moment


def _job_summary(job: dict[str, Any]) -> dict[str, Any]:
    """What a script needs of a published job."""
    fields = ("id", "task", "idempotency_key", "attempt", "created_at", "due_at")
    return {field: job[field] for field in fields}
