"""``broker-jobs jobs``: the ledger's jobs. ``list`` and ``show`` read; ``cancel``
marks a job that has not started so that it never runs.

Exit codes of ``cancel``: 0 the job will not run (cancelled now, or before); 3 it
was not cancelled because it started (running, or finished); 1 no such job, or an
error. Usage errors exit 2, as everywhere.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import click

from broker_jobs.cli.jobs_purge import purge_command
from broker_jobs.cli.jobs_reroute import reroute_command
from broker_jobs.cli.options import store_option
from broker_jobs.cli.output import AWARE_DATETIME, console, echo_json, fail, json_option, table
from broker_jobs.errors import BrokerJobsError
from broker_jobs.keywords import closest
from broker_jobs.ops.documents import (
    PAYLOAD_NOT_KEPT,
    CursorError,
    decode_cursor,
    encode_cursor,
    execution_document,
    follow_ups_document,
    payload_document,
    record_document,
    result_document,
    size_too_large_text,
    too_large_text,
)
from broker_jobs.ops.readable import first_line, span, when
from broker_jobs.printable import printable
from broker_jobs.store.base import (
    CancelOutcome,
    JobRecord,
    KeptOutput,
    KeptPayload,
    Status,
    Store,
)
from broker_jobs.store.urls import open_store

#: ``cancel``: the job was not cancelled because it started (running or finished).
EXIT_STARTED = 3
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000

_UNKNOWN_HINT = (
    "a job is known to the ledger before it starts only when it was published with the"
    " ledger (Publisher(..., ledger=store)); others appear once a worker claims them"
    " (docs/operations.md, 'jobs: list, show, cancel')"
)


@click.group("jobs")
def jobs_group() -> None:
    """List, show and cancel the ledger's jobs; purge a task's pending jobs; send
    unroutable delayed jobs on to their queues.

    \b
    Examples:
      broker-jobs jobs list --task image.resize --state failed --since 2026-05-01T00:00:00Z
      broker-jobs jobs show invoice-42-thumb
      broker-jobs jobs cancel 0190f3c2-7a4e-7d1c-9b1e-5c2f8a9d0e11
    """


@jobs_group.command("list")
@click.option("--task", help="Only jobs of this task.")
@click.option(
    "--state",
    type=click.Choice([status.value for status in Status], case_sensitive=False),
    help="Only jobs in this state.",
)
@click.option("--key", "key_prefix", metavar="PREFIX", help="Only keys starting with PREFIX.")
@click.option(
    "--since", type=AWARE_DATETIME, help="Only jobs updated at or after TIME (ISO 8601, a zone)."
)
@click.option(
    "--until", type=AWARE_DATETIME, help="Only jobs updated before TIME (ISO 8601, a zone)."
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIMIT),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Jobs per page.",
)
@click.option(
    "--after",
    "cursor",
    metavar="CURSOR",
    help="The next page: the cursor the previous page printed (give the same filters).",
)
@click.option(
    "--oldest-first",
    is_flag=True,
    help="Oldest updated first (default: newest first); give it with --after too.",
)
@store_option
@json_option
def list_command(  # noqa: PLR0917 - click passes every option positionally
    task: str | None,
    state: str | None,
    key_prefix: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    cursor: str | None,
    oldest_first: bool,
    store_url: str,
    as_json: bool,
) -> None:
    """List jobs, newest (or oldest) updated first, a page at a time. Read-only.

    A job that changes state while you page moves to the top: a listing is not a
    snapshot.

    \b
    Example:
      broker-jobs jobs list --state retrying --limit 20
      broker-jobs jobs list --state retrying --limit 20 --after CURSOR
      broker-jobs jobs list --state queued --oldest-first
    """
    try:
        after = decode_cursor(cursor) if cursor else None
    except CursorError as error:
        raise click.BadParameter(str(error), param_hint="--after") from None
    with _store(store_url) as store:
        page = store.page(
            status=Status(state.lower()) if state else None,
            task=task,
            since=since,
            until=until,
            key=key_prefix,
            after=after,
            oldest_first=oldest_first,
            limit=limit,
        )
        narrowed = any(value is not None for value in (state, since, until, key_prefix))
        unknown = (
            _unknown_task(store, task, narrowed=narrowed)
            if task is not None and not page.records and not cursor
            else None
        )
    token = encode_cursor(page.after) if page.after else None
    if as_json:
        echo_json({"jobs": [record_document(r) for r in page.records], "next": token})
        return
    if not page.records:
        click.echo("no jobs match" + (" on this page" if cursor else "") + (unknown or ""))
        return
    grid = table("key", "task", "state", "attempt", "updated", "worker", "due", "last error")
    for record in page.records:
        grid.add_row(
            record.idempotency_key,
            record.task,
            record.state_label,
            str(record.attempts),
            when(record.updated_at),
            record.worker or "-",
            when(record.due_at),
            first_line(record.last_error),
        )
    console().print(grid)
    if token:
        click.echo(f"more: add --after {token} (with the same options) for the next page")


@jobs_group.command("show")
@click.argument("ref", metavar="ID_OR_KEY")
@store_option
@json_option
def show_command(ref: str, store_url: str, as_json: bool) -> None:
    """Show one job (by idempotency key or job id), its payload when the ledger keeps
    it (published with the ledger, or after a failure) and each of its executions.
    Read-only.

    \b
    Example:
      broker-jobs jobs show invoice-42-thumb --json
    """
    with _store(store_url) as store:
        record = store.lookup(ref)
        if record is None:
            fail(f"no job with key or id {ref!r} in the ledger; {_UNKNOWN_HINT}")
        executions = store.executions(record.idempotency_key)
        kept = store.kept_payload(record.idempotency_key)
        output = store.output_of(record)
    if as_json:
        echo_json(
            {
                "job": record_document(record),
                "payload": payload_document(kept),
                "result": result_document(output),
                "follow_ups": follow_ups_document(output),
                "executions": [execution_document(e) for e in executions],
            }
        )
        return
    for label, value in _fields(record):
        click.echo(f"{label + ':':<12} {printable(value)}")
    click.echo(f"{'payload:':<12} {_payload_text(kept)}")
    if record.status is Status.SUCCEEDED:
        click.echo(f"{'result:':<12} {_result_text(output)}")
    if output is not None and output.follow_ups:
        click.echo(f"{'follow-ups:':<12} {_follow_ups_text(output)}")
    if not executions:
        click.echo("executions: none (no worker has claimed it)")
        return
    grid = table(
        "attempt",
        "worker",
        "started",
        "finished",
        "duration",
        "outcome",
        "error",
        right=("attempt",),
    )
    for execution in executions:
        grid.add_row(
            str(execution.attempt),
            execution.worker,
            when(execution.started_at),
            when(execution.finished_at),
            span(execution.duration),
            execution.outcome.value if execution.outcome else "running",
            first_line(execution.error),
        )
    console().print(grid)


@jobs_group.command("cancel")
@click.argument("ref", metavar="ID_OR_KEY")
@store_option
@json_option
def cancel_command(ref: str, store_url: str, as_json: bool) -> None:
    """Cancel a job that has not started (queued, scheduled, retrying): it never runs.

    Its message stays where it is (the task queue, the delay ladder); a worker that
    receives it acks it without running it. A running job is not interrupted.
    Exit 0 when the job will not run, 3 when it started already, 1 when unknown.

    \b
    Example:
      broker-jobs jobs cancel invoice-42-thumb
    """
    with _store(store_url) as store:
        result = store.cancel(ref)
    if as_json:
        echo_json({"outcome": result.outcome.value, "job": _maybe(result.record)})
    elif result.record is not None:
        click.echo(_cancel_line(result.record, result.outcome))
    if result.outcome is CancelOutcome.UNKNOWN:
        fail(f"no job with key or id {ref!r} in the ledger; {_UNKNOWN_HINT}")
    if result.outcome in (CancelOutcome.RUNNING, CancelOutcome.FINISHED):
        sys.exit(EXIT_STARTED)


# -- documents and lines ------------------------------------------------------------


def _maybe(record: JobRecord | None) -> dict[str, Any] | None:
    return None if record is None else record_document(record)


def _fields(record: JobRecord) -> list[tuple[str, str]]:
    return [
        ("key", record.idempotency_key),
        ("job id", record.job_id),
        ("task", record.task),
        ("state", record.state_label),
        ("attempts", str(record.attempts)),
        ("created", when(record.created_at)),
        ("updated", when(record.updated_at)),
        ("worker", record.worker or "-"),
        ("lease until", when(record.lease_until)),
        ("due", when(record.due_at)),
        ("last error", record.last_error or "-"),
    ]


def _payload_text(kept: KeptPayload | None) -> str:
    """The payload for people: indented JSON (plain text: click does not read markup)."""
    if kept is None:
        return PAYLOAD_NOT_KEPT
    if kept.payload is None:
        return too_large_text(kept)
    return _indented_json(kept.payload)


def _result_text(output: KeptOutput | None) -> str:
    """The handler's result for people, as :func:`_payload_text` shows a payload."""
    if output is None or output.result_size is None:
        return "none kept (the handler returned None, or its task keeps no results)"
    if output.result_too_large:
        return size_too_large_text(output.result_size)
    return _indented_json(output.result)


