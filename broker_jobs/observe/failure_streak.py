"""How a daemon speaks of a dependency that keeps failing (the ledger refusing a
heartbeat, the paused tasks or the queue depths): one WARNING when the failures
start, one INFO when it works again, nothing in between, so a long outage is two
lines and never a line per try.

A worker's ledger has a voice of its own, its gate (:mod:`broker_jobs.worker.ledger_gate`),
which says an outage once for the worker: while the gate is in one, the streaks of
the worker's heartbeat and of its paused tasks' reader (``quiet``) say nothing, so
that one outage is not three WARNINGs and three INFOs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any


def never() -> bool:
    """The default ``quiet``: every streak is said."""
    return False


class FailureStreak:
    """Says, on ``log``, the start and the end of a streak of failures; a failure
    while ``quiet()`` is true (the failure is said elsewhere) starts none."""

    def __init__(self, log: logging.Logger, *, quiet: Callable[[], bool] = never) -> None:
        self._log = log
        self._quiet = quiet
        #: Whether a streak was said and has not ended.
        self.failing = False

    def failed(self, message: str, *args: Any) -> None:
        """A failure: ``message`` at WARNING if it starts a streak."""
        if not self.failing and not self._quiet():
            self._log.warning(message, *args)
            self.failing = True

    def worked(self, message: str, *args: Any) -> None:
        """A success: ``message`` at INFO if it ends a streak."""
        if self.failing:
            self._log.info(message, *args)
        self.failing = False
