"""``broker-jobs dlq``: list, show, replay and purge dead letters.

    broker-jobs dlq list    --app MODULE:APP [filters] [--limit N|all] [--offset M] [--json]
    broker-jobs dlq show    --app MODULE:APP JOB_ID_OR_KEY [--json]
    broker-jobs dlq replay  --app MODULE:APP [JOB_ID_OR_KEY] [filters] [--limit N] [--json]
    broker-jobs dlq purge   --app MODULE:APP [JOB_ID_OR_KEY] [filters] [--store URL] [--yes]
    broker-jobs dlq reindex --app MODULE:APP --store URL [--json]

list and show read the ledger's index of dead letters (never the queue, unless
--from-queue); replay, purge and reindex act on the queues and keep the index in step.

The work is done by :mod:`broker_jobs.ops.dead_letters`; this module parses options
and prints. Errors are one line, ``error: ...`` on stderr (passwords masked), exit 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from broker_jobs.cli.options import store_option, url_option
from broker_jobs.cli.output import (
    PrintableTable,
    ask_first,
    console,
    echo_json,
    fail,
    json_option,
)
from broker_jobs.cli.tasks import chosen_tasks, task_options
from broker_jobs.clock import utc_now
from broker_jobs.errors import BrokerJobsError
from broker_jobs.ops.dead_letter_ledger import IndexedDeadLetters, unindexed_note
from broker_jobs.ops.dead_letters import (
    BROKER_DELIVERY_LIMIT,
    CONNECT_TIMEOUT,
    DeadLetter,
    DeadLetterFilter,
    DeadLetterQueues,
    LedgerAction,
    ReplayProgress,
    ReplaySummary,
)
from broker_jobs.printable import printable, printable_lines
from broker_jobs.store.base import Store, mask_dsn
from broker_jobs.store.urls import open_store
from broker_jobs.urls import BrokerURLs
from topology.names import (
    DEAD_REASONS,
    HEADER_DEAD_TRACEBACK,
    InvalidNameError,
    Names,
)

T = TypeVar("T")
#: A command's function, as click calls it (every option a keyword).
Command = Callable[..., None]
#: How --task's help ends.
_PURPOSE = "whose dead letters to take"
#: Characters of an error shown in a table cell (``show`` prints it whole).
ERROR_CELL = 60
_AGO = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@click.group("dlq")
def dlq_group() -> None:
    """List, show, replay and purge dead letters (<namespace>.dead.<task> queues).

    \b
    Examples:
      broker-jobs dlq list --app myproject.tasks:app --reason exhausted
      broker-jobs dlq show --app myproject.tasks:app 0192f7c4-...
      broker-jobs dlq replay --app myproject.tasks:app --task mail.send --store "$STORE"
      broker-jobs dlq purge --namespace jobs --task mail.send --until 7d --yes
    """


# -- options --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Queues:
    """The dead-letter queues a command takes: those of ``tasks`` in the namespace of
    ``names``, on the broker at ``url``."""

    url: BrokerURLs
    names: Names
    tasks: tuple[str, ...]

    def open(
        self,
        command: str,
        *,
        ledger: Store | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> DeadLetterQueues:
        """Their :class:`DeadLetterQueues`, connecting as ``broker-jobs dlq <command>``,
        keeping ``ledger``'s index of dead letters in step."""
        return DeadLetterQueues(
            self.url,
            self.names,
            self.tasks,
            connection_name=f"broker-jobs dlq {command}",
            ledger=ledger,
            connect_timeout=connect_timeout,
        )

    @property
    def listed(self) -> str:
        return ", ".join(self.names.dead_letter_queue(task) for task in self.tasks)


def _queue_options(function: Command) -> Command:
    """Which dead-letter queues: --url, and --app (all its tasks, or --task) or
    --namespace --task. The command function gets them as ``queues`` (:class:`_Queues`)."""

    @functools.wraps(function)
    def with_queues(
        *,
        url: BrokerURLs,
        app_option: str | None,
        namespace: str | None,
        tasks: tuple[str, ...],
        **options: Any,
    ) -> None:
        with _errors():
            chosen = chosen_tasks(app_option, namespace, tasks, _PURPOSE)
        function(queues=_Queues(url, chosen.names, tuple(chosen.tasks)), **options)

    return url_option(task_options(_PURPOSE)(with_queues))


