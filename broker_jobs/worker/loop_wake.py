"""Callbacks from other threads that wake the event loop only when it sleeps.

``loop.call_soon_threadsafe`` writes a byte to the loop's self-pipe on every call: a
system call on the calling thread, which gives up the GIL and, on a busy worker,
waits for it behind the loop (py-spy: over a third of the handler threads' samples
in a drain of no-op jobs), and a wake-up the loop reads back. A loop busy with
deliveries needs no wake-up: it comes back to its selector at every turn.

:class:`WatchedLoop` is a selector event loop whose selector says whether the loop
is blocked in it; :class:`LoopWake` queues a callback and writes to the self-pipe
only then. Before each ``select`` the loop takes the queued callbacks into its next
turn (a callback queued while the loop ran is not left behind a blocking select).
On any other loop (a worker embedded in an application's own loop), it is plain
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import selectors
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any

__all__ = ["LoopWake", "WatchedLoop"]


class _WatchedSelector(selectors.DefaultSelector):
    """The platform's default selector, saying while the loop is blocked in it."""

    def __init__(self) -> None:
        super().__init__()
        #: True from just before a select that may block until it returns.
        self.waiting = False
        #: Called (on the loop's thread) before each select: True if it queued work
        #: for the loop's next turn, so the select must not block.
        self.before_select: list[Callable[[], bool]] = []

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # The flag is set before the callbacks are looked at: a thread that queues a
        # callback after the look sees the flag and writes to the self-pipe.
        self.waiting = True
        try:
            if any([check() for check in self.before_select]):
                timeout = 0
            return super().select(timeout)
        finally:
            self.waiting = False


class WatchedLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose :class:`LoopWake` skips needless self-pipe writes
    (``asyncio.Runner(loop_factory=WatchedLoop)``)."""

    def __init__(self) -> None:
        self.watched_selector = _WatchedSelector()
        super().__init__(self.watched_selector)


class LoopWake:
    """Runs callbacks on ``loop``'s thread, given from any thread, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._calls: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._selector = loop.watched_selector if isinstance(loop, WatchedLoop) else None
        if self._selector is not None:
            self._selector.before_select.append(self._schedule_queued)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        """From any thread: ``callback(*args)`` soon on the loop (dropped once the
        loop is closed: the worker is gone)."""
        selector = self._selector
        with suppress(RuntimeError):  # the loop is closed
            if selector is None:
                self._loop.call_soon_threadsafe(callback, *args)
                return
            self._calls.append((callback, args))
            if selector.waiting:
                self._loop.call_soon_threadsafe(self._run_queued)

    def close(self) -> None:
        """Stop watching the loop's selects (the callbacks queued are dropped)."""
        if self._selector is not None:
            with suppress(ValueError):
                self._selector.before_select.remove(self._schedule_queued)
        self._calls.clear()

    def _schedule_queued(self) -> bool:
        if not self._calls:
            return False
        self._loop.call_soon(self._run_queued)
        return True

    def _run_queued(self) -> None:
        calls = self._calls
        while calls:
            callback, args = calls.popleft()
            try:
                callback(*args)
            except Exception as error:  # as the loop treats a failing callback of its own
                self._loop.call_exception_handler(
                    {"message": f"callback {callback!r} failed", "exception": error}
                )
