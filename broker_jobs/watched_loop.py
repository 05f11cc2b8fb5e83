"""Callbacks from other threads that wake the event loop only when it sleeps.

``loop.call_soon_threadsafe`` writes a byte to the loop's self-pipe on every call: a
system call on the calling thread, which gives up the GIL and, on a busy worker,
waits for it behind the loop (py-spy: over a third of the handler threads' samples
in a drain of no-op jobs), and a wake-up the loop reads back. A loop busy with
deliveries needs no wake-up: it comes back to its selector at every turn.

A :class:`WatchedLoop` is a selector event loop whose selector knows when the loop is
blocked in it. :func:`call_soon_from_thread` queues a callback and writes to the
self-pipe only then; before each ``select`` the loop takes the queued callbacks into
its next turn, so none is left behind a select that blocks. On any other loop (a
worker embedded in an application's own loop) it is ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any

__all__ = ["WatchedLoop", "call_soon_from_thread"]


def call_soon_from_thread(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any
) -> None:
    """From any thread: ``callback(*args)`` soon on ``loop``, in order; dropped once
    the loop is closed (its owner is gone)."""
    with suppress(RuntimeError):  # the loop is closed
        if isinstance(loop, WatchedLoop):
            loop.call_soon_from_thread(callback, *args)
        else:
            loop.call_soon_threadsafe(callback, *args)


class _WatchedSelector(selectors.DefaultSelector):
    """The platform's default selector, saying while the loop is blocked in it."""

    def __init__(self, before_select: Callable[[], bool]) -> None:
        super().__init__()
        #: Called (on the loop's thread) before each select: True if it queued work
        #: for the loop's next turn, so the select must not block.
        self._before_select = before_select
        #: True from just before a select until it returns.
        self.waiting = False

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # The flag is set before the queue is looked at: a thread that queues a
        # callback after the look sees the flag and writes to the self-pipe.
        self.waiting = True
        try:
            if self._before_select():
                timeout = 0
            return super().select(timeout)
        finally:
            self.waiting = False


class WatchedLoop(asyncio.SelectorEventLoop):
    """A selector event loop that takes callbacks from other threads without a
    self-pipe write while it is busy (``asyncio.Runner(loop_factory=WatchedLoop)``)."""

    def __init__(self) -> None:
        self._watched = _WatchedSelector(self._schedule_from_threads)
        self._from_threads: deque[
            tuple[contextvars.Context, Callable[..., object], tuple[Any, ...]]
        ] = deque()
        super().__init__(self._watched)

    def call_soon_from_thread(self, callback: Callable[..., object], *args: Any) -> None:
        """``call_soon_threadsafe``, writing to the self-pipe only if the loop sleeps:
        the callback runs in a copy of the caller's context, as there; RuntimeError once
        the loop is closed."""
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
        self._from_threads.append((contextvars.copy_context(), callback, args))
        if self._watched.waiting:
            self.call_soon_threadsafe(self._run_from_threads)

    def _schedule_from_threads(self) -> bool:
        if not self._from_threads:
            return False
        self.call_soon(self._run_from_threads)
        return True

    def _run_from_threads(self) -> None:
        calls = self._from_threads
        while calls:
            context, callback, args = calls.popleft()
            try:
                context.run(callback, *args)
            except Exception as error:  # as the loop treats a failing callback of its own
                self.call_exception_handler(
                    {"message": f"callback {callback!r} failed", "exception": error}
                )