def _filter_options(function: Command) -> Command:
    """--reason, --error, --since and --until. The command function gets them as
    ``where`` (a :class:`DeadLetterFilter`)."""

    @functools.wraps(function)
    def with_filter(
        *,
        reasons: tuple[str, ...],
        error_text: str | None,
        since: str | None,
        until: str | None,
        **options: Any,
    ) -> None:
        where = DeadLetterFilter(
            reasons=frozenset(reasons),
            error=error_text,
            since=_moment(since, "--since"),
            until=_moment(until, "--until"),
        )
        function(where=where, **options)

    decorated: Command = with_filter
    decorated = click.option(
        "--until",
        metavar="TIME",
        help="Dead before TIME: ISO 8601 with a zone, or an age such as 30m, 2h, 7d.",
    )(decorated)
    decorated = click.option(
        "--since",
        metavar="TIME",
        help="Dead at or after TIME: ISO 8601 with a zone, or an age such as 30m, 2h, 7d.",
    )(decorated)
    decorated = click.option(
        "--error",
        "error_text",
        metavar="TEXT",
        help="Only dead letters whose error contains TEXT (any case).",
    )(decorated)
    return click.option(
        "--reason",
        "reasons",
        multiple=True,
        type=click.Choice([*DEAD_REASONS, BROKER_DELIVERY_LIMIT]),
        help="Only dead letters with this reason (repeatable; docs/wire-format.md).",
    )(decorated)


#: replay's and purge's --limit: every matching dead letter without one.
_take_limit_option = click.option(
    "--limit",
    type=click.IntRange(min=1),
    help="Take at most this many dead letters: the first as `dlq list` shows them with"
    " the same filters (the ledger's index, oldest first; queue order without it).",
)

#: Dead letters ``dlq list`` shows without --limit, as ``jobs list`` shows jobs: a
#: listing of every one read 20,775 in 16.9 s and 295 MB.
DEFAULT_PAGE = 50


class _PageSize(click.ParamType):  # type: ignore[type-arg]
    """A page's size: a whole number from 1, or ``all`` (None: no limit)."""

    name = "N|all"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "all":
            return None
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            self.fail(f"{value!r} is neither a whole number from 1 nor 'all'", param, ctx)
        return number


_page_limit_option = click.option(
    "--limit",
    type=_PageSize(),
    default=DEFAULT_PAGE,
    show_default=True,
    help="Dead letters per page (--offset for the next), or 'all' (--json too).",
)

#: purge keeps the ledger's index in step when it is given one.
_optional_store_option = click.option(
    "--store",
    "store_url",
    envvar="BROKER_JOBS_STORE",
    help="The workers' store, whose index of dead letters to keep in step"
    " ($BROKER_JOBS_STORE). Never created: an SQLite file must exist.",
)

_from_queue_option = click.option(
    "--from-queue",
    is_flag=True,
    help="Read the queues instead of the ledger's index (for workers without a shared"
    " store): moves every message of them to the back, in order; needs write permission.",
)

_offset_option = click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    help="Skip this many matching dead letters first (pages of --limit).",
)


# -- commands -------------------------------------------------------------------------


