"""What the worker tells about each job: one log line per outcome and the metrics of
docs/metrics.md (when it was given a :class:`~broker_jobs.observe.worker_metrics.WorkerMetrics`).

Both delivery paths (the runner's per-delivery protocol and the fast path) report
here, so a job is counted and logged the same way whichever path settled it:

- :meth:`JobObserver.run` wraps each handler call (:class:`Run`, a context manager):
  the job's execution span, its lag (publish or due time to start), the handlers in
  flight and the run's duration;
- :meth:`JobObserver.settled` counts a settled delivery by outcome;
- ``succeeded``, ``retrying``, ``dead`` and ``skipped`` log the outcome's line (a
  success by default at DEBUG, counted in a summary line a second at INFO:
  :mod:`broker_jobs.worker.success_summary`), with
  the job's fields also as ``extra`` (a JSON log line carries them as fields:
  ``job_id``, ``key``, ``task``, ``attempt``, ``duration_s``, ``worker``,
  ``outcome``, and for failures ``error_type`` and ``error``).

A :class:`Run` is entered on whatever thread runs the handler (a handler thread of
the fast path, the loop); prometheus_client's children are thread-safe, so nothing
here takes a lock of its own or hops threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from broker_jobs.clock import utc_now
from broker_jobs.envelope import Job
from broker_jobs.observe.link_metrics import LinkMetrics
from broker_jobs.observe.tracing import execution_span, execution_traced
from broker_jobs.observe.worker_metrics import OUTCOMES, TaskMetrics, WorkerMetrics
from broker_jobs.store.base import JobRecord, mask_dsn
from broker_jobs.store.processes import MAX_LISTED_RUNNING, RunningJob
from broker_jobs.urls import mask_text
from broker_jobs.worker.success_summary import SuccessSummary

log = logging.getLogger(__name__)

#: Characters of an error message kept in a log line (the dead letter keeps more).
MAX_LOGGED_ERROR = 500


class Run:
    """One handler call of ``job``: ``with observer.run(job) as run: handler(...)``.
    :attr:`duration` is the run's length once it ended (so far, while it runs; None
    if it never started)."""

    __slots__ = ("_metrics", "_running", "_span", "ended", "job", "started")

    def __init__(self, job: Job, metrics: TaskMetrics | None, running: set[Run]) -> None:
        self.job = job
        self._metrics = metrics
        self._running = running
        self._span: AbstractContextManager[None] | None = None
        self.started: float | None = None
        self.ended: float | None = None

    def __enter__(self) -> Run:
        if execution_traced(self.job):
            self._span = span = execution_span(self.job)
            span.__enter__()
        metrics = self._metrics
        if metrics is not None:
            due = self.job.due_at or self.job.created_at
            metrics.lag.observe(max(0.0, time.time() - due.timestamp()))
            metrics.in_flight.inc()
        self.started = time.perf_counter()
        self._running.add(self)  # atomic under the GIL, as is the heartbeat's copy
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.ended = ended = time.perf_counter()
        self._running.discard(self)
        metrics = self._metrics
        if metrics is not None:
            assert self.started is not None  # entered
            metrics.duration.observe(ended - self.started)
            metrics.in_flight.dec()
        span = self._span
        return None if span is None else span.__exit__(kind, error, tb)

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.perf_counter()) - self.started


class JobObserver:
    """Logs and counts the jobs of one worker (``worker_id``) in ``namespace``;
    without ``metrics`` it only logs."""

    def __init__(
        self,
        namespace: str,
        worker_id: str,
        metrics: WorkerMetrics | None = None,
        tasks: Iterable[str] = (),
        *,
        each_success: bool = False,
    ) -> None:
        self._namespace = namespace
        self._worker_id = worker_id
        self._metrics = metrics
        #: Each success's own line at INFO (``each_success``), else at DEBUG with one
        #: INFO line a second counting them (:mod:`broker_jobs.worker.success_summary`).
        self._success_level = logging.INFO if each_success else logging.DEBUG
        self.summary = None if each_success else SuccessSummary(worker_id, log)
        #: The runs in progress (for the heartbeat: :meth:`running_jobs`).
        self._running: set[Run] = set()
        for task in tasks:  # their series exist from the start, at 0
            self._task(task)
        if metrics is not None:
            metrics.ledger_up.labels(namespace).set(1)
            metrics.ledger_down_seconds.labels(namespace)

    @property
    def link(self) -> LinkMetrics | None:
        """The broker link's metrics (None without metrics)."""
        return self._metrics.link if self._metrics is not None else None

    def _task(self, task: str) -> TaskMetrics | None:
        metrics = self._metrics
        return metrics.task(self._namespace, task) if metrics is not None else None

    # -- metrics ------------------------------------------------------------------------

    def run(self, job: Job) -> Run:
        """The context manager to call ``job``'s handler in."""
        return Run(job, self._task(job.task), self._running)

    def running_jobs(self) -> tuple[RunningJob, ...]:
        """The jobs whose handlers run now, the longest-running first (at most
        :data:`MAX_LISTED_RUNNING`)."""
        runs = sorted(self._running.copy(), key=lambda run: run.started or 0.0)
        now, clock = utc_now(), time.perf_counter()
        return tuple(
            RunningJob(
                job_id=run.job.id,
                task=run.job.task,
                key=run.job.idempotency_key,
                attempt=run.job.attempt,
                started_at=now - timedelta(seconds=clock - (run.started or clock)),
            )
            for run in runs[:MAX_LISTED_RUNNING]
        )

    def settled(self, task: str, outcome: str, count: int = 1) -> None:
        """``count`` deliveries of ``task`` settled with the runner's ``outcome``
        (``dead:<reason>`` counts as ``dead``; what is not a settlement, say ``left``
        or ``returned``, is not counted)."""
        metrics = self._task(task)
        if metrics is None:
            return
        outcome = outcome.partition(":")[0]
        if outcome in _SETTLED:
            metrics.settled(outcome, count)

    def busy_claim(self, task: str) -> None:
        if (metrics := self._task(task)) is not None:
            metrics.busy.inc()

    def renewed(self, task: str) -> None:
        if (metrics := self._task(task)) is not None:
            metrics.renewals.inc()

    def lease_lost(self, task: str) -> None:
        if (metrics := self._task(task)) is not None:
            metrics.lease_lost.inc()

    def ledger_up(self, up: bool) -> None:
        if self._metrics is not None:
            self._metrics.ledger_up.labels(self._namespace).set(1 if up else 0)

    def ledger_down_for(self, seconds: float) -> None:
        if self._metrics is not None and seconds > 0:
            self._metrics.ledger_down_seconds.labels(self._namespace).inc(seconds)

    def overrunning(self, task: str, change: int) -> None:
        """Sync handlers of ``task`` interrupted at their time limit, not returned yet."""
        if (metrics := self._task(task)) is not None:
            metrics.overrunning.inc(change)

    def stuck(self, task: str, change: int) -> None:
        """Handlers of ``task`` still running past their limit and the overrun grace."""
        if (metrics := self._task(task)) is not None:
            metrics.stuck.inc(change)

    # -- the outcome lines ----------------------------------------------------------------

    def succeeded(self, job: Job, run: Run | None) -> None:
        """The job's success is recorded: its line (INFO or DEBUG), or its count in
        the summary. On the event loop."""
        self.succeeded_all(((job, run),))

    def succeeded_all(self, runs: Iterable[tuple[Job, Run | None]]) -> None:
        """:meth:`succeeded` for a batch (the fast path's recorder). At WARNING,
        nothing is built or counted."""
        lines = log.isEnabledFor(self._success_level)
        summary = self.summary if log.isEnabledFor(logging.INFO) else None
        if not lines and summary is None:
            return
        for job, run in runs:
            if lines:
                self._succeeded(job, run)
            if summary is not None:
                summary.add(job.task)

    async def summarise(self) -> None:
        """Log the successes' summary every second until cancelled (nothing when each
        success has its line)."""
        if self.summary is not None:
            await self.summary.run()

    def flush_summary(self) -> None:
        """Log the successes counted since the last summary (the worker ends)."""
        if self.summary is not None:
            self.summary.flush()

    def _succeeded(self, job: Job, run: Run | None) -> None:
        fields = self._fields(job, "succeeded", run)
        log.log(
            self._success_level,
            "job %s (key %s, %s attempt %d) succeeded in %s on %s",
            job.id, job.idempotency_key, job.task, job.attempt, _seconds(fields),
            self._worker_id, extra=fields,
        )  # fmt: skip

    def retrying(self, job: Job, run: Run | None, error: BaseException, due: datetime) -> None:
        """The job failed and its next attempt is published for ``due`` (WARNING)."""
        fields = self._fields(job, "retried", run, error)
        fields["next_due"] = due.isoformat(timespec="milliseconds")
        log.warning(
            "job %s (key %s, %s attempt %d) failed in %s on %s: %s: %s; attempt %d due at %s",
            job.id, job.idempotency_key, job.task, job.attempt, _seconds(fields),
            self._worker_id, fields["error_type"], fields["error"], job.attempt + 1,
            fields["next_due"], extra=fields,
        )  # fmt: skip

    def dead(
        self,
        task: str,
        reason: str,
        error: str,
        *,
        job: Job | None = None,
        job_id: str | None = None,
        key: str | None = None,
        attempt: int | None = None,
        run: Run | None = None,
    ) -> None:
        """A job (or a message that never became one: ``job_id``, ``key`` and
        ``attempt`` from its headers, where it has them) is dead-lettered with
        ``reason`` (ERROR: a person must look)."""
        if (metrics := self._task(task)) is not None:
            metrics.dead_lettered(reason)
        fields: dict[str, Any] = {
            "job_id": job.id if job is not None else job_id,
            "key": job.idempotency_key if job is not None else key,
            "task": task,
            "attempt": job.attempt if job is not None else attempt,
            "duration_s": _rounded(run.duration) if run is not None else None,
            "worker": self._worker_id,
            "outcome": "dead",
            "reason": reason,
            "error": _clipped(error),
        }
        error_type, colon, _ = error.partition(": ")
        if colon and error_type.isidentifier():  # "ValueError: ..." from the handler
            fields["error_type"] = error_type
        # A message that never became a job may lack a key or an attempt: say so,
        # rather than print "None".
        key_said = f"key {fields['key']}" if fields["key"] else "no key"
        attempt = fields["attempt"]
        task_said = task if attempt is None else f"{task} attempt {attempt}"
        log.error(
            "job %s (%s, %s) dead-lettered on %s (%s): %s",
            fields["job_id"] or "without an id", key_said, task_said, self._worker_id,
            reason, fields["error"], extra=fields,
        )  # fmt: skip

    def skipped(self, job: Job, outcome: str, why: str, record: JobRecord) -> None:
        """Not run: the ledger has the job done already (or older), or cancelled (INFO)."""
        fields = self._fields(job, outcome, None)
        fields["ledger_status"] = record.status.value
        log.info(
            "job %s (key %s, attempt %d) not run: %s %s (job %s, attempt %d)",
            job.id, job.idempotency_key, job.attempt, why, record.status.value,
            record.job_id, record.attempts, extra=fields,
        )  # fmt: skip

    def _fields(
        self, job: Job, outcome: str, run: Run | None, error: BaseException | None = None
    ) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "job_id": job.id,
            "key": job.idempotency_key,
            "task": job.task,
            "attempt": job.attempt,
            "duration_s": _rounded(run.duration) if run is not None else None,
            "worker": self._worker_id,
            "outcome": outcome,
        }
        if error is not None:
            fields["error_type"] = type(error).__name__
            fields["error"] = _clipped(str(error))
        return fields


#: The runner's outcomes that settle a delivery (the rest: left, returned, ack-...).
_SETTLED = frozenset(OUTCOMES)


def _clipped(error: str) -> str:
    """An error message for a log field: passwords masked (a field is not part of the
    message the logging filter masks), clipped."""
    return mask_dsn(mask_text(error))[:MAX_LOGGED_ERROR]


def _rounded(duration: float | None) -> float | None:
    return None if duration is None else round(duration, 6)


def _seconds(fields: dict[str, Any]) -> str:
    duration = fields["duration_s"]
    return "?" if duration is None else f"{duration:.3f} s"
