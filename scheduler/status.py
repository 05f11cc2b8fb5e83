"""The beat's state as a document: the leader as last announced, how the schedules
given differ from the leader's, and each schedule's last and next fire (``beat
status --json`` and the dashboard's schedules page)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from broker_jobs.app import App
from broker_jobs.ops.documents import iso
from broker_jobs.store.base import Store
from broker_jobs.store.records import LeaderRecord
from scheduler.beat import ANNOUNCE_EVERY, STALE_AFTER_ANNOUNCES, fire_key
from scheduler.digests import Mismatch, schedule_digests
from scheduler.schedules import Schedule


def status_document(
    app: App, schedules: Sequence[Schedule], store: Store, now: datetime
) -> dict[str, object]:
    """What ``beat status --json`` prints: the leader as last announced (``stale``:
    not heard of for three announce periods) with its schedules' digests, how the
    given ``schedules`` differ from those (``mismatch``; None when the leader did not
    say), and each schedule."""
    leader = store.leader(app.namespace)
    digests = schedule_digests(schedules)
    mismatch = leader_mismatch(leader, digests)
    return {
        "namespace": app.namespace,
        "leader": None
        if leader is None
        else {
            "identity": leader.identity,
            "since": iso(leader.since),
            "seen_at": iso(leader.seen_at),
            "stale": is_stale(leader.seen_at, now),
            "schedules": None
            if leader.schedules is None
            else dict(sorted(leader.schedules.items())),
        },
        "mismatch": None if mismatch is None else mismatch.as_document(),
        "schedules": [
            {
                "name": schedule.name,
                "task": schedule.task,
                "when": str(schedule.timing),
                "catch_up": schedule.catch_up.value,
                "digest": digests[schedule.name],
                "last_fire": iso(store.last_fire(fire_key(app.namespace, schedule.name))),
                "next_fire": iso(schedule.timing.next_fire(now)),
            }
            for schedule in schedules
        ],
    }


def leader_mismatch(leader: LeaderRecord | None, digests: Mapping[str, str]) -> Mismatch | None:
    """How ``digests`` (schedules here) differ from the leader's; None when no leader
    listed its schedules (none recorded, or a beat of an older version)."""
    if leader is None or leader.schedules is None:
        return None
    return Mismatch.between(digests, leader.schedules)


def is_stale(seen_at: datetime, now: datetime) -> bool:
    """A leader not heard of for three announce periods: it died, or lost the broker."""
    return (now - seen_at).total_seconds() > STALE_AFTER_ANNOUNCES * ANNOUNCE_EVERY
