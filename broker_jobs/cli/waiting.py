"""``--wait SECONDS`` of the operator's commands that the workers follow through the
ledger (pause, resume, workers stop): look again until nothing is left to wait for."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Seconds between two looks at the heartbeats while waiting.
WAIT_POLL = 0.5


def still_waiting(look: Callable[[], list[str]], wait: float | None) -> list[str]:
    """What ``look`` still names after up to ``wait`` seconds of looking again (the
    workers that have not followed yet); none when not waiting."""
    if wait is None:
        return []
    deadline = time.monotonic() + wait
    while True:
        left = look()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(WAIT_POLL)
