"""A prefetch that follows the pace: a second, deeper consumer per queue for short jobs.

The prefetch (``2 x concurrency + 64`` deliveries per consumer by default) is what the
worker holds unacked: jobs running, jobs waiting for a handler thread, and finished
jobs waiting for their outcome's record and ack. A drain of short jobs runs through
that buffer faster than the broker refills it after each batch of acks (the event loop
waits in ``select`` for 13 % (memory store) to 34 % (SQLite) of a drain); twice the
buffer drained 1.05x (memory) to 1.14x (SQLite, quorum queue) faster (docs/worker.md,
"Speed"), four times (the second consumer with :data:`DEPTH` = 3 prefetches) 1.07x
more again with the SQLite ledger. But every delivery in hand counts against the
broker's consumer_timeout from the moment it was delivered, and the deeper the
buffer, the longer its last job waits behind long ones. So the buffer is deep only
while it is quick to run through.

RabbitMQ fixes a consumer's prefetch when it starts consuming, so the worker deepens
its buffer by consuming each of its queues a second time (with ``DEPTH`` times the
prefetch: four times the deliveries in hand, :meth:`Session.boost`), and cancels
those second consumers to go back. The rule, looked at every :data:`TICK` while the
worker has work:

- boost when the last tick's jobs completed at a pace that runs through the whole deep
  buffer within a second (``(1 + DEPTH) x prefetch x queues`` a second: at
  ``--concurrency 8`` and the default prefetch, 320 jobs a second, jobs of 25 ms or
  less on average);
- stop boosting when the last second's jobs completed at less than half that pace,
  or the worker ran out of work. What the second consumers delivered stays in hand;
  their deliveries still waiting for a handler thread :data:`LEFTOVER_WAIT` seconds
  later go back to the queue (``FastPath.boost_ended``): if jobs turned long, the
  worker is back to the bound of its one consumer per queue, at the cost of one
  delivery (of a quorum queue's limit) for each job returned. A ledger outage
  restarts that wait (nothing goes back for our own outage).

An explicit ``--prefetch`` is kept as given (never boosted). A new session (after a
reconnect) starts unboosted. Each change is logged at DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from broker_jobs.worker.session import Session, change_quietly

log = logging.getLogger(__name__)

#: Seconds between two looks at the pace while the worker has work (or is boosted).
TICK = 0.25
#: Ticks in the pace that ends a boost: a second's.
WINDOW = 4
#: The second consumer's prefetch, in prefetches (measured, docs/worker.md "Speed":
#: 1 gave drain 1.118x with the SQLite ledger; 3, 1.072x more again).
DEPTH = 3
#: Seconds after a boost ended when its deliveries still waiting for a handler
#: thread go back to the queue: long enough for a pause of the pace (a busy machine, a
#: slow second) to pass, short beside the broker's consumer_timeout.
LEFTOVER_WAIT = 30.0


class BoostRule:
    """Whether the worker should be boosted, from the completions of its last ticks."""

    def __init__(
        self, prefetch: int, tick: float = TICK, window: int = WINDOW, depth: int = DEPTH
    ) -> None:
        self._prefetch = prefetch
        self._tick = tick
        self._recent: deque[int] = deque(maxlen=window)
        #: The second consumer's prefetch.
        self.boost_prefetch = depth * prefetch

    def deep(self, queues: int) -> int:
        """Deliveries in hand at most while boosted: each queue's two consumers'."""
        return (self._prefetch + self.boost_prefetch) * queues

    def decide(self, boosted: bool, completed: int, queues: int) -> bool:
        """Whether to be boosted after a tick in which ``completed`` jobs completed,
        ``queues`` queues being consumed."""
        self._recent.append(completed)
        if queues == 0:
            return False
        per_second = self.deep(queues)  # the deep buffer, run through within a second
        if not boosted:
            return completed / self._tick >= per_second
        seconds = len(self._recent) * self._tick
        return sum(self._recent) / seconds >= per_second / 2

    def forget(self) -> None:
        """The worker ran out of work: the next pace starts afresh."""
        self._recent.clear()


class PrefetchBoost:
    """Boosts the session consuming now (``session()``) by :class:`BoostRule`:
    ``completed()`` counts the jobs completed ever; ``working()`` returns once the
    worker has deliveries in hand; ``on_unboost(tags, after)`` hears of the second
    consumers cancelled, and when their waiting deliveries go back."""

    def __init__(
        self,
        prefetch: int,
        *,
        session: Callable[[], Session | None],
        completed: Callable[[], int],
        working: Callable[[], Awaitable[None]],
        is_working: Callable[[], bool],
        on_unboost: Callable[[list[str], float], None],
        tick: float = TICK,
    ) -> None:
        self._rule = BoostRule(prefetch, tick)
        self._session = session
        self._completed = completed
        self._working = working
        self._is_working = is_working
        self._on_unboost = on_unboost
        self._tick = tick

    async def run(self) -> None:
        """Follow the pace until cancelled."""
        count = self._completed()
        while True:
            session = self._session()
            if not self._is_working() and (session is None or not session.boosted):
                self._rule.forget()
                await self._working()
                count = self._completed()
            await asyncio.sleep(self._tick)
            now = self._completed()
            completed, count = now - count, now
            session = self._session()
            if session is not None:
                await self.follow(session, completed)

    async def follow(self, session: Session, completed: int) -> None:
        """Boost ``session``, or end its boost, after a tick in which ``completed``
        jobs completed."""
        boosted = session.boosted
        queues = session.queues_consumed()
        if self._rule.decide(boosted, completed, queues) == boosted:
            return
        pace = completed / self._tick
        if boosted:
            log.debug("jobs complete at %.0f/s: each queue consumed once again", pace)
            await change_quietly(self._unboost(session))
        else:
            log.debug(
                "jobs complete at %.0f/s: each queue consumed a second time (%d deliveries"
                " in hand at most)", pace, self._rule.deep(queues),
            )  # fmt: skip
            await change_quietly(session.boost(self._rule.boost_prefetch))

    async def _unboost(self, session: Session) -> None:
        self._on_unboost(await session.unboost(), LEFTOVER_WAIT)
