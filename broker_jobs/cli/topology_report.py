"""How ``broker-jobs topology plan``, ``apply`` and ``verify`` show what they found:
a line per object (the delay ladder's levels summed up in one, unless ``--verbose``)
or one JSON document (``--json``, ``docs/operations.md``). The three commands show
one :class:`~topology.inspect.Inspection` each; a :class:`View` says which lines each
lists and the words it uses, so that their output cannot drift apart."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, TypeVar

import click

from broker_jobs.cli.output import fail
from broker_jobs.urls import BrokerURL
from topology.delay import DELAY_LEVELS
from topology.errors import Conflict
from topology.file import NamespaceSpec
from topology.inspect import BindingStatus, Inspection, ObjectState, Status

F = TypeVar("F", bound=Callable[..., Any])
#: Exit code of a conflict (and of any error).
EXIT_CONFLICT = 1
_SYMBOLS = {Status.IN_SYNC: "=", Status.MISSING: "+", Status.CONFLICT: "!", Status.UNCHECKED: "?"}
LEFT_AS_THEY_ARE = (
    "{count} object(s) conflict and were left as they are; everything else was declared"
)
#: An object's state in the JSON document of plan and verify.
_JSON_STATES = {
    Status.IN_SYNC: "in_sync",
    Status.MISSING: "create",
    Status.CONFLICT: "conflict",
    Status.UNCHECKED: "unchecked",
}
_JSON_BINDING_STATES = {
    BindingStatus.CREATE: "create",
    BindingStatus.REDECLARE: "redeclare",
    BindingStatus.BLOCKED: "blocked",
}


def report_options(function: F) -> F:
    """``--json`` and ``--verbose``: the command function gets ``as_json`` and ``verbose``."""
    function = click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print one JSON document on stdout, for scripts (see docs/operations.md);"
        " the exit code is the same.",
    )(function)
    return click.option(
        "--verbose",
        "-v",
        is_flag=True,
        help="List each of the delay ladder's exchanges and queues, not one summary line.",
    )(function)


@dataclass(frozen=True)
class View:
    """How one command shows the objects: which lines, and the words it uses."""

    command: str
    #: The states listed one line each (conflicts are always among them, or on stderr).
    listed: frozenset[Status]
    #: The words of the delay ladder's summary line, per state.
    summary: Mapping[Status, str]
    #: A line's label and a JSON state that differ from plan's (apply's "created").
    labels: Mapping[Status, str] = field(default_factory=dict)
    states: Mapping[Status, str] = field(default_factory=dict)


_SUMMARY = {
    Status.IN_SYNC: "in sync",
    Status.MISSING: "to create",
    Status.CONFLICT: "conflicting",
    Status.UNCHECKED: "not checked (no configure permission)",
}
PLAN = View("plan", frozenset(Status), _SUMMARY)
VERIFY = View(
    "verify", frozenset({Status.MISSING, Status.CONFLICT}), {**_SUMMARY, Status.MISSING: "missing"}
)
#: apply lists what it created; its conflicts go to stderr (or into the JSON).
APPLY = View(
    "apply",
    frozenset({Status.MISSING}),
    {**_SUMMARY, Status.MISSING: "created"},
    labels={Status.MISSING: "created"},
    states={Status.MISSING: "created"},
)


@dataclass(frozen=True)
class Report:
    """What plan, apply or verify found, shown as lines or as one JSON document."""

    view: View
    namespace: str
    node: BrokerURL
    inspection: Inspection
    ladder: frozenset[str]  # the delay ladder's exchange and queue names

    def echo_objects(self, *, verbose: bool) -> None:
        """One line per listed object; the ladder's in one summary unless ``verbose``.
        A conflict is always shown in full."""
        ladder: list[ObjectState] = []
        for state in self.inspection.objects:
            in_ladder = state.name in self.ladder
            if in_ladder:
                ladder.append(state)
            if state.status not in self.view.listed:
                continue
            if in_ladder and not verbose and state.status is not Status.CONFLICT:
                continue
            for line in self._lines(state):
                click.echo(line)
        if ladder:
            click.echo(self._ladder_line(ladder, verbose=verbose))

    def _lines(self, state: ObjectState) -> Iterator[str]:
        label = self.view.labels.get(state.status, state.status.value)
        head = f"  {_SYMBOLS[state.status]} {state.kind} {state.name} ({state.detail}): {label}"
        if state.conflict is None:
            yield head
            return
        yield f"{head}: {_differences(state.conflict)}"
        yield f"      to fix: {state.conflict.remedy}"

    def _ladder_line(self, ladder: list[ObjectState], *, verbose: bool) -> str:
        counts = {status: sum(s.status is status for s in ladder) for status in Status}
        if counts[Status.IN_SYNC] == len(ladder):
            return f"  delay ladder: {len(ladder)} objects in sync"
        parts = ", ".join(
            f"{count} {self.view.summary[status]}" for status, count in counts.items() if count
        )
        hidden = any(
            state.status in self.view.listed and state.status is not Status.CONFLICT
            for state in ladder
        )
        hint = " (run with --verbose to see them)" if hidden and not verbose else ""
        return f"  delay ladder: {parts}{hint}"

    def document(self) -> dict[str, Any]:
        """The JSON document (docs/operations.md, "--json")."""
        states = [self._object(state) for state in self.inspection.objects]
        counts = dict.fromkeys({**_JSON_STATES, **self.view.states}.values(), 0)
        for state in states:
            counts[state["state"]] += 1
        return {
            "command": self.view.command,
            "namespace": self.namespace,
            "node": self.node.masked,
            "in_sync": self.inspection.in_sync,
            "counts": counts,
            "objects": states,
            "bindings": [
                {
                    "source": state.binding.exchange,
                    "destination": state.binding.destination,
                    "destination_kind": "exchange" if state.binding.to_exchange else "queue",
                    "routing_key": state.binding.routing_key,
                    "state": _JSON_BINDING_STATES[state.status],
                }
                for state in self.inspection.bindings
            ],
        }

    def _object(self, state: ObjectState) -> dict[str, Any]:
        conflict = state.conflict
        return {
            "kind": state.kind,
            "name": state.name,
            "type": state.detail,
            "ladder": state.name in self.ladder,
            "state": self.view.states.get(state.status, _JSON_STATES[state.status]),
            "differences": [
                {"argument": d.argument, "wanted": d.wanted, "broker": d.existing}
                for d in (conflict.differences if conflict else ())
            ],
            "broker_message": (conflict.broker_message or None) if conflict else None,
            "remedy": conflict.remedy if conflict else None,
        }

    def echo_json(self) -> None:
        click.echo(json.dumps(self.document(), indent=2, default=str))


def ladder_names(spec: NamespaceSpec) -> frozenset[str]:
    """The delay ladder's levels (exchange and queue of each). delay.out and the
    unroutable pair are listed with the namespace's own objects: an operator looks
    at those."""
    names = spec.names
    return frozenset(
        name
        for level in range(DELAY_LEVELS)
        for name in (names.delay_exchange(level), names.delay_queue(level))
    )


def with_conflicts(inspection: Inspection, conflicts: tuple[Conflict, ...]) -> Inspection:
    """``inspection`` (before apply) with the conflicts declare met, as declare saw them."""
    found = {(conflict.kind, conflict.name): conflict for conflict in conflicts}
    return replace(
        inspection,
        objects=tuple(
            replace(state, status=Status.CONFLICT, conflict=found[state.kind, state.name])
            if (state.kind, state.name) in found
            else state
            for state in inspection.objects
        ),
    )


def bindings_line(inspection: Inspection) -> str:
    parts = [
        f"{len(found)} {status.value}"
        for status in BindingStatus
        if (found := inspection.bindings_having(status))
    ]
    return f"  bindings: {'; '.join(parts) or 'none'}"


def fail_conflicts(conflicts: tuple[Conflict, ...]) -> NoReturn:
    """Each conflict and its remedy on stderr, then exit :data:`EXIT_CONFLICT`."""
    for conflict in conflicts:
        click.echo(f"  ! {conflict.kind} {conflict.name}: {_differences(conflict)}", err=True)
        click.echo(f"      to fix: {conflict.remedy}", err=True)
    fail(LEFT_AS_THEY_ARE.format(count=len(conflicts)), EXIT_CONFLICT)


def _differences(conflict: Conflict) -> str:
    if conflict.differences:
        return "; ".join(difference.describe() for difference in conflict.differences)
    return f"broker said: {conflict.broker_message}"
