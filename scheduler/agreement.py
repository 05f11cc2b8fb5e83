"""A following beat's check that it runs the leader's schedules.

Only the leader emits: a schedule that a follower has and the leader lacks does not
fire, and one defined differently fires as the leader defines it. Each follower
reads the leader's record now and then and compares its schedules' digests with
those recorded there (:mod:`scheduler.digests`); it says so once per change, in a
WARNING that names the schedules, and in a metric an alert rule watches.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from broker_jobs.observe.beat_metrics import BeatMetrics
from broker_jobs.store.records import LeaderRecord
from scheduler.digests import Mismatch

log = logging.getLogger("scheduler.beat")  # the beat's log: operators read one stream


class ScheduleAgreement:
    """What a follower last said about its schedules against the leader's.

    ``digests``: its own schedules' digests; ``stale_after``: seconds after which
    a leader record that was not renewed says nothing of the current leader."""

    def __init__(
        self,
        identity: str,
        digests: Mapping[str, str],
        metrics: BeatMetrics,
        *,
        stale_after: float,
    ) -> None:
        self._identity = identity
        self._digests = dict(digests)
        self._metrics = metrics
        self._stale_after = stale_after
        self._reported: tuple[str, Mismatch] | None = None  # (leader, mismatch) last said

    def check(self, record: LeaderRecord | None, now: datetime) -> Mismatch | None:
        """Compare with ``record`` (the store's leader, read at ``now``); the mismatch,
        or None when there is no leader to compare with (none recorded, this beat
        itself, a stale record, or one that does not list its schedules)."""
        if (
            record is None
            or record.identity == self._identity
            or record.schedules is None
            or (now - record.seen_at).total_seconds() > self._stale_after
        ):
            return None
        mismatch = Mismatch.between(self._digests, record.schedules)
        self._metrics.mismatched(len(mismatch.names))
        said = self._reported
        if mismatch and said != (record.identity, mismatch):
            log.warning(
                "beat %s runs other schedules than the leader %s (%s): only the leader's"
                " fire; deploy the same schedules to every beat",
                self._identity,
                record.identity,
                mismatch.describe(),
            )
            self._reported = (record.identity, mismatch)
        elif not mismatch and said is not None:
            log.info(
                "beat %s runs the same schedules as the leader %s again",
                self._identity,
                record.identity,
            )
            self._reported = None
        return mismatch

    def leading(self) -> None:
        """This beat leads: its schedules are the ones that fire."""
        self._reported = None
        self._metrics.mismatched(0)
