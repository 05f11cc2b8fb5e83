"""What a stop signal asks of a worker: stop gracefully, the same again, or exit now.

The first SIGTERM or SIGINT stops the worker gracefully; a second exits at once (the
broker redelivers whatever was unacked, so nothing is lost either way). But one
request can arrive as two SIGTERMs: ``timeout`` signals its command, then the
command's process group, and a kill of a group that holds the worker and its parent
(a shell script's, a container's init) does the same. Measured: ``timeout 15
broker-jobs worker ...`` got the second 7 ms after the first and exited at once, its
running jobs cut off. So a SIGTERM within :data:`SAME_STOP` seconds of the first is
the same request. A second SIGINT always exits at once: Ctrl-C pressed again is a
person asking.
"""

from __future__ import annotations

import signal
from enum import Enum

#: Seconds within which a second SIGTERM is the first one delivered twice.
SAME_STOP = 2.0


class Asked(Enum):
    STOP = "stop"  #: stop gracefully
    AGAIN = "again"  #: the stop already asked, delivered twice
    EXIT = "exit"  #: exit at once


class StopSignals:
    """The stop signals of one worker, in the order they come."""

    def __init__(self) -> None:
        self._first: float | None = None

    def take(self, signum: signal.Signals, now: float) -> Asked:
        """What ``signum``, arrived at ``now`` (monotonic seconds), asks."""
        if self._first is None:
            self._first = now
            return Asked.STOP
        if signum is signal.SIGTERM and now - self._first < SAME_STOP:
            return Asked.AGAIN
        return Asked.EXIT
