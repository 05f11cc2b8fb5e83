"""What the dashboard's actions do, through the library's Python API, each recorded
in the audit log. Every function blocks: the routes call them in a worker thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker_jobs.dashboard import audit
from broker_jobs.dashboard.filters import LetterFilter
from broker_jobs.dashboard.queries import dead_letter_queues
from broker_jobs.dashboard.settings import DashboardSettings
from broker_jobs.ops.dead_letters import LedgerAction, PurgeProgress, ReplayProgress
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
        "running": "a handler runs it: it is not interrupted, nothing changed",
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


def replay(
    settings: DashboardSettings,
    chosen: LetterFilter,
    refs: frozenset[str],
    who: str,
    on_progress: Progress | None = None,
) -> Result:
    """Replay the dead letters of ``refs`` (all that match ``chosen`` when empty)."""

    with dead_letter_queues(settings, chosen.tasks(settings.tasks)) as dlq:
        summary = dlq.replay(
            settings.store, chosen.dead_letter_filter(refs), on_progress=_told(on_progress)
        )
    counts = {
        "scanned": summary.scanned,
        "replayed": len(summary.replayed),
        "skipped": len(summary.skipped),
        **{f"ledger {action.value}": summary.count(action) for action in LedgerAction},
    }
    what = _scope(chosen, refs)
    audit.record(who, "replay", what, len(summary.replayed), _counted(counts))
    notes = [f"skipped {item.letter.job_id!r}: {item.why}" for item in summary.skipped]
    if summary.count(LedgerAction.UNKNOWN):
        notes.append(
            "the store has no record of some keys: is it the store the workers use?"
            " (they run once anyway)"
        )
    job = next(iter(refs)) if len(refs) == 1 else None
    return Result("replay", f"replayed {len(summary.replayed)} dead letter(s)", counts, notes, job)


def purge(
    settings: DashboardSettings,
    chosen: LetterFilter,
    refs: frozenset[str],
    who: str,
    on_progress: Progress | None = None,
) -> Result:
    """Delete the dead letters of ``refs`` (all that match ``chosen`` when empty)."""

    with dead_letter_queues(settings, chosen.tasks(settings.tasks)) as dlq:
        deleted = dlq.purge(chosen.dead_letter_filter(refs), on_progress=_told(on_progress))
    audit.record(who, "purge", _scope(chosen, refs), deleted, f"purged {deleted}")
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


def _scope(chosen: LetterFilter, refs: frozenset[str]) -> str:
    where = ", ".join(f"{name}={value!r}" for name, value in chosen.fields().items()) or "none"
    if refs:
        return f"{len(refs)} selected dead letter(s) {sorted(refs)!r} (filters: {where})"
    return f"every dead letter matching filters: {where}"


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in counts.items())
