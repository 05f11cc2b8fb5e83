"""The beat's state as a document: the leader as last announced and each
schedule's last and next fire (``beat status --json`` and the dashboard's
schedules page)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from broker_jobs.app import App
from broker_jobs.ops.documents import iso
from broker_jobs.store.base import Store
from scheduler.beat import ANNOUNCE_EVERY, fire_key
from scheduler.schedules import Schedule

#: A leader that has not announced itself for this many announce periods is shown
#: as stale (it died, or lost the broker, since).
STALE_AFTER_ANNOUNCES = 3


def status_document(
    app: App, schedules: Sequence[Schedule], store: Store, now: datetime
) -> dict[str, object]:
    """What ``beat status --json`` prints: the leader as last announced (``stale``:
    not heard of for three announce periods) and each schedule."""
    leader = store.leader(app.namespace)
    return {
        "namespace": app.namespace,
        "leader": None
        if leader is None
        else {
            "identity": leader.identity,
            "since": iso(leader.since),
            "seen_at": iso(leader.seen_at),
            "stale": is_stale(leader.seen_at, now),
        },
        "schedules": [
            {
                "name": schedule.name,
                "task": schedule.task,
                "when": str(schedule.timing),
                "catch_up": schedule.catch_up.value,
                "last_fire": iso(store.last_fire(fire_key(app.namespace, schedule.name))),
                "next_fire": iso(schedule.timing.next_fire(now)),
            }
            for schedule in schedules
        ],
    }


def is_stale(seen_at: datetime, now: datetime) -> bool:
    """A leader not heard of for three announce periods: it died, or lost the broker."""
    return (now - seen_at).total_seconds() > STALE_AFTER_ANNOUNCES * ANNOUNCE_EVERY
