"""What the ledger's answer to a claim says to do with a delivery: one verdict, for
both of the worker's paths (the fast path's batches and the per-delivery protocol)."""

from __future__ import annotations

from broker_jobs.envelope import Job
from broker_jobs.store.base import Claim, ClaimOutcome
from broker_jobs.worker.observer import JobObserver

#: Claimed: run the handler.
RUN = "run"
#: Running elsewhere under a live lease: hold the delivery and claim again later.
BUSY = "busy"


def claim_verdict(job: Job, claim: Claim, observer: JobObserver) -> str:
    """:data:`RUN`, :data:`BUSY`, or the outcome of a delivery the claim skips
    ("duplicate": done already, or an older attempt; "cancelled"). A skip is logged at
    INFO with the job and the ledger's record, so that it never looks like a success."""
    if claim.outcome is ClaimOutcome.CLAIMED:
        return RUN
    if claim.outcome is ClaimOutcome.BUSY:
        observer.busy_claim(job.task)
        return BUSY
    if claim.outcome is ClaimOutcome.CANCELLED:
        outcome, why = "cancelled", "it was cancelled: the ledger has it"
    else:  # DONE or STALE
        outcome, why = "duplicate", "the ledger has it"
    record = claim.record
    if record.task and record.task != job.task:
        why += (
            f" under task {record.task!r} (job {record.job_id}): a key is shared by every"
            " task of a ledger, so give each task's effect a key of its own"
        )
    observer.skipped(job, outcome, why, record)
    return outcome
