"""How a daemon speaks of a dependency that keeps failing (the ledger refusing a
heartbeat, the paused tasks or the queue depths): one WARNING when the failures
start, one INFO when it works again, nothing in between, so a long outage is two
lines and never a line per try."""

from __future__ import annotations

import logging
from typing import Any


class FailureStreak:
    """Says, on ``log``, the start and the end of a streak of failures."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self.failing = False

    def failed(self, message: str, *args: Any) -> None:
        """A failure: ``message`` at WARNING if it starts a streak."""
        if not self.failing:
            self._log.warning(message, *args)
        self.failing = True

    def worked(self, message: str, *args: Any) -> None:
        """A success: ``message`` at INFO if it ends a streak."""
        if self.failing:
            self._log.info(message, *args)
        self.failing = False
