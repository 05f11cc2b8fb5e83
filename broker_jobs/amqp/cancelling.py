"""Telling our own task's cancellation from a future that aiormq cancelled.

aiormq cancels the futures waiting on a connection (a publish's confirm, a method's
answer) when that connection closes, so an ``await`` raises ``CancelledError`` in a
task that nobody cancelled: another task closed the connection under it (a beat
standing down, a publisher replacing a broken connection). That is a broken link,
to handle as one, not a request to stop the task.
"""

from __future__ import annotations

import asyncio


def cancelled_by_closing() -> bool:
    """Whether a ``CancelledError`` just caught came from a closed connection's
    future: the running task itself is not being cancelled."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0
