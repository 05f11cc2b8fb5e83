"""Metrics of a beat process (docs/metrics.md, "Beat"): leadership, fires emitted by
kind, fires the catch-up policy skipped, schedules that differ from the leader's,
and the link to the broker."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from broker_jobs.observe.link_metrics import LinkMetrics

#: The ``kind`` label of ``broker_jobs_beat_fires_total``.
FIRE_KINDS = ("on_time", "caught_up")


class BeatMetrics:
    """A beat's metrics in ``registry``, for the schedules of ``namespace``.

    Called from the beat's event loop: :meth:`leading` when leadership is won or lost,
    :meth:`session` when a session with the broker starts or ends, :meth:`fired` per
    emitted fire, :meth:`skipped` when the catch-up policy drops missed fires,
    :meth:`mismatched` when a follower compared its schedules with the leader's."""

    def __init__(
        self,
        registry: CollectorRegistry,
        namespace: str,
        schedules: Iterable[str] = (),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._namespace = namespace
        self._clock = clock
        self.link = LinkMetrics(registry)
        self._is_leader = Gauge(
            "broker_jobs_beat_is_leader",
            "1 while this beat leads",
            ["namespace"],
            registry=registry,
        )
        self._fires = Counter(
            "broker_jobs_beat_fires",
            "Fires emitted, by kind: on_time or caught_up",
            ["namespace", "schedule", "kind"],
            registry=registry,
        )
        self._skipped = Counter(
            "broker_jobs_beat_fires_skipped",
            "Missed fires skipped by the schedule's catch-up policy",
            ["namespace", "schedule"],
            registry=registry,
        )
        self._mismatched = Gauge(
            "broker_jobs_beat_schedules_mismatched",
            "Schedules this beat has and the leader has not, or the reverse, or defines"
            " differently (0 while leading or agreeing)",
            ["namespace"],
            registry=registry,
        )
        self._is_leader.labels(namespace).set(0)
        self._mismatched.labels(namespace).set(0)
        # Every series from the start, so that rate() and increase() see the first fire.
        for schedule in schedules:
            for kind in FIRE_KINDS:
                self._fires.labels(namespace, schedule, kind)
            self._skipped.labels(namespace, schedule)
        self._up = False
        self._ever_up = False
        self._lost_at = 0.0

    def leading(self, leader: bool) -> None:
        self._is_leader.labels(self._namespace).set(1 if leader else 0)

    def mismatched(self, count: int) -> None:
        """How many schedules differ from the leader's (:mod:`scheduler.agreement`)."""
        self._mismatched.labels(self._namespace).set(count)

    def fired(self, schedule: str, kind: str) -> None:
        self._fires.labels(self._namespace, schedule, kind).inc()

    def skipped(self, schedule: str, count: int) -> None:
        if count > 0:
            self._skipped.labels(self._namespace, schedule).inc(count)

    def session(self, up: bool) -> None:
        """A session with the broker started (``up``) or ended; the time between an
        end and the next start is the outage counted in the link metrics."""
        if up == self._up:
            return
        self._up = up
        if not up:
            self._lost_at = self._clock()
            self.link.lost()
        elif self._ever_up:
            self.link.back(self._clock() - self._lost_at)
        else:
            self._ever_up = True
            self.link.connected()
