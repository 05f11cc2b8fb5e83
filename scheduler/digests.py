"""What a beat's schedules are, in a form two beats can compare.

Every beat of a namespace must run the same schedules: only the leader emits, so a
schedule missing from the leader's file does not fire, however many other beats
have it. The leader records a digest of each of its schedules with its leader
record; every other beat compares its own against it and says which differ
(:class:`Mismatch`), as ``beat status`` does for the file it is given.

A digest covers everything that decides what a schedule emits and when (task,
payload, timing, catch-up, lookback, jitter, grace), written canonically, so beats
on different Python versions agree on the same definition.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.schedules import Schedule

#: Hex digits kept of each SHA-256: enough to tell definitions apart, short to show.
DIGEST_LENGTH = 12


def schedule_digest(schedule: Schedule) -> str:
    """The digest of one schedule's definition (its name excluded: it is the key)."""
    definition = {
        "task": schedule.task,
        "payload": schedule.payload,
        "timing": _timing_fields(schedule.timing),
        "catch_up": schedule.catch_up.value,
        "lookback": schedule.lookback.total_seconds(),
        "jitter": schedule.jitter.total_seconds(),
        "grace": schedule.grace.total_seconds(),
    }
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_LENGTH]


def schedule_digests(schedules: Iterable[Schedule]) -> dict[str, str]:
    """Each schedule's digest, by name."""
    return {schedule.name: schedule_digest(schedule) for schedule in schedules}


def _timing_fields(timing: object) -> dict[str, Any]:
    """A timing's kind and its defining fields, as JSON values."""
    fields: dict[str, Any] = {"kind": type(timing).__name__}
    if dataclasses.is_dataclass(timing):
        for field in dataclasses.fields(timing):
            if field.init:
                fields[field.name] = _canonical(getattr(timing, field.name))
    else:  # a timing of the user's own: its description is all there is
        fields["text"] = str(timing)
    return fields


def _canonical(value: object) -> object:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


@dataclass(frozen=True)
class Mismatch:
    """How this beat's schedules differ from the leader's, by schedule name."""

    only_here: tuple[str, ...]
    only_on_leader: tuple[str, ...]
    defined_differently: tuple[str, ...]

    @classmethod
    def between(cls, here: Mapping[str, str], leader: Mapping[str, str]) -> Mismatch:
        return cls(
            only_here=tuple(sorted(here.keys() - leader.keys())),
            only_on_leader=tuple(sorted(leader.keys() - here.keys())),
            defined_differently=tuple(
                sorted(name for name in here.keys() & leader.keys() if here[name] != leader[name])
            ),
        )

    @property
    def names(self) -> tuple[str, ...]:
        """Every schedule that differs, sorted."""
        return tuple(sorted((*self.only_here, *self.only_on_leader, *self.defined_differently)))

    def __bool__(self) -> bool:
        return bool(self.names)

    def describe(self) -> str:
        """``only here: a, b; only on the leader: c; defined differently: d``."""
        parts = [
            f"{label}: {', '.join(names)}"
            for label, names in (
                ("only here", self.only_here),
                ("only on the leader", self.only_on_leader),
                ("defined differently", self.defined_differently),
            )
            if names
        ]
        return "; ".join(parts) or "none"

    def as_document(self) -> dict[str, list[str]]:
        return {
            "only_here": list(self.only_here),
            "only_on_leader": list(self.only_on_leader),
            "defined_differently": list(self.defined_differently),
        }
