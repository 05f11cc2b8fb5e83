"""Which waiting job starts next, by priority level (docs/priorities.md).

A worker of tasks with priorities consumes a queue per level and holds up to its
prefetch from each. Its jobs wait in two places before they run: sync handlers'
jobs for a handler thread (:class:`LevelCalls`), and the per-delivery path's and
async handlers' jobs for a slot (:class:`LevelSlots`). Both ask one
:class:`LevelPicker` which level goes next: the highest waiting (strict), or a
smooth weighted round robin over the levels waiting (weights: under a backlog of
every level, starts come in the weights' proportion, and no level starves).

Under strict, a job that has waited longer than ``max_wait`` (half the broker's
consumer_timeout) goes first, whatever its level: RabbitMQ closes a channel whose
delivery stays unacked past consumer_timeout, and every job it held would return.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from topology.priority import Priority, PriorityPolicy

T = TypeVar("T")
_LEVELS = len(Priority)


class LevelPicker:
    """Picks the level whose waiting job starts next. Not thread-safe: its callers
    hold their own lock (or run on the event loop)."""

    def __init__(self, policy: PriorityPolicy, max_wait: float) -> None:
        self._strict = policy.strict
        self._weights = policy.weights
        self._max_wait = max_wait
        self._current = [0] * _LEVELS  # smooth weighted round robin's running credit

    def pick(self, waiting: list[deque[tuple[float, T]]]) -> int:
        """The index (rank) of a non-empty deque of ``(enqueued_at, item)``."""
        if self._strict:
            return self._strict_pick(waiting)
        return self._weighted_pick(waiting)

    def _strict_pick(self, waiting: list[deque[tuple[float, T]]]) -> int:
        ranks = [rank for rank in range(_LEVELS) if waiting[rank]]
        if len(ranks) > 1:
            oldest = min(ranks, key=lambda rank: waiting[rank][0][0])
            if time.monotonic() - waiting[oldest][0][0] > self._max_wait:
                return oldest
        return ranks[0]

    def _weighted_pick(self, waiting: list[deque[tuple[float, T]]]) -> int:
        # nginx's smooth weighted round robin over the levels that wait: exact
        # proportions over every sum-of-weights picks, interleaved, not bursts.
        ranks = [rank for rank in range(_LEVELS) if waiting[rank]]
        if len(ranks) == 1:
            return ranks[0]
        total = 0
        for rank in ranks:
            self._current[rank] += self._weights[rank]
            total += self._weights[rank]
        chosen = max(ranks, key=lambda rank: self._current[rank])
        self._current[chosen] -= total
        return chosen


class LevelCalls:
    """The handler threads' queue of calls, taken by level (:class:`LevelPicker`);
    ``None`` (an end mark) comes only once no call waits."""

    def __init__(self, picker: LevelPicker) -> None:
        self._picker = picker
        self._ready = threading.Condition()
        self._waiting: list[deque[tuple[float, Callable[[], object]]]] = [
            deque() for _ in range(_LEVELS)
        ]
        self._count = 0
        self._ends = 0

    def put(self, call: Callable[[], object], level: Priority) -> None:
        with self._ready:
            self._waiting[level.rank].append((time.monotonic(), call))
            self._count += 1
            self._ready.notify()

    def end(self) -> None:
        """One thread's end mark."""
        with self._ready:
            self._ends += 1
            self._ready.notify()

    def get(self) -> Callable[[], object] | None:
        with self._ready:
            while not self._count and not self._ends:
                self._ready.wait()
            if not self._count:
                self._ends -= 1
                return None
            self._count -= 1
            return self._waiting[self._picker.pick(self._waiting)].popleft()[1]


class LevelSlots:
    """``size`` slots on the event loop, granted by level when jobs wait for one
    (:class:`LevelPicker`); ``async with slots.at(level):`` holds one."""

    def __init__(self, size: int, picker: LevelPicker) -> None:
        self._free = size
        self._picker = picker
        self._waiting: list[deque[tuple[float, asyncio.Future[None]]]] = [
            deque() for _ in range(_LEVELS)
        ]

    def at(self, level: Priority) -> _Slot:
        return _Slot(self, level)

    async def acquire(self, level: Priority) -> None:
        if self._free > 0 and not any(self._waiting):
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[level.rank].append((time.monotonic(), granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release()  # granted as it was cancelled: pass the slot on
            else:
                self._forget(level, granted)
            raise

    def release(self) -> None:
        while any(self._waiting):
            _, granted = self._waiting[self._picker.pick(self._waiting)].popleft()
            if not granted.done():
                granted.set_result(None)
                return
        self._free += 1

    def _forget(self, level: Priority, granted: asyncio.Future[None]) -> None:
        waiting = self._waiting[level.rank]
        for entry in waiting:
            if entry[1] is granted:
                waiting.remove(entry)
                return


class _Slot:
    __slots__ = ("_level", "_slots")

    def __init__(self, slots: LevelSlots, level: Priority) -> None:
        self._slots = slots
        self._level = level

    async def __aenter__(self) -> None:
        await self._slots.acquire(self._level)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._slots.release()
