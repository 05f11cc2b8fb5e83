"""What the dashboard's actions do, through the library's Python API, each recorded
in the audit log. Every function blocks: the routes call them in a worker thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker_jobs.dashboard import audit
from broker_jobs.dashboard.filters import LetterFilter
from broker_jobs.dashboard.queries import dead_letter_queues
from broker_jobs.dashboard.settings import DashboardSettings
from broker_jobs.ops.dead_letters import (
    DeadLetterFilter,
    DeadLetterQueues,
    LedgerAction,
    PurgeProgress,
    ReplayProgress,
)
from broker_jobs.store.base import Cancellation

#: Told, after each dead letter a bulk action looked at, how many it looked at so
#: far and how many it looks at in all (the queues' depth at the start).
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Result:
    """What an action did, for the result page and the API: a title, counts, notes."""

    action: str
    title: str
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    job: str | None = None  # the job to link back to


def cancel(settings: DashboardSettings, ref: str, who: str) -> Result:
    outcome: Cancellation = settings.store.cancel(ref)
    record = outcome.record
    audit.record(who, "cancel", f"job {ref!r}", 1, outcome.outcome.value)
    state = record.status.value if record else "unknown"
    notes = {
        "cancelled": "it will not run: a worker that receives it acks it without running it",
        "already-cancelled": "it was cancelled before; nothing changed",
        "running": (
            "a worker has claimed it (running, or waiting in its prefetch for a handler"
            " thread): nothing changed"
        ),
        "finished": f"it is {state} already; nothing changed",
        "unknown": "the ledger has no job with that key or id",
    }
    return Result(
        "cancel",
        f"cancel: {outcome.outcome.value}",
        {"cancelled": int(outcome.outcome.value == "cancelled")},
        [notes[outcome.outcome.value]],
        job=record.idempotency_key if record else None,
    )


def pause(settings: DashboardSettings, task: str, who: str) -> Result:
    """Pause ``task`` (``broker-jobs pause``): every worker stops starting its jobs."""
    held = settings.store.pause(settings.names.namespace, task, f"dashboard: {who}")
    audit.record(who, "pause", f"task {task!r}", 1, "paused")
    return Result(
        "pause",
        f"pause: {task} paused",
        {"paused": 1},
        [
            f"paused since {held.since.isoformat(timespec='seconds')} by {held.by}: every"
            " worker stops starting its jobs within a few seconds; running jobs finish,"
            " jobs in hand go back to the queue, new jobs wait there"
        ],
    )


def resume(settings: DashboardSettings, task: str, who: str) -> Result:
    """Lift the pause of ``task`` (``broker-jobs resume``)."""
    lifted = settings.store.resume(settings.names.namespace, task)
    audit.record(
        who, "resume", f"task {task!r}", int(lifted), "resumed" if lifted else "not-paused"
    )
    note = (
        "every worker consumes it again within a few seconds"
        if lifted
        else "it was not paused; nothing changed"
    )
    return Result("resume", f"resume: {task}", {"resumed": int(lifted)}, [note])


@dataclass(frozen=True)
class Selection:
    """The dead letters a bulk action (replay, purge) takes: those of ``refs``, or
    all that match ``chosen`` when ``refs`` is empty."""

    chosen: LetterFilter
    refs: frozenset[str] = frozenset()

    def queues(self, settings: DashboardSettings) -> DeadLetterQueues:
        return dead_letter_queues(settings, self.chosen.tasks(settings.tasks))

    def where(self) -> DeadLetterFilter:
        return self.chosen.dead_letter_filter(self.refs)

    def describe(self) -> str:
        """The selection in the audit log's words."""
        where = ", ".join(f"{k}={v!r}" for k, v in self.chosen.fields().items()) or "none"
        refs = self.refs
        if refs:
            return f"{len(refs)} selected dead letter(s) {sorted(refs)!r} (filters: {where})"
        return f"every dead letter matching filters: {where}"


def replay(
    settings: DashboardSettings, selection: Selection, who: str, on_progress: Progress | None = None
) -> Result:
    """Replay the selected dead letters."""
    with selection.queues(settings) as dlq:
        summary = dlq.replay(settings.store, selection.where(), on_progress=_told(on_progress))
    counts = {
        "scanned": summary.scanned,
        "replayed": len(summary.replayed),
        "skipped": len(summary.skipped),
        **{f"ledger {action.value}": summary.count(action) for action in LedgerAction},
    }
    audit.record(who, "replay", selection.describe(), len(summary.replayed), _counted(counts))
    notes = [f"skipped {item.letter.job_id!r}: {item.why}" for item in summary.skipped]
    if summary.count(LedgerAction.UNKNOWN):
        notes.append(
            "the store has no record of some keys: is it the store the workers use?"
            " (they run once anyway)"
        )
    refs = selection.refs
    job = next(iter(refs)) if len(refs) == 1 else None
    return Result("replay", f"replayed {len(summary.replayed)} dead letter(s)", counts, notes, job)


def purge(
    settings: DashboardSettings, selection: Selection, who: str, on_progress: Progress | None = None
) -> Result:
    """Delete the selected dead letters."""
    with selection.queues(settings) as dlq:
        deleted = dlq.purge(selection.where(), on_progress=_told(on_progress))
    audit.record(who, "purge", selection.describe(), deleted, f"purged {deleted}")
    return Result(
        "purge",
        f"purged {deleted} dead letter(s)",
        {"purged": deleted},
        ["the ledger keeps the jobs' records"],
    )


def _told(
    on_progress: Progress | None,
) -> Callable[[ReplayProgress | PurgeProgress], None] | None:
    """The library's progress callback for ours (None for none: a purge without one
    skips reading the depths)."""
    if on_progress is None:
        return None
    told = on_progress

    def progressed(progress: ReplayProgress | PurgeProgress) -> None:
        told(progress.scanned, progress.total)

    return progressed


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in counts.items())
