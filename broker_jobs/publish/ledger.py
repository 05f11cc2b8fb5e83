"""Jobs known to the ledger from their publish on (``Publisher(..., ledger=store)``).

Once the broker confirmed a batch, its jobs are recorded as ``queued`` (or
``scheduled``, with their due time) in one store call: a job can then be listed,
watched and cancelled before a worker claims it. Without a ledger a job is known
from its first claim.

The broker holds the job either way, so a store that fails after the confirm loses
nothing: the publish still succeeds, and the ledger learns of the job at its first
claim. An outage is said once (one WARNING when the store first fails, one when it
records again, with how many confirmed jobs it missed meanwhile), not once per
publish. A key that already has a record keeps it (a worker may have claimed the job
before the publisher recorded it); one that another job finished is reported,
because this job will be skipped as a duplicate (the same job finished already is
not: a worker was quicker than the record).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from broker_jobs.envelope import Job
from broker_jobs.errors import BrokerJobsError
from broker_jobs.store.base import TERMINAL, Store

log = logging.getLogger("broker_jobs.publish.publisher")


class PublishedLedger:
    """Records confirmed jobs in a store; see the module docstring."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: Confirmed jobs not recorded since the store last failed (None: recording);
        #: under the lock: an async publisher records from worker threads.
        self._missed: int | None = None
        self._lock = threading.Lock()

    def record(self, jobs: Sequence[Job]) -> None:
        """Record ``jobs`` (all confirmed) as queued or scheduled; never raises for
        a store failure (logged instead: the jobs are safe in the broker)."""
        if not jobs:
            return
        try:
            existing = self.store.record_published(jobs)
        except (BrokerJobsError, OSError) as error:
            self._failed(len(jobs), error)
            return
        self._recorded()
        for job, record in zip(jobs, existing, strict=True):
            # The same job id: a worker took the job and finished it before this
            # record was written (a fast worker), which is no duplicate.
            if record is not None and record.status in TERMINAL and record.job_id != job.id:
                log.warning(
                    "job %s will not run: its key %r is %s in the ledger (job %s); give"
                    " a new key, or replay a dead job with `broker-jobs dlq replay`",
                    job.id,
                    job.idempotency_key,
                    record.status.value,
                    record.job_id,
                )

    def _failed(self, count: int, error: BaseException) -> None:
        with self._lock:
            first = self._missed is None
            self._missed = (self._missed or 0) + count
        if first:
            log.warning(
                "%d confirmed job(s) not recorded in the ledger (they will run; the"
                " ledger knows them from their first claim): %s. Said once: the"
                " publishes go on, and a line says when the ledger records again",
                count,
                error,
            )

    def _recorded(self) -> None:
        if self._missed is None:  # (read without the lock: the common case)
            return
        with self._lock:
            missed, self._missed = self._missed, None
        if missed:
            log.warning(
                "the ledger records published jobs again; %d confirmed job(s) were not"
                " recorded meanwhile (the ledger knows them from their first claim)",
                missed,
            )
