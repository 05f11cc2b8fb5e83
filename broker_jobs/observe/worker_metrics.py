"""The worker's Prometheus metrics (docs/metrics.md, the Worker table), in a registry
the caller gives: nothing is registered at import, and two workers in one process
(tests, benchmarks) keep apart by having registries of their own.

Labels are bounded: ``namespace``, ``task`` (the app's task names), ``outcome`` (the
worker's outcomes, :data:`OUTCOMES`) and ``reason`` (the dead-letter reasons of
``topology/names.py``). A job id or key is never a label.

The labelled children of one task are looked up once (:meth:`WorkerMetrics.task`)
and kept: ``labels(...)`` takes a lock and builds a key on every call, which the
fast path would pay per job.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from broker_jobs.observe.link_metrics import LinkMetrics

#: The ``outcome`` label's values: how a delivery was settled (acked).
OUTCOMES = (
    "succeeded",
    "retried",
    "failed",
    "dead",
    "duplicate",
    "cancelled",
    "busy",
    "rerouted",
    "rescued",
)

#: Seconds: from a millisecond (the fast path's typical lag) to the broker's
#: consumer_timeout (30 min), the longest a run may last.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
)  # fmt: skip


class TaskMetrics:
    """The children of one ``(namespace, task)``: what is counted per job."""

    __slots__ = ("_dead", "_jobs", "_labels", "_metrics", "busy", "duration", "in_flight",
                 "lag", "lease_lost", "overrunning", "renewals", "stuck")  # fmt: skip

    def __init__(self, metrics: WorkerMetrics, namespace: str, task: str) -> None:
        self._metrics = metrics
        self._labels = (namespace, task)
        jobs = metrics.jobs
        self._jobs = {outcome: jobs.labels(namespace, task, outcome) for outcome in OUTCOMES}
        self._dead: dict[str, Counter] = {}
        self.duration = metrics.duration.labels(namespace, task)
        self.lag = metrics.lag.labels(namespace, task)
        self.in_flight = metrics.in_flight.labels(namespace, task)
        self.busy = metrics.claims_busy.labels(namespace, task)
        self.renewals = metrics.lease_renewals.labels(namespace, task)
        self.lease_lost = metrics.leases_lost.labels(namespace, task)
        self.overrunning = metrics.overrunning.labels(namespace, task)
        self.stuck = metrics.stuck.labels(namespace, task)

    def settled(self, outcome: str, count: int = 1) -> None:
        """``count`` deliveries settled with ``outcome`` (one of :data:`OUTCOMES`)."""
        self._jobs[outcome].inc(count)

    def dead_lettered(self, reason: str) -> None:
        counter = self._dead.get(reason)
        if counter is None:  # reasons are few (DEAD_REASONS): kept once seen
            counter = self._dead[reason] = self._metrics.dead_letters.labels(*self._labels, reason)
        counter.inc()


class WorkerMetrics:
    """Every metric of the worker's table in ``registry``; :attr:`link` holds the
    broker link's (shared with the beat)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("namespace", "task")

        def counter(name: str, meaning: str, *more: str) -> Counter:
            return Counter(name, meaning, (*labels, *more), registry=registry)

        def histogram(name: str, meaning: str) -> Histogram:
            return Histogram(name, meaning, labels, buckets=DURATION_BUCKETS, registry=registry)

        self.jobs = counter("broker_jobs_jobs", "Deliveries settled, by outcome", "outcome")
        self.dead_letters = counter(
            "broker_jobs_dead_letters", "Jobs this worker dead-lettered, by reason", "reason"
        )
        self.duration = histogram("broker_jobs_job_duration_seconds", "Handler run time")
        self.lag = histogram(
            "broker_jobs_job_lag_seconds",
            "Publish (or due time, for a delayed job) to handler start",
        )
        self.in_flight = Gauge(
            "broker_jobs_jobs_in_flight", "Handlers running now", labels, registry=registry
        )
        self.claims_busy = counter(
            "broker_jobs_claims_busy",
            "Claims that found the job running under another worker's lease",
        )
        self.lease_renewals = counter("broker_jobs_lease_renewals", "Lease renewals")
        self.leases_lost = counter("broker_jobs_leases_lost", "Leases another worker took over")
        self.overrunning = Gauge(
            "broker_jobs_handlers_overrunning",
            "Sync handlers interrupted at their time limit that have not returned yet",
            labels,
            registry=registry,
        )
        self.stuck = Gauge(
            "broker_jobs_handlers_stuck",
            "Sync handlers still running past their time limit and the overrun grace"
            " (the worker is being replaced)",
            labels,
            registry=registry,
        )
        self.ledger_up = Gauge(
            "broker_jobs_ledger_up",
            "1 while the worker's ledger (store) answers, 0 while its calls fail",
            ("namespace",),
            registry=registry,
        )
        self.ledger_down_seconds = Counter(
            "broker_jobs_ledger_down_seconds",
            "Seconds the worker spent without a working ledger (jobs held, not run)",
            ("namespace",),
            registry=registry,
        )
        self.link = LinkMetrics(registry)
        self._tasks: dict[tuple[str, str], TaskMetrics] = {}

    def task(self, namespace: str, task: str) -> TaskMetrics:
        """The children of ``(namespace, task)``, made on first use; their series
        exist from then on (at 0), so a rate over them never starts missing."""
        found = self._tasks.get((namespace, task))
        if found is None:
            found = self._tasks[(namespace, task)] = TaskMetrics(self, namespace, task)
        return found
