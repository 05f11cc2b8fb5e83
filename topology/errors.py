"""Errors of the topology layer.

    TopologyError
    ├── TopologyConflictError   an existing object has other arguments or another type
    └── TopologyMissingError    an object that should exist does not (declare nothing mode)

``broker_jobs`` translates these into its own error tree at its boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topology.names import ARG_ALTERNATE_EXCHANGE, ARG_QUEUE_TYPE


class TopologyError(Exception):
    """Base of the topology errors."""


@dataclass(frozen=True)
class Difference:
    """One argument on which the broker's object differs from the wanted one.

    ``None`` stands for "not set". ``existing`` is what the broker has.
    """

    argument: str
    wanted: Any
    existing: Any

    def describe(self) -> str:
        wanted, existing = show_value(self.wanted), show_value(self.existing)
        return f"{self.argument}: wanted {wanted}, broker has {existing}"


@dataclass(frozen=True)
class Conflict:
    """An exchange or queue that exists with other settings than wanted."""

    kind: str  # "queue" or "exchange"
    name: str
    differences: tuple[Difference, ...]
    broker_message: str

    @property
    def remedy(self) -> str:
        arguments = {difference.argument for difference in self.differences}
        if self.kind == "queue" and ARG_QUEUE_TYPE in arguments:
            return (
                f"RabbitMQ cannot change a queue's type in place: drain queue {self.name!r},"
                " delete it (rabbitmqctl delete_queue) and declare again, or move its"
                " messages to a new queue with a shovel first"
            )
        if self.kind == "queue":
            return (
                f"queue arguments cannot change once declared: either configure the task"
                f" to match the broker, or drain and delete queue {self.name!r} and declare"
                " again (a policy can change some settings without redeclaring)"
            )
        if ARG_ALTERNATE_EXCHANGE in arguments:
            return (
                "RabbitMQ cannot change an exchange's arguments in place: delete exchange"
                f" {self.name!r} (it holds no messages; rabbitmqctl has no command for it,"
                " see 'Unroutable delayed jobs' in docs/operations.md) and at once declare"
                " it again with `broker-jobs topology apply`, which also binds the task"
                " queues to it again. Jobs a quorum delay ladder releases in between are"
                " retried until it is back"
            )
        return (
            f"delete exchange {self.name!r} (an AMQP client or the management UI:"
            " rabbitmqctl has no command for it) and declare again, or configure a"
            " different namespace"
        )

    def describe(self) -> str:
        if self.differences:
            what = "; ".join(difference.describe() for difference in self.differences)
        else:
            what = f"broker said: {self.broker_message}"
        return f"{self.kind} {self.name!r} differs ({what}). To fix: {self.remedy}"


class TopologyConflictError(TopologyError):
    """Raised when declared objects conflict with what the broker already has."""

    def __init__(self, conflicts: tuple[Conflict, ...]) -> None:
        self.conflicts = conflicts
        super().__init__(
            "the broker's topology conflicts with the wanted one:\n"
            + "\n".join(f"- {conflict.describe()}" for conflict in conflicts)
        )


class TopologyMissingError(TopologyError):
    """Raised when an object that must already exist is missing."""


def show_value(value: Any) -> str:
    """An argument's value as a conflict message writes it (``not set`` for None)."""
    return "not set" if value is None else repr(value)
