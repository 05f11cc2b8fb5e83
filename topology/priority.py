"""Job priorities: three levels, each a queue of its own, and how a worker picks
between them (docs/priorities.md).

A task declared with priorities has three task queues: ``<ns>.task.<task>@high``,
``<ns>.task.<task>`` (normal: the same queue as a task without priorities) and
``<ns>.task.<task>@low``, bound with the routing keys ``<task>@high``, ``<task>`` and
``<task>@low``. ``@`` cannot appear in a task name, so no task's queue or key can
collide with another's level. Separate queues, rather than ``x-max-priority`` (classic
queues only) or the two levels of quorum queues on RabbitMQ 4, keep every guarantee of
quorum queues (replication, the delivery limit, at-least-once dead-lettering) on every
RabbitMQ version; the worker decides the order among the deliveries it holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

#: Between a task name and its level in queue names and routing keys.
LEVEL_SEPARATOR = "@"
#: Numeric priorities (RabbitMQ's convention: higher runs first) map onto the levels:
#: 0-2 low, 3-6 normal, 7-9 high.
NUMERIC_RANGE = range(10)
_LOW_BELOW = 3
_HIGH_FROM = 7


class InvalidPriorityError(ValueError):
    """A priority or priority policy that cannot be used; the message says why."""


class Priority(StrEnum):
    """A job's level. Declared in the order a strict policy runs them."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """0 for high, 1 for normal, 2 for low."""
        return _RANKS[self]

    @property
    def suffix(self) -> str:
        """What the level adds to a task's queue name and routing key (none for normal)."""
        return "" if self is Priority.NORMAL else LEVEL_SEPARATOR + self.value

    @classmethod
    def of(cls, value: Priority | str | int | None) -> Priority:
        """``high``/``normal``/``low``, a number 0-9 (7-9 high, 3-6 normal, 0-2 low), or
        None (normal)."""
        if value is None:
            return cls.NORMAL
        if isinstance(value, cls):
            return value
        if isinstance(value, bool):
            raise InvalidPriorityError(
                f"priority must be 'high', 'normal', 'low' or a number 0-9, got {value!r}"
            )
        if isinstance(value, int):
            if value not in NUMERIC_RANGE:
                raise InvalidPriorityError(
                    f"priority {value} is out of range: use 0-9 (7-9 high, 3-6 normal,"
                    " 0-2 low) or 'high', 'normal', 'low'"
                )
            if value < _LOW_BELOW:
                return cls.LOW
            return cls.HIGH if value >= _HIGH_FROM else cls.NORMAL
        if isinstance(value, str):
            text = value.strip().lower()
            if text.isdigit():
                return cls.of(int(text))
            try:
                return cls(text)
            except ValueError:
                pass
        raise InvalidPriorityError(
            f"unknown priority {value!r}: use 'high', 'normal', 'low' or a number 0-9"
        )


_RANKS = {level: rank for rank, level in enumerate(Priority)}


_WEIGHTS = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*:\s*(\d+)\s*$")


@dataclass(frozen=True)
class PriorityPolicy:
    """How a worker picks the next job among the levels it holds.

    ``strict``: high before normal before low, always (low waits while higher levels
    have work; see :data:`AGING_SHARE`). Otherwise ``weights`` (high, normal, low):
    under a backlog of every level, jobs start in that proportion (6:3:1 by default),
    and a level with a positive weight is never starved. A weight of 0 is refused:
    use strict for "only when nothing else waits".
    """

    strict: bool = False
    weights: tuple[int, int, int] = (6, 3, 1)

    def __post_init__(self) -> None:
        if len(self.weights) != len(Priority) or any(
            isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.weights
        ):
            raise InvalidPriorityError(
                f"priority weights must be three whole numbers >= 1 (high, normal, low),"
                f" got {self.weights!r}: for example '6:3:1', or 'strict'"
            )

    @classmethod
    def parse(cls, value: PriorityPolicy | str | tuple[int, int, int]) -> PriorityPolicy:
        """``"strict"``, ``"6:3:1"``, ``(6, 3, 1)`` or a policy."""
        if isinstance(value, PriorityPolicy):
            return value
        if isinstance(value, tuple):
            return cls(weights=value)
        if isinstance(value, str):
            if value.strip().lower() == "strict":
                return cls(strict=True)
            match = _WEIGHTS.match(value)
            if match:
                high, normal, low = (int(part) for part in match.groups())
                return cls(weights=(high, normal, low))
        raise InvalidPriorityError(
            f"unknown priority policy {value!r}: use 'strict' or weights such as '6:3:1'"
        )

    def describe(self) -> str:
        return "strict" if self.strict else ":".join(str(w) for w in self.weights)


#: Under a strict policy a job in hand waits at most this share of the broker's
#: consumer_timeout before it runs next whatever its level: RabbitMQ closes the channel
#: of a delivery unacked for longer (30 min by default), which would return every job
#: the worker holds.
AGING_SHARE = 0.5
