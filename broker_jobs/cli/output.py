"""Output and option helpers of the read-mostly operator commands (``status``, ``jobs``).

One place for what those commands print alike: ``error: ...`` lines with passwords
masked, ``--json`` documents, rich tables that stay whole in a pipe, times with a
zone, and short durations.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any, NoReturn

import click
from rich import box
from rich.console import Console
from rich.table import Table

from broker_jobs.errors import BrokerJobsError
from broker_jobs.printable import printable
from broker_jobs.store.base import mask_dsn
from broker_jobs.urls import mask_text

#: Width of a table written to a pipe or a file (a terminal's own width is used
#: otherwise): wide enough that a row stays on one line for grep.
PIPE_WIDTH = 240

json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document on stdout, for scripts (see docs/operations.md).",
)


class AwareDateTime(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """An ISO 8601 time with a zone (``Z`` or an offset); a time without one is a
    usage error, since the ledger's times are UTC and a guess would shift a filter."""

    name = "TIME"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            moment = value
        else:
            try:
                moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            except ValueError:
                self.fail(
                    f"{value!r} is not an ISO 8601 time: use e.g. 2026-12-24T18:00:00Z", param, ctx
                )
        if moment.tzinfo is None:
            self.fail(
                f"{value!r} has no time zone: add Z (UTC) or an offset such as +01:00", param, ctx
            )
        try:
            moment.astimezone(UTC)  # the stores compare times in UTC
        except OverflowError:
            self.fail(f"{value!r} is out of range (year 1 to 9999 in UTC)", param, ctx)
        return moment


AWARE_DATETIME = AwareDateTime()


def fail(message: str, code: int = 1) -> NoReturn:
    """``error: message`` on one line of stderr (URLs and DSNs masked; a driver's
    multi-line text joined), then exit ``code``."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    click.echo(f"error: {printable(mask_dsn(mask_text(line)))}", err=True)
    sys.exit(code)


def echo_json(document: Any) -> None:
    """One JSON document on stdout."""
    click.echo(json.dumps(document, indent=2))


def console() -> Console:
    """A console on the current stdout (click's, also under CliRunner); plain text
    (no markup, so ``[...]`` in a task name or an error prints as it is)."""
    plain: dict[str, Any] = {"markup": False, "highlight": False, "emoji": False}
    terminal = Console(**plain)
    if terminal.is_terminal:
        return terminal
    return Console(width=PIPE_WIDTH, **plain)


class PrintableTable(Table):
    """A rich table whose cells are printed with their control characters escaped:
    ids, keys and errors come from messages (:mod:`broker_jobs.printable`)."""

    def add_row(self, *renderables: Any, **options: Any) -> None:
        cells = [printable(cell) if isinstance(cell, str) else cell for cell in renderables]
        super().add_row(*cells, **options)


def table(*headers: str, right: tuple[str, ...] = ()) -> Table:
    """A table with a rule under the header and no other lines; the columns named in
    ``right`` (numbers) are right-aligned."""
    grid = PrintableTable(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header in headers:
        grid.add_column(header, justify="right" if header in right else "left", no_wrap=True)
    return grid


def ask_first(question: str, *, deletes: str) -> None:
    """Ask ``question`` (y/N) before deleting ``deletes`` for good; a refusal, or no
    terminal to ask on (then --yes is needed), raises :class:`BrokerJobsError`."""
    if not sys.stdin.isatty():
        raise BrokerJobsError(
            f"purge deletes {deletes} for good and asks first, but stdin is not a"
            " terminal: add --yes to purge without asking"
        )
    if not click.confirm(question, default=False):
        raise BrokerJobsError("nothing purged: not confirmed")