@dlq_group.command("list")
@_queue_options
@_filter_options
@_page_limit_option
@_offset_option
@store_option
@_from_queue_option
@json_option
def list_command(
    *,
    queues: _Queues,
    where: DeadLetterFilter,
    limit: int | None,
    offset: int,
    store_url: str,
    from_queue: bool,
    as_json: bool,
) -> None:
    """List dead letters, oldest first, from the ledger's index (read-only), a page
    of --limit (50 unless given) at a time: the last line says how many more there
    are and the --offset of the next page (on stderr with --json, whose output stays
    one array).

    \b
    Examples:
      broker-jobs dlq list --app myproject.tasks:app --reason exhausted
      broker-jobs dlq list --app myproject.tasks:app --offset 50
      broker-jobs dlq list --app myproject.tasks:app --limit all --json
    """
    with _errors(), open_store(store_url, must_exist=True) as store:
        if from_queue:
            with queues.open("list") as dlq:
                total = sum(dlq.depths().values())
                # One more than the page: whether there is a next page.
                letters = dlq.list(where, limit=None if limit is None else offset + limit + 1)
            matching = None if limit is not None and len(letters) > offset + limit else len(letters)
            letters = letters[offset:][:limit]
        else:
            index = IndexedDeadLetters(store, queues.tasks)
            total = sum(index.counts().values())
            matching = total if where.is_empty else sum(index.counts(where).values())
            page = limit if limit is not None else max(matching - offset, 1)
            letters = index.letters(where, limit=page, offset=offset)
            _say_what_the_index_misses(queues, index)
        statuses = _ledger_statuses(store, letters)
    following = _next_page(offset, len(letters), matching, limit)
    if as_json:
        echo_json([_with_ledger(letter, statuses) for letter in letters])
        if following:
            click.echo(following, err=True)
        return
    if letters:
        console().print(_table(letters, statuses, several_tasks=len(queues.tasks) > 1))
    shown = f"{len(letters)} dead letter(s) shown"
    if offset:
        shown += f" (from number {offset + 1})"
    filtered = "" if where.is_empty or matching is None else f", {matching} matching"
    source = "in" if from_queue else "indexed for"
    click.echo(f"{shown} of {total} {source} {queues.listed}{filtered}")
    if following:
        click.echo(following)


def _next_page(offset: int, shown: int, matching: int | None, limit: int | None) -> str:
    """The line telling how to read the next page ("" when this one is the last);
    ``matching`` None: more are known to match, not how many (a queue's read)."""
    if limit is None:
        return ""
    if matching is None:
        return f"more: add --offset {offset + shown} for the next page (or --limit all)"
    left = matching - offset - shown
    if left <= 0:
        return ""
    return (
        f"{left} more: add --offset {offset + shown} for the next page (same options),"
        " or --limit all for every one"
    )


@dlq_group.command("show")
@_queue_options
@store_option
@_from_queue_option
@json_option
@click.argument("ref", metavar="JOB_ID_OR_KEY")
def show_command(
    queues: _Queues, store_url: str, from_queue: bool, as_json: bool, ref: str
) -> None:
    """Show one dead letter in full: headers, error, traceback, payload."""
    with _errors(), open_store(store_url, must_exist=True) as store:
        if from_queue:
            with queues.open("show") as dlq:
                found = dlq.find(ref)
        else:
            entries = IndexedDeadLetters(store, queues.tasks).find(ref)
            found = [entry.letter for entry in entries]
        if not found:
            raise BrokerJobsError(
                f"no dead letter has job id or idempotency key {ref!r} in"
                f" {queues.listed}: check the id (`broker-jobs dlq list`) and"
                " the --app, --namespace or --task"
                + (
                    ""
                    if from_queue
                    else "; one RabbitMQ dead-lettered itself is indexed by"
                    " `broker-jobs dlq reindex`"
                )
            )
        statuses = _ledger_statuses(store, found[:1])
    letter = found[0]
    if as_json:
        echo_json(_with_ledger(letter, statuses))
    else:
        if not from_queue and not entries[0].body_kept:
            click.echo(
                f"note: its body ({entries[0].body_size} bytes) is too large for the"
                " ledger; `--from-queue` reads it from the queue",
                err=True,
            )
        _echo_letter(letter, statuses)
    if len(found) > 1:
        click.echo(
            f"note: {len(found)} dead letters have this id or key; this is the first in"
            " its queue (`broker-jobs dlq list --json` shows all)",
            err=True,
        )


@dlq_group.command("reindex")
@_queue_options
@store_option
@json_option
def reindex_command(queues: _Queues, store_url: str, as_json: bool) -> None:
    """Index in the ledger every dead letter of the queues, and drop what is gone.

    For dead letters that reached a queue without a worker of this version (RabbitMQ's
    own delivery limit, an older broker-jobs, another tool): one pass over each queue,
    every message moved to its back in order (needs write permission there).
    """
    with (
        _errors(),
        open_store(store_url, must_exist=True) as store,
        queues.open("reindex", ledger=store) as dlq,
    ):
        done = _with_progress("reindexing", dlq.reindex, show=not as_json)
    if as_json:
        echo_json([{"task": d.task, "indexed": d.indexed, "dropped": d.dropped} for d in done])
        return
    for item in done:
        click.echo(
            f"{queues.names.dead_letter_queue(item.task)}: {item.indexed} dead letter(s)"
            f" indexed, {item.dropped} stale entr{'y' if item.dropped == 1 else 'ies'} dropped"
        )


