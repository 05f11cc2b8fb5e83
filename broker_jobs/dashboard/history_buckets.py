"""The history page's executions per bucket, the buckets that have closed kept.

Buckets are whole minutes or hours (UTC), the last one the current, open one. An
execution is recorded when it finishes, stamped with that time, so a bucket that
ended more than :data:`SETTLED` ago does not change any more (a worker whose clock is
a little behind writes into the last minutes; pruning only removes what lies beyond
the week): it is read from the ledger once and kept, and later requests read only
the buckets after the last one kept. ``Store.outcome_buckets`` reads every execution
of its span (about 2 s for a week of 1,000,000 records with SQLite): the first look
at a range pays that once per dashboard process, every later one reads a few
minutes' executions (docs/dashboard.md, Performance).
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from broker_jobs.dashboard.chart import HISTORY_RANGES, HistoryRange
from broker_jobs.store.base import Store
from broker_jobs.store.depths import step_start

#: How long after its end a bucket is taken as closed.
SETTLED = timedelta(minutes=2)

#: A bucket's executions by task: (succeeded, failed).
Tally = dict[str, tuple[int, int]]


class HistoryBuckets:
    """Reads ``store``'s executions in the buckets of a history range, keeping the
    closed ones (thread-safe: the pages read it from worker threads)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        #: By bucket width: the closed buckets read so far, by their start.
        self._kept: dict[timedelta, dict[datetime, Tally]] = {}

    def read(
        self, chosen: HistoryRange, now: datetime
    ) -> tuple[datetime, dict[str, list[tuple[int, int]]]]:
        """The start of ``chosen``'s first bucket at ``now``, and by task (in order)
        its buckets oldest first (``(0, 0)`` where none finished)."""
        width = chosen.bucket
        current = step_start(now, width)
        since = current - width * (chosen.buckets - 1)
        with self._lock:
            kept = self._kept.setdefault(width, {})
            self._forget_old(kept, width, current)
            first_unread = since
            while first_unread in kept:
                first_unread += width
            fresh = self._store.outcome_buckets(since=first_unread, bucket=width, now=now)
            closed_before = step_start(now - SETTLED, width)
            tallies = [kept[since + width * i] for i in range((first_unread - since) // width)]
            for index in range((now - first_unread) // width + 1):
                start = first_unread + width * index
                tally = {task: found[index] for task, found in fresh.items() if index < len(found)}
                tallies.append(tally)
                if start < closed_before:
                    kept[start] = tally
        tasks = sorted({task for tally in tallies for task in tally})
        return since, {task: [tally.get(task, (0, 0)) for tally in tallies] for task in tasks}

    @staticmethod
    def _forget_old(kept: dict[datetime, Tally], width: timedelta, current: datetime) -> None:
        """Drop what no range of this width shows any more."""
        longest = max(r.buckets for r in HISTORY_RANGES.values() if r.bucket == width)
        oldest = current - width * (longest - 1)
        for start in [start for start in kept if start < oldest]:
            del kept[start]
