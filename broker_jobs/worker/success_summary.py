"""How a worker tells of its successes (docs/metrics.md, "Logs"): by default one INFO
line a second says how many jobs succeeded, by task, and each success's own line is
at DEBUG; ``--log-successes each`` (``WorkerSettings.success_lines = "each"``) gives
every success its INFO line instead. Failures, retries, dead letters, duplicates and
cancelled jobs keep a line each whatever the choice.

Why: one INFO line per success cost the worker about a third of its drain rate at
its default log level (docs/metrics.md gives the measured figures), for lines that
say "it worked" thousands of times a second; the ledger keeps each job's outcome, and
the metrics count them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from broker_jobs.plural import plural

#: Seconds between two summary lines (a second without successes has none).
SUMMARY_EVERY = 1.0
#: The choices of ``--log-successes``.
SUCCESS_LINES = ("summary", "each")


class SuccessSummary:
    """Counts successes by task (on the event loop, where outcomes are recorded) and
    logs them on ``log`` as one INFO line per :meth:`flush`."""

    def __init__(
        self,
        worker_id: str,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._worker_id = worker_id
        self._log = log
        self._clock = clock
        self._counts: Counter[str] = Counter()
        self._since = clock()

    def add(self, task: str, count: int = 1) -> None:
        self._counts[task] += count

    def flush(self) -> None:
        """Log the successes counted since the last flush, if any."""
        counts, self._counts = self._counts, Counter()
        now = self._clock()
        seconds, self._since = now - self._since, now
        if not counts:
            return
        total = sum(counts.values())
        by_task = dict(sorted(counts.items()))
        self._log.info(
            "worker %s: %s succeeded in the last %.1f s (%s)",
            self._worker_id, plural(total, "job"), seconds,
            ", ".join(f"{task} {count}" for task, count in by_task.items()),
            extra={
                "worker": self._worker_id,
                "summary": "succeeded",
                "succeeded": total,
                "by_task": by_task,
                "seconds": round(seconds, 3),
            },
        )  # fmt: skip

    async def run(self, every: float = SUMMARY_EVERY) -> None:
        """Flush every ``every`` seconds until cancelled (the caller flushes once
        more when the worker ends)."""
        while True:
            await asyncio.sleep(every)
            self.flush()