#: replay's and purge's optional argument, as ``dlq show`` takes it: one dead letter.
_ref_argument = click.argument("ref", metavar="[JOB_ID_OR_KEY]", required=False)


@dlq_group.command("replay")
@_queue_options
@_filter_options
@_take_limit_option
@store_option
@json_option
@_ref_argument
def replay_command(  # noqa: PLR0917 - click passes every option positionally
    queues: _Queues,
    where: DeadLetterFilter,
    limit: int | None,
    store_url: str,
    as_json: bool,
    ref: str | None,
) -> None:
    """Publish dead jobs again, each once: reset its ledger record, publish, ack.

    JOB_ID_OR_KEY: only the dead letter of this job id or idempotency key (as
    `dlq show` takes it); the filters too, if given.

    --store must be the store the workers use: the reset lets the job run again
    (docs/operations.md explains why an interrupted replay is safe to run again).

    \b
    Examples:
      broker-jobs dlq replay --app myproject.tasks:app --reason exhausted
      broker-jobs dlq replay --app myproject.tasks:app invoice-42-thumb
    """
    where = dataclasses.replace(where, ref=ref)
    with (
        _errors(),
        open_store(store_url, must_exist=True) as store,
        queues.open("replay", ledger=store) as dlq,
    ):
        _say_which_are_taken(dlq, store, limit)
        summary = _replay_with_progress(dlq, store, where, limit, show=not as_json)
        if ref is not None and not summary.replayed and not summary.skipped:
            raise BrokerJobsError(_not_found(ref, queues))
    if as_json:
        echo_json(summary.to_json())
    else:
        _echo_replay(summary, queues)
    unknown = summary.count(LedgerAction.UNKNOWN)
    if unknown:
        click.echo(
            f"warning: {unknown} replayed job(s) have no record in the ledger at"
            f" {mask_dsn(store_url)}: if the workers use another store, they skip these as"
            " duplicates; replay with the workers' --store (or BROKER_JOBS_STORE)",
            err=True,
        )


@dlq_group.command("purge")
@_queue_options
@_filter_options
@_take_limit_option
@_optional_store_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@_ref_argument
def purge_command(  # noqa: PLR0917 - click passes every option positionally
    queues: _Queues,
    where: DeadLetterFilter,
    limit: int | None,
    store_url: str | None,
    yes: bool,
    as_json: bool,
    ref: str | None,
) -> None:
    """Delete dead letters for good: those matching the filters, or all of them.

    JOB_ID_OR_KEY: only the dead letter of this job id or idempotency key (as
    `dlq show` takes it). Asks first (saying how many the queues hold) unless
    --yes; without a terminal, --yes is required.
    """
    where = dataclasses.replace(where, ref=ref)
    with _errors(), contextlib.ExitStack() as stack:
        store = None
        if store_url is not None:
            store = stack.enter_context(open_store(store_url, must_exist=True))
        dlq = stack.enter_context(queues.open("purge", ledger=store))
        if not yes:
            held = sum(dlq.depths().values())
            every = where.is_empty and limit is None
            what = (
                f"every dead letter ({held})"
                if every
                else f"the dead letter of {ref!r}"
                if ref is not None
                else f"the matching dead letters (of {held})"
            )
            ask_first(f"delete {what} of {queues.listed} for good?", deletes=what)
        _say_which_are_taken(dlq, store, limit)
        deleted = dlq.purge(where, limit=limit)
        if ref is not None and not deleted:
            raise BrokerJobsError(_not_found(ref, queues))
    if as_json:
        echo_json({"purged": deleted, "queues": queues.listed.split(", ")})
        return
    click.echo(f"purged {deleted} dead letter(s) from {queues.listed}")


# -- helpers --------------------------------------------------------------------------


#: Seconds the listing waits for a node to answer its depth check: the list is the
#: ledger's, whole without it, and a host that drops packets must not hold it long.
DEPTHS_TIMEOUT = 3.0


