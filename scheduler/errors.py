"""Errors raised by the beat, under broker-jobs' own tree:

    broker_jobs.errors.ConfigurationError
    └── ScheduleError     one or more schedules are invalid; ``problems`` lists each

Loading collects every problem of every schedule before raising, so one run of the
beat (or of its check command) shows everything to fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker_jobs.errors import ConfigurationError


class ScheduleError(ConfigurationError):
    """Invalid schedules. ``problems`` holds one line per problem; with a ``subject``
    (a schedule's name) each line reads ``<subject>: <reason>``. ``reasons`` keeps the
    bare reasons, so a caller can label them again (e.g. with the file they came from).
    """

    def __init__(self, reasons: Sequence[str], subject: str = "") -> None:
        self.reasons = tuple(reasons)
        self.problems = tuple(f"{subject}: {reason}" if subject else reason for reason in reasons)
        if len(self.problems) == 1:
            message = f"invalid schedule: {self.problems[0]}"
        else:
            listing = "".join(f"\n  - {problem}" for problem in self.problems)
            message = f"{len(self.problems)} schedule problems:{listing}"
        super().__init__(message)
