"""Acking the deliveries of one channel: the one place that decides when and how a
delivery whose outcome is recorded is acked.

Delivery tags belong to the channel that delivered them. Once that channel is lost
(the connection broke, the broker closed it), its tags are dead: a delivery still
in hand is never acked on a later channel, where the same number names another
message. The broker redelivers each of them, and the ledger answers the copy (a
job recorded as done is acked as a duplicate without running).
"""

from __future__ import annotations

import asyncio
import logging

from aiormq.abc import AbstractChannel
from pamqp import commands

from broker_jobs.worker.direct_frames import DirectFrames, Settlement

log = logging.getLogger(__name__)


#: The books of a delivery: in hand (running, held, retrying), its outcome recorded
#: (to ack), or left (not started: the broker is to give it back; never acked here).
IN_HAND, RECORDED, LEFT = 0, 1, 2

#: How long a recorded delivery behind one still in hand waits for a later
#: ``multiple`` frame to cover it before it is acked on its own. Handler threads
#: finish out of order: this lets one frame ack a batch of them (measured in
#: docs/worker.md, "Speed"), at the cost of at most this long in the prefetch.
STRAGGLER_WAIT = 0.05


def _settled_twice(tag: int) -> None:
    # A second frame for one tag is a channel error: the channel and every delivery in
    # hand on it would be lost. Said, not sent.
    log.warning("delivery %d was settled twice; the second settlement is ignored", tag)