def _say_what_the_index_misses(queues: _Queues, index: IndexedDeadLetters) -> None:
    """A warning on stderr when the queues hold dead letters the ledger's index does
    not (being dead-lettered right now, or dead-lettered by RabbitMQ itself, an older
    broker-jobs, another tool), or when the broker could not be asked: the listing
    is the index's, whole either way. Only the queues' depths are read (a passive
    declare): no message is touched. The index is counted after the depths, so a
    dead letter confirmed before the depth was read and indexed by now is not
    counted missing (counted before, each dead-lettered meanwhile was)."""
    try:
        with queues.open("list", connect_timeout=DEPTHS_TIMEOUT) as dlq:
            depths = dlq.depths()
    except BrokerJobsError as error:
        click.echo(
            f"warning: the queues' depths are unknown ({error}): the list is the"
            " ledger's index, which may miss dead letters",
            err=True,
        )
        return
    indexed = index.counts()
    missed = {task: depths[task] - indexed.get(task, 0) for task in queues.tasks}
    missed = {task: count for task, count in missed.items() if count > 0}
    if missed:
        click.echo(f"warning: {unindexed_note(queues.names.namespace, missed)}", err=True)


def _not_found(ref: str, queues: _Queues) -> str:
    return (
        f"no dead letter has job id or idempotency key {ref!r} in {queues.listed}"
        " (or none that the filters take): check the id (`broker-jobs dlq list`) and"
        " the --app, --namespace or --task"
    )


def _say_which_are_taken(dlq: DeadLetterQueues, store: Store | None, limit: int | None) -> None:
    """A note on stderr when --limit takes the first in queue order, not the first
    ``dlq list`` shows: the index is not whole (or there is none)."""
    if limit is not None and not dlq.indexed_whole(store):
        click.echo(
            f"note: --limit {limit} takes the first matching dead letters in queue order,"
            " which may not be those `broker-jobs dlq list` shows: "
            + (
                "give the workers' --store to take the listed ones"
                if store is None
                else "the ledger's index does not hold every dead letter of the queues"
                " (dead letters being made right now, or ones to index with"
                " `broker-jobs dlq reindex`)"
            ),
            err=True,
        )


