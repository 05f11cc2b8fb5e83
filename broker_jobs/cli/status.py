"""``broker-jobs status``: per task, what the broker's queues hold and what the ledger
knows, in one table (or one JSON document). Read-only on both."""

from __future__ import annotations

from collections.abc import Sequence

import click

from broker_jobs.cli.options import store_option, url_option
from broker_jobs.cli.output import console, echo_json, fail, json_option, table
from broker_jobs.cli.tasks import chosen_tasks, task_options
from broker_jobs.errors import BrokerJobsError
from broker_jobs.ops.dead_letter_ledger import unindexed_note
from broker_jobs.ops.publishing_check import Publishing
from broker_jobs.ops.readable import span
from broker_jobs.ops.status import (
    QueueState,
    StatusReport,
    TaskStatus,
    collect,
    missing_hint,
)
from broker_jobs.store.base import Status, mask_dsn
from broker_jobs.store.urls import open_store
from broker_jobs.urls import BrokerURLs
from topology.names import InvalidNameError

_COLUMNS = (
    "task",
    "ready",
    "running",
    "consumers",
    "queued",
    "scheduled",
    "retrying",
    "dead letters",
    "failed",
    "ok/h",
    "failed/h",
    "oldest waiting",
    "p50",
    "p99",
)


@click.command("status")
@url_option
@task_options("to show")
@store_option
@json_option
def status_command(  # noqa: PLR0917 - click passes every option positionally
    url: BrokerURLs,
    app_option: str | None,
    namespace: str | None,
    tasks: tuple[str, ...],
    store_url: str,
    as_json: bool,
) -> None:
    """Show each task's queues on the broker and its jobs in the ledger. Read-only.

    Ready messages, consumers and dead letters come from the broker (passive
    declares; a hint names dead letters missing from the ledger's index); running
    and the other states, the last hour's executions, the oldest waiting job and the
    p50/p99 durations from the ledger. AMQP cannot count
    delivered but unacknowledged messages: "running" is the ledger's count. A last
    line says whether the broker takes publishes now (two test publishes that no
    queue takes): BLOCKED under a memory or disk alarm, with the broker's reason.

    \b
    Examples:
      broker-jobs status --app myproject.tasks:app
      broker-jobs status --namespace jobs --task image.resize --task mail.send --json
    """
    try:
        chosen = chosen_tasks(app_option, namespace, tasks, "to show")
        with open_store(store_url, must_exist=True) as store:
            report = collect(
                url, chosen.names, chosen.tasks, store, lanes=chosen.lanes, ask_publishing=True
            )
    except (BrokerJobsError, InvalidNameError) as error:
        fail(str(error))
    if as_json:
        echo_json(report.document())
        return
    _echo(report, store_url, chosen.app_path)


def _echo(report: StatusReport, store_url: str, app_path: str | None) -> None:
    click.echo(
        f"namespace {report.namespace!r} on {report.node}, ledger {mask_dsn(store_url)},"
        f" at {report.taken_at.isoformat(timespec='seconds').replace('+00:00', 'Z')}"
    )
    grid = table(*_COLUMNS, right=_COLUMNS[1:])
    for task in report.tasks:
        grid.add_row(*_row(task, report))
    console().print(grid)
    click.echo(_ladder_line(report))
    click.echo(_unroutable_line(report.unroutable, report.namespace))
    if report.publishing is not None:
        click.echo(_publishing_line(report.publishing))
    click.echo("running: the ledger's running jobs (AMQP cannot count unacked deliveries)")
    if report.missing:
        click.echo(f"missing: {_missing(report)}; {missing_hint(app_path)}")
    for task in report.tasks:
        if task.paused is not None:
            click.echo(
                f"paused: {task.task} since {task.paused.since.isoformat(timespec='seconds')}"
                f" by {task.paused.by}: workers start none of its jobs; broker-jobs resume"
                f" {task.task} --namespace {report.namespace}"
            )
    unindexed = {task.task: task.unindexed_dead_letters for task in report.tasks}
    if any(unindexed.values()):
        missed = {name: count for name, count in unindexed.items() if count}
        click.echo(unindexed_note(report.namespace, missed))


def _row(task: TaskStatus, report: StatusReport) -> list[str]:
    counts, summary = task.ledger.counts, task.ledger
    return [
        task.task if task.paused is None else f"{task.task} (paused)",
        _count(task.queue, task.queue.messages),
        str(task.running),
        _count(task.queue, task.queue.consumers),
        str(counts[Status.QUEUED]),
        str(counts[Status.SCHEDULED]),
        str(counts[Status.RETRYING]),
        _count(task.dead_letters, task.dead_letters.messages),
        str(counts[Status.FAILED]),
        str(summary.succeeded_last_hour),
        str(summary.failed_last_hour),
        span(task.oldest_waiting_age(report.taken_at)),
        span(summary.p50),
        span(summary.p99),
    ]


def _count(queue: QueueState, value: int | None) -> str:
    return "missing" if not queue.exists or value is None else str(value)


def _ladder_line(report: StatusReport) -> str:
    ladder = report.ladder
    line = f"delay ladder: {ladder.messages} delayed job(s) waiting in {ladder.levels} levels"
    if ladder.missing:
        line += f" ({len(ladder.missing)} level queue(s) missing)"
    return line


def _unroutable_line(queue: QueueState, namespace: str) -> str:
    if not queue.exists:
        return f"unroutable: queue {queue.name} missing"
    note = (
        f": declare their task, then `broker-jobs jobs reroute --namespace {namespace}`"
        " (a worker does it too when it connects)"
        if queue.messages
        else ""
    )
    return f"unroutable: {queue.messages} job(s) in {queue.name}{note}"


def _publishing_line(publishing: Publishing) -> str:
    if publishing.accepted:
        return "publishing: accepted (the broker confirmed two test publishes)"
    if publishing.accepted is None:
        return f"publishing: not known: {publishing.why}"
    why = f" ({publishing.blocked_reason})" if publishing.blocked_reason else ""
    return (
        f"publishing: BLOCKED by the broker{why}: no publish is confirmed, so publishers"
        " wait, workers hold their retries and dead letters, and dlq commands take nothing."
        " A memory or disk alarm: `rabbitmq-diagnostics alarms` on its nodes; it clears once"
        " memory or disk is freed"
    )


def _missing(report: StatusReport) -> str:
    """The missing queues by name, the ladder's levels as a count."""
    ladder = set(report.ladder.missing)
    named: Sequence[str] = [name for name in report.missing if name not in ladder]
    parts = list(named)
    if ladder:
        parts.append(f"{len(ladder)} delay level queue(s)")
    return ", ".join(parts)
