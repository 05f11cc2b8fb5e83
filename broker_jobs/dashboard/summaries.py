"""The ledger's task summaries for the overview and task pages, kept for a few
seconds when they are slow to compute.

``Store.task_summaries`` reads every record: ~10 ms on the demo's ledger, ~1.5 s on a
million records (``bench/dashboard/``). A page answers in a few milliseconds only
if it does not wait for that, so: while a computation takes at most
:data:`SLOW` seconds, every request computes afresh (small ledgers, and the tests,
see exact figures); once it takes longer, requests get the last figures while one
background thread computes the next, at most every :data:`MAX_AGE` seconds. A page
shows when its ledger figures were taken. The first request waits, and so does the
first after :data:`SERVED_FOR` seconds without a computation (a dashboard left
idle): it would otherwise show figures minutes old.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from broker_jobs.store.base import Store, TaskSummary, utc

log = logging.getLogger(__name__)

#: Seconds of computation above which the figures are kept and refreshed behind.
SLOW = 0.1
#: Seconds a kept value is served before the next computation starts.
MAX_AGE = 5.0
#: Seconds after its computation beyond which a kept value is not served at all.
SERVED_FOR = 30.0


class LedgerSummaries:
    def __init__(
        self,
        store: Store,
        *,
        slow: float = SLOW,
        max_age: float = MAX_AGE,
        served_for: float = SERVED_FOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._slow = slow
        self._max_age = max_age
        self._served_for = served_for
        self._clock = clock
        self._lock = threading.Lock()
        self._value: dict[str, TaskSummary] | None = None
        self._taken_at: datetime | None = None
        self._computed_at = 0.0
        self._cost = 0.0
        self._refreshing = False

    def get(self) -> tuple[dict[str, TaskSummary], datetime]:
        """The summaries and when they were taken (aware UTC)."""
        with self._lock:
            value, taken_at = self._value, self._taken_at
            age = self._clock() - self._computed_at
            kept = value is not None and self._cost > self._slow and age < self._served_for
            stale = age >= self._max_age
            if kept and stale and not self._refreshing:
                self._refreshing = True
                threading.Thread(
                    target=self._refresh, name="broker-jobs dashboard summaries", daemon=True
                ).start()
        if kept:
            assert value is not None
            assert taken_at is not None
            return value, taken_at
        return self._compute()

    def _compute(self) -> tuple[dict[str, TaskSummary], datetime]:
        taken_at = utc(None)
        started = self._clock()
        value = self._store.task_summaries(now=taken_at)
        ended = self._clock()
        with self._lock:
            if self._taken_at is None or taken_at >= self._taken_at:
                self._value, self._taken_at = value, taken_at
                self._computed_at, self._cost = ended, ended - started
        return value, taken_at

    def _refresh(self) -> None:
        try:
            self._compute()
        except Exception:  # the next request tries again; the page shows the last figures
            log.warning("reading the ledger's summaries failed", exc_info=True)
        finally:
            with self._lock:
                self._refreshing = False