def _moment(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 time with a zone, or an age (``30m``: thirty minutes ago)."""
    if text is None:
        return None
    if found := _AGO.match(text.strip()):
        return utc_now() - timedelta(**{_UNITS[found[2]]: int(found[1])})
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither an ISO 8601 time (2026-12-24T18:00:00Z) nor an age (30m, 2h, 7d)",
            param_hint=option,
        ) from None
    if moment.tzinfo is None:
        raise click.BadParameter(
            f"{text!r} has no time zone: add Z (UTC) or an offset such as +01:00",
            param_hint=option,
        )
    return moment


def _ledger_statuses(store: Store, letters: Sequence[DeadLetter]) -> dict[str, str]:
    """Each letter's ledger status by key."""
    statuses = {}
    for letter in letters:
        key = letter.idempotency_key
        if key is not None and key not in statuses:
            record = store.get(key)
            statuses[key] = record.status.value if record else "unknown"
    return statuses


def _with_ledger(letter: DeadLetter, statuses: dict[str, str]) -> dict[str, Any]:
    document = letter.to_json()
    if statuses:
        document["ledger"] = statuses.get(letter.idempotency_key or "")
    return document


def _table(
    letters: Sequence[DeadLetter], statuses: dict[str, str], *, several_tasks: bool
) -> Table:
    # The other commands' style: a rule under the header, no other lines.
    table = PrintableTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    columns = ["job id", "key", "reason", "attempts", "dead at", "error"]
    if several_tasks:
        columns.insert(0, "task")
    if statuses:
        columns.append("ledger")
    # Ids and keys are never cut nor folded (they are copied into the next command):
    # each is as wide as its longest value, and the error column gives way.
    widest = {
        "job id": max((len(letter.job_id or "-") for letter in letters), default=1),
        "key": max((len(_key_cell(letter)) for letter in letters), default=1),
    }
    for column in columns:
        if column in widest:
            table.add_column(column, no_wrap=True, min_width=widest[column])
        else:
            table.add_column(column, overflow="ellipsis")
    for letter in letters:
        key = letter.idempotency_key
        cells = [
            letter.job_id or "-",
            _key_cell(letter),
            letter.reason or "-",
            "-" if letter.attempts is None else str(letter.attempts),
            _when(letter.dead_at),
            _cut(letter.error or "-", ERROR_CELL),
        ]
        if several_tasks:
            cells.insert(0, letter.task)
        if statuses:
            cells.append(statuses.get(key or "", "-"))
        table.add_row(*cells)
    return table


def _key_cell(letter: DeadLetter) -> str:
    """The key column: ``=`` where the key is the job id (most keys are)."""
    key = letter.idempotency_key
    return "=" if key == letter.job_id else key or "-"


def _echo(text: str) -> None:
    """One line from a message's values, on one line whatever they hold."""
    click.echo(printable(text))


def _echo_block(text: str) -> None:
    """Lines from a message (a payload, a body, a traceback), each kept a line."""
    click.echo(printable_lines(text))


def _echo_letter(letter: DeadLetter, statuses: dict[str, str]) -> None:
    """The letter for people: every value from the message with its control
    characters escaped (:mod:`broker_jobs.printable`)."""
    document = letter.to_json()
    fields = ["task", "job_id", "idempotency_key", "reason", "attempts", "dead_at", "worker"]
    for name in fields:
        value = document[name]
        _echo(f"{name.replace('_', ' ')}: {'-' if value is None else value}")
    if statuses:
        _echo(f"ledger: {statuses.get(letter.idempotency_key or '', '-')}")
    _echo(f"error: {letter.error or '-'}")
    if letter.payload is not None:
        _echo("payload:")
        _echo_block(_indent(json.dumps(letter.payload, indent=2)))
    else:
        _echo("body (not JSON):")
        _echo_block(_indent(document["body"]))
    _echo("headers:")
    for name, value in document["headers"].items():
        if name != HEADER_DEAD_TRACEBACK:  # printed whole below
            _echo(f"  {name}: {json.dumps(value)}")
    _echo("properties:")
    for name, value in document["properties"].items():
        if value is not None:
            _echo(f"  {name}: {value}")
    if letter.traceback:
        _echo("traceback:")
        _echo_block(_indent(letter.traceback.rstrip("\n")))


def _replay_with_progress(
    dlq: DeadLetterQueues,
    store: Store,
    where: DeadLetterFilter,
    limit: int | None,
    *,
    show: bool,
) -> ReplaySummary:
    bar_console = Console(stderr=True)
    with Progress(
        TextColumn("replaying"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[replayed]} replayed, {task.fields[skipped]} skipped"),
        console=bar_console,
        disable=not (show and bar_console.is_terminal),
    ) as progress:
        bar = progress.add_task("replay", total=None, replayed=0, skipped=0)

        def advance(step: ReplayProgress) -> None:
            progress.update(
                bar,
                completed=step.scanned,
                total=step.total,
                replayed=step.replayed,
                skipped=step.skipped,
            )

        return dlq.replay(store, where, limit=limit, on_progress=advance)


def _with_progress(label: str, run: Callable[[Callable[[int, int], None]], T], *, show: bool) -> T:
    """``run(advance)`` with a progress bar on a terminal's stderr (``advance(done,
    total)``)."""
    bar_console = Console(stderr=True)
    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        console=bar_console,
        disable=not (show and bar_console.is_terminal),
    ) as progress:
        bar = progress.add_task(label, total=None)
        return run(lambda done, total: progress.update(bar, completed=done, total=total))


def _echo_replay(summary: ReplaySummary, queues: _Queues) -> None:
    for skipped in summary.skipped:
        letter = skipped.letter
        click.echo(f"skipped {letter.job_id or '-'} ({letter.task}): {skipped.why}")
    counted = {action: summary.count(action) for action in LedgerAction}
    counts = ", ".join(f"{count} {action.value}" for action, count in counted.items() if count)
    click.echo(
        f"replayed {len(summary.replayed)} dead letter(s) of {queues.listed}"
        f" (ledger: {counts or 'nothing to do'}); {len(summary.skipped)} skipped (left in"
        f" the queue), {summary.scanned} looked at"
    )


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


@contextmanager
def _errors() -> Iterator[None]:
    """Every expected failure as one masked ``error:`` line, exit 1."""
    try:
        yield
    except (BrokerJobsError, InvalidNameError) as error:
        fail(str(error), getattr(error, "exit_code", 1))
