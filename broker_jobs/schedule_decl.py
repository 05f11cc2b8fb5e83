"""Raw schedule declarations an :class:`~broker_jobs.App` records for the beat.

``broker_jobs`` only stores what the user wrote: the ``scheduler`` package (which
depends on ``broker_jobs``, never the reverse) parses and validates everything when
the beat loads its schedules, so that all problems are reported together. Only the
mistakes that are certain at declaration time are refused here: not exactly one of
``cron`` / ``every`` / ``at``, and a name declared twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from broker_jobs.errors import ConfigurationError

#: A duration as the user may write it: seconds, or a timedelta.
Seconds = float | timedelta
#: A one-off instant: a datetime, or an ISO 8601 string.
At = datetime | str


@dataclass(frozen=True)
class ScheduleDeclaration:
    """One ``app.schedule(...)`` call, values as given (see ``scheduler.load_schedules``)."""

    name: str
    task: str
    cron: str | None = None
    every: Seconds | None = None
    at: At | None = None
    payload: Mapping[str, Any] | BaseModel | None = None
    #: IANA zone for ``cron`` (None means UTC) and for a naive ``at``.
    timezone: str | None = None
    catch_up: str = "all"
    lookback: Seconds = 3600.0
    jitter: Seconds = 0.0
    grace: Seconds = 2.0

    def __post_init__(self) -> None:
        given = [key for key in ("cron", "every", "at") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ConfigurationError(
                f"schedule {self.name!r}: give exactly one of cron=, every= or at="
                f" (got {', '.join(given) or 'none'})"
            )
        if isinstance(self.payload, Mapping):
            # A copy: later changes to the caller's dict must not change the schedule.
            object.__setattr__(self, "payload", dict(self.payload))


def add_declaration(
    registry: dict[str, ScheduleDeclaration], declaration: ScheduleDeclaration
) -> ScheduleDeclaration:
    """Record ``declaration`` in ``registry``; a name is declared once per app."""
    if declaration.name in registry:
        raise ConfigurationError(
            f"schedule {declaration.name!r} is declared twice in this app; give each"
            " schedule its own name (the name keys the beat's fences and job ids)"
        )
    registry[declaration.name] = declaration
    return declaration