def _follow_ups_text(output: KeptOutput) -> str:
    """The follow-ups recorded with the success, one per line, and whether sent."""
    sent = (
        f"confirmed {when(output.sent_at)}"
        if output.sent_at is not None
        else "not confirmed yet: the job's next delivery publishes them"
    )
    lines = [f"{len(output.follow_ups)}, {sent}"]
    lines += [f"{job.task} key {job.idempotency_key} (id {job.id})" for job in output.follow_ups]
    return ("\n" + " " * 13).join(lines)


def _indented_json(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return text.replace("\n", "\n" + " " * 13)  # under the value column


def _cancel_line(record: JobRecord, outcome: CancelOutcome) -> str:
    """What cancel did to the job of ``record`` (as found, or as cancelled)."""
    job = f"job {record.idempotency_key!r} ({record.task})"
    if outcome is CancelOutcome.CANCELLED:
        return (
            f"cancelled: {job} will not run; a worker that receives it acks it without running it"
        )
    if outcome is CancelOutcome.ALREADY_CANCELLED:
        return (
            f"already cancelled: {job} was cancelled at {when(record.updated_at)}; nothing changed"
        )
    if outcome is CancelOutcome.RUNNING:
        holder = record.worker or "a worker"
        return (
            f"running: {job} attempt {record.attempts} is claimed by {holder} (running, or"
            " in its prefetch waiting for a handler thread); nothing changed (cancel stops"
            " only jobs no worker has claimed yet)"
        )
    return f"finished: {job} is {record.status.value} already; nothing changed"


def _unknown_task(store: Store, task: str, *, narrowed: bool) -> str | None:
    """What to say of a ``--task`` the ledger has no record of at all (a typo, most
    likely), naming the tasks it has; None when it has some of that task. The page
    just read answers that already unless other filters ``narrowed`` it."""
    if narrowed and store.page(task=task, limit=1).records:
        return None
    known = sorted(store.task_summaries())
    hint = closest(task, known)
    suggestion = f" (did you mean {hint!r}?)" if hint else ""
    listing = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "") or "none yet"
    return f": this ledger has no job of task {task!r}{suggestion}; its tasks: {listing}"


# -- the cursor and the store --------------------------------------------------------


@contextmanager
def _store(url: str) -> Iterator[Store]:
    """The ledger; an SQLite file must exist (a new one would answer "no jobs"). Every
    store error, on opening or inside, becomes one ``error:`` line and exit 1."""
    try:
        with open_store(url, must_exist=True) as store:
            yield store
    except BrokerJobsError as error:
        fail(str(error))


jobs_group.add_command(purge_command)
jobs_group.add_command(reroute_command)
