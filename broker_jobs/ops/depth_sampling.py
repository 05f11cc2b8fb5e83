"""The exporter's samples of queue depths (docs/dashboard.md, "History"): each poll's
ready jobs per task go into the ledger (:mod:`broker_jobs.store.depths`), where the
dashboard's history page charts them. The exporter samples because it runs all the
time and already asks the broker for the depths; the dashboard only reads.

A ledger that refuses the samples (a role without the table, a full disk) costs the
chart its points, never the poll: said once per streak, and once when it takes them
again.
"""

from __future__ import annotations

import logging

from broker_jobs.observe.failure_streak import FailureStreak
from broker_jobs.ops.status import StatusReport
from broker_jobs.store.base import Store

log = logging.getLogger(__name__)


class DepthSampler:
    """Writes the queue depths of each report it is given into a ledger."""

    def __init__(self) -> None:
        self._streak = FailureStreak(log)

    def sample(self, store: Store, report: StatusReport) -> bool:
        """Record ``report``'s ready jobs per task (tasks whose queue could not be read
        are left out: a gap, not a zero); whether the ledger took them."""
        depths = {t.task: t.queue.messages for t in report.tasks if t.queue.messages is not None}
        try:
            store.record_depths(report.namespace, depths, now=report.taken_at)
        except Exception as error:  # the chart's points, never the poll
            self._streak.failed(
                "exporter: the ledger does not take the queue depths (%s): the"
                " dashboard's history has no depths until it does",
                error,
            )
            return False
        self._streak.worked("exporter: the ledger takes the queue depths again")
        return True