class ChannelAcks:
    """The unacked deliveries of one channel, in delivery order, and what each waits
    for: a ``multiple`` ack covers only an unbroken run of recorded deliveries from
    the oldest, never one in hand or left.

    Frames are decided and sent one at a time (``_sending``), so they reach the broker
    in the order they were decided: aiormq's write queue holds ten frames, and a frame
    that waited for room can be overtaken by a later one. A ``multiple`` ack that
    overtook the single ack (or nack) of a tag it covers would settle that tag twice:
    a channel error, the channel and all its deliveries lost. A frame with nothing
    queued before it is written at once (:class:`DirectFrames`); :meth:`ack_at_once`
    and :meth:`ack_many_at_once` settle without awaiting anything where that needs
    no waiting, and change nothing where it would."""

    def __init__(self, channel: AbstractChannel) -> None:
        self.channel = channel
        self._direct = DirectFrames(channel)
        self._unacked: dict[int, int] = {}
        self._lost = False
        self._sending = asyncio.Lock()
        self._straggler_timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()

    @property
    def lost(self) -> bool:
        """Whether the channel is gone: nothing of it is acked, nothing of it starts."""
        return self._lost or self.channel.is_closed

    def lose(self) -> int:
        """The channel is gone; returns how many deliveries were in hand."""
        self._lost = True
        in_hand = len(self._unacked)
        self._unacked.clear()
        if self._straggler_timer is not None:
            self._straggler_timer.cancel()
            self._straggler_timer = None
        return in_hand

    @property
    def waiting(self) -> int:
        """How many recorded deliveries wait for a frame to ack them."""
        return sum(1 for state in self._unacked.values() if state == RECORDED)

    def taken(self, tag: int) -> None:
        """A delivery arrived: in hand until its outcome is recorded."""
        if not self._lost:
            self._unacked[tag] = IN_HAND

    def forget(self, tag: int) -> None:
        """A delivery left unsettled: the broker gives it back when the channel closes.
        It stays in the books as left, so that no ``multiple`` ack of a later delivery
        covers it (that would ack a job that never ran)."""
        if tag in self._unacked:
            self._unacked[tag] = LEFT

    async def ack(self, tag: int) -> bool:
        """Ack one delivery whose outcome is recorded, in a frame of its own; False if
        its channel is lost (the broker redelivers it)."""
        return await self._settle_one(commands.Basic.Ack(delivery_tag=tag))

    def ack_at_once(self, tag: int) -> bool | None:
        """:meth:`ack`, here and now; None where it would wait (a frame of the channel
        being sent, or one queued in aiormq's write queue): nothing done then."""
        writer = self._writer_now()
        if writer is None:
            return None
        taken = self._take(tag)
        if taken:
            self._direct.send(writer, commands.Basic.Ack(delivery_tag=tag))
        return taken is not False

    async def nack(self, tag: int) -> bool:
        """Return one delivery to its queue; False if its channel is lost (the broker
        returns it by itself)."""
        return await self._settle_one(commands.Basic.Nack(delivery_tag=tag, requeue=True))

    async def _settle_one(self, frame: Settlement) -> bool:
        """Send ``frame`` (an ack or a nack) for one delivery in the books, in its turn;
        False if the channel is lost."""
        async with self._sending:
            taken = self._take(frame.delivery_tag)
            if taken:
                await self._send(frame)
            return taken is not False

    def _take(self, tag: int) -> bool | None:
        """Take ``tag`` out of the books to settle it: False if the channel is lost;
        None if it is not in the books (settled before: said, never sent)."""
        if self.lost:
            return False
        if self._unacked.pop(tag, None) is None:
            _settled_twice(tag)
            return None
        return True

    def _writer_now(self) -> asyncio.StreamWriter | None:
        """Where a frame goes at once, if no frame of this channel is being sent and
        nothing waits in aiormq's write queue (until the loop runs something else)."""
        return None if self._sending.locked() else self._direct.idle_writer()

    async def _send(self, frame: Settlement) -> None:
        """Send ``frame``: at once where nothing waits before it, else the aiormq way
        (returns once it is written). Called holding ``_sending``."""
        if self._direct.write(frame):
            return
        channel = self.channel
        if isinstance(frame, commands.Basic.Ack):
            await channel.basic_ack(frame.delivery_tag, multiple=frame.multiple)
        else:
            await channel.basic_nack(frame.delivery_tag, requeue=frame.requeue)

    async def ack_many(self, tags: list[int]) -> bool:
        """Ack deliveries whose outcomes are recorded: those that, with every delivery
        before them on the channel, are recorded go in one ``multiple`` frame now (an
        ack frame per job cost a socket write and a GIL hand-off each); the others
        wait up to :data:`STRAGGLER_WAIT` for a later frame to cover them, then are
        acked one by one. A delivery in hand or left is never covered. False if the
        channel is lost (nothing acked; the broker redelivers them)."""
        if not self._recorded(tags):
            return False
        async with self._sending:
            if self.lost:
                return False
            await self._ack_recorded_run()
        self._wait_for_stragglers(tags)
        return True

    def ack_many_at_once(self, tags: list[int]) -> bool | None:
        """:meth:`ack_many`, here and now; None where it would wait (as
        :meth:`ack_at_once`): nothing done then."""
        writer = self._writer_now()
        if writer is None:
            return None
        if not self._recorded(tags):
            return False
        covered = self._take_recorded_run()
        if covered:
            self._direct.send(writer, commands.Basic.Ack(delivery_tag=covered, multiple=True))
        self._wait_for_stragglers(tags)
        return True

    def _recorded(self, tags: list[int]) -> bool:
        """Mark ``tags`` recorded in the books; False if the channel is lost (they
        leave the books: nothing of a lost channel is acked)."""
        unacked = self._unacked
        if self.lost:
            for tag in tags:
                unacked.pop(tag, None)
            return False
        for tag in tags:
            if tag in unacked:
                unacked[tag] = RECORDED
        return True

    def _wait_for_stragglers(self, tags: list[int]) -> None:
        """Those of ``tags`` no frame covered yet are acked alone after
        :data:`STRAGGLER_WAIT`, unless a later ``multiple`` frame covers them first."""
        unacked = self._unacked
        if self._straggler_timer is None and any(unacked.get(tag) == RECORDED for tag in tags):
            loop = asyncio.get_running_loop()
            self._straggler_timer = loop.call_later(STRAGGLER_WAIT, self._ack_stragglers)

    async def flush(self) -> None:
        """Ack every recorded delivery now (before the channel closes, say): the
        unbroken run from the oldest in one frame, the others one by one."""
        if self._straggler_timer is not None:
            self._straggler_timer.cancel()
            self._straggler_timer = None
        async with self._sending:
            if self.lost:
                return
            await self._ack_recorded_run()
            unacked = self._unacked
            for tag in [tag for tag, state in unacked.items() if state == RECORDED]:
                del unacked[tag]
                await self._send(commands.Basic.Ack(delivery_tag=tag))

    async def _ack_recorded_run(self) -> None:
        """Ack the unbroken run of recorded deliveries from the oldest in one
        ``multiple`` frame. Called holding ``_sending``."""
        covered = self._take_recorded_run()
        if covered:
            await self._send(commands.Basic.Ack(delivery_tag=covered, multiple=True))

    def _take_recorded_run(self) -> int:
        """Take the unbroken run of recorded deliveries from the oldest out of the
        books; the last tag of the run (0: none), for one ``multiple`` frame."""
        unacked = self._unacked
        covered = 0
        for tag, state in unacked.items():  # in delivery order
            if state != RECORDED:
                break
            covered = tag
        if covered:
            while unacked and next(iter(unacked)) <= covered:
                del unacked[next(iter(unacked))]
        return covered

    def _ack_stragglers(self) -> None:
        self._straggler_timer = None
        task = asyncio.get_running_loop().create_task(self._flush_quietly())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _flush_quietly(self) -> None:
        try:
            await self.flush()
        except Exception as error:  # the channel went meanwhile: the broker redelivers
            # them, and the ledger answers each copy (recorded: acked without running)
            log.warning("acking recorded deliveries failed (%s); they will be redelivered", error)
