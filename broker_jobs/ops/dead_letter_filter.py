"""Which dead letters an operation (list, replay, purge) takes: a
:class:`DeadLetterFilter` of reasons, an error's text, a time range and a job's id or
key. The command line's options and the dashboard's filter form both end up as one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from broker_jobs.errors import BrokerJobsError
from broker_jobs.ops.dead_letter_message import DeadLetter


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters an operation takes: each given criterion must hold."""

    reasons: frozenset[str] = frozenset()  #: any of these reasons
    error: str | None = None  #: a substring of the error (any case)
    since: datetime | None = None  #: dead at or after (aware)
    until: datetime | None = None  #: dead before (aware)
    ref: str | None = None  #: the job id or the idempotency key

    def __post_init__(self) -> None:
        for moment in (self.since, self.until):
            if moment is not None and moment.tzinfo is None:
                raise BrokerJobsError(
                    "a dead-at bound must have a time zone (for example datetime.now(UTC))"
                )

    @property
    def is_empty(self) -> bool:
        """True when it takes every dead letter."""
        return self == DeadLetterFilter()

    def matches(self, letter: DeadLetter) -> bool:
        if self.reasons and letter.reason not in self.reasons:
            return False
        if self.error is not None and self.error.lower() not in (letter.error or "").lower():
            return False
        if self.ref is not None and self.ref not in (letter.job_id, letter.idempotency_key):
            return False
        return self._in_range(letter.dead_at)

    def _in_range(self, moment: datetime | None) -> bool:
        if self.since is None and self.until is None:
            return True
        if moment is None:  # a time range never takes a dead letter of unknown time
            return False
        return (self.since is None or moment >= self.since) and (
            self.until is None or moment < self.until
        )
