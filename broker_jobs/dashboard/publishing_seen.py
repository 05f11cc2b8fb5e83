"""Whether the broker takes publishes, as the dashboard last found it: every page
shows a banner while it does not (a memory or disk alarm).

Asking takes a connection and two publishes
(:func:`~broker_jobs.ops.publishing_check.check_publishing`): milliseconds, but
~2 s while the broker blocks publishing. A page never waits for it. The overview
and task pages, which refresh every few seconds while open, start a check in a
thread of its own once the last one is :data:`MAX_AGE` seconds old. The banner shows
what the last finished check found, and when it found it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from broker_jobs.clock import utc_now
from broker_jobs.ops.publishing_check import Publishing, check_publishing
from broker_jobs.urls import BrokerURLs

log = logging.getLogger(__name__)

#: Seconds between two checks, at most one at a time.
MAX_AGE = 10.0


class PublishingSeen:
    """The last finished check (:attr:`last`, None before one finished; ``accepted``
    None when the broker could not be asked: the unreachable broker's banner says
    that) and when it finished (:attr:`checked_at`)."""

    def __init__(
        self,
        urls: BrokerURLs,
        *,
        max_age: float = MAX_AGE,
        check: Callable[[BrokerURLs], Publishing] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._urls = urls
        self._max_age = max_age
        self._check = check or functools.partial(
            check_publishing, connection_name="broker-jobs dashboard (publishing check)"
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._started: float | None = None
        self._checking = False
        self.last: Publishing | None = None
        self.checked_at: datetime | None = None

    @property
    def blocked(self) -> Publishing | None:
        """The last finding if the broker confirmed none of its publishes; else None."""
        last = self.last
        return last if last is not None and last.accepted is False else None

    def refresh_if_stale(self) -> None:
        """Start a check in the background unless one runs or the last started less
        than ``max_age`` seconds ago."""
        with self._lock:
            now = self._clock()
            if self._checking or (
                self._started is not None and now - self._started < self._max_age
            ):
                return
            self._checking, self._started = True, now
        threading.Thread(
            target=self._run, name="broker-jobs dashboard publishing check", daemon=True
        ).start()

    def _run(self) -> None:
        found: Publishing | None = None
        try:
            found = self._check(self._urls)  # an unreachable broker: accepted None
        except Exception:  # a bug: said, and the banner shows nothing rather than stale
            log.exception("the publishing check failed")
        with self._lock:
            self.last, self.checked_at, self._checking = found, utc_now(), False
