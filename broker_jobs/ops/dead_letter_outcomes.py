"""What the dead-letter operations report: a replay's :class:`ReplaySummary` (each
job replayed, with what the replay did to its ledger record, and each one skipped),
and the progress a replay or a purge reports after each message it looked at."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from broker_jobs.ops.dead_letter_message import DeadLetter
from broker_jobs.store.base import Status


class LedgerAction(StrEnum):
    """What a replay did to the job's record before publishing it again."""

    RESET = "reset"  #: DEAD or FAILED -> QUEUED: the job runs again
    #: Left as it was (QUEUED after an interrupted replay, or already claimed or
    #: finished by a copy published before: the publish is then a duplicate).
    UNCHANGED = "unchanged"
    #: This store has no record of the key: is it the store the workers use?
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Replayed:
    """A dead letter published again (confirmed) and acked."""

    letter: DeadLetter
    ledger: LedgerAction
    status: Status | None  #: the record's status once reset, or as found (UNCHANGED)


@dataclass(frozen=True)
class Skipped:
    """A matching dead letter that is not replayable; it stays in its queue."""

    letter: DeadLetter
    why: str


@dataclass(frozen=True)
class ReplayProgress:
    """Passed to a replay's ``on_progress`` after each message it looked at."""

    scanned: int  #: messages looked at so far
    total: int  #: messages the replay looks at, at most (the queues' depth at the start)
    replayed: int
    skipped: int


@dataclass(frozen=True)
class PurgeProgress:
    """Passed to a purge's ``on_progress`` after each message it looked at (once,
    after the whole queues, for a purge without a filter or a limit: the broker
    empties those in one step)."""

    scanned: int  #: messages looked at so far
    total: int  #: messages the purge looks at, at most (the queues' depth at the start)
    deleted: int


@dataclass(frozen=True)
class Reindexed:
    """What a pass over one task's queue did to the ledger's index of dead letters."""

    task: str
    indexed: int  #: dead letters the pass kept, indexed (anew or again)
    dropped: int  #: entries dropped: of letters it took, or that were no longer there


@dataclass
class ReplaySummary:
    """What a replay did."""

    scanned: int = 0
    replayed: list[Replayed] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def count(self, action: LedgerAction) -> int:
        return sum(item.ledger is action for item in self.replayed)

    def progress(self, total: int) -> ReplayProgress:
        """The progress so far, of a replay that looks at ``total`` messages at most."""
        return ReplayProgress(
            self.scanned, max(total, self.scanned), len(self.replayed), len(self.skipped)
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``docs/operations.md``, "what --json prints")."""
        return {
            "scanned": self.scanned,
            "replayed": len(self.replayed),
            "skipped": len(self.skipped),
            "ledger": {action.value: self.count(action) for action in LedgerAction},
            "jobs": [
                {
                    "task": item.letter.task,
                    "job_id": item.letter.job_id,
                    "idempotency_key": item.letter.idempotency_key,
                    "ledger": item.ledger.value,
                    "status": item.status.value if item.status else None,
                }
                for item in self.replayed
            ],
            "skipped_jobs": [
                {"task": item.letter.task, "job_id": item.letter.job_id, "why": item.why}
                for item in self.skipped
            ],
        }
