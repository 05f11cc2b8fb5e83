"""Acking the deliveries of one channel: the one place that decides when and how a
delivery whose outcome is recorded is acked.

Delivery tags belong to the channel that delivered them. Once that channel is lost
(the connection broke, the broker closed it), its tags are dead: a delivery still
in hand is never acked on a later channel, where the same number names another
message. The broker redelivers each of them, and the ledger answers the copy (a
job recorded as done is acked as a duplicate without running).
"""

from __future__ import annotations

import logging

from aiormq.abc import AbstractChannel

log = logging.getLogger(__name__)


#: The books of a delivery: in hand (running, held, retrying), its outcome recorded
#: (to ack), or left (not started: the broker is to give it back; never acked here).
IN_HAND, RECORDED, LEFT = 0, 1, 2


class ChannelAcks:
    """The unacked deliveries of one channel, in delivery order, and what each waits
    for: a ``multiple`` ack covers only an unbroken run of recorded deliveries from
    the oldest, never one in hand or left."""

    def __init__(self, channel: AbstractChannel) -> None:
        self.channel = channel
        self._unacked: dict[int, int] = {}
        self._lost = False

    @property
    def lost(self) -> bool:
        """Whether the channel is gone: nothing of it is acked, nothing of it starts."""
        return self._lost or self.channel.is_closed

    def lose(self) -> int:
        """The channel is gone; returns how many deliveries were in hand."""
        self._lost = True
        in_hand = len(self._unacked)
        self._unacked.clear()
        return in_hand

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
        self._unacked.pop(tag, None)
        if self.lost:
            return False
        await self.channel.basic_ack(tag)
        return True

    async def nack(self, tag: int) -> bool:
        """Return one delivery to its queue; False if its channel is lost (the broker
        returns it by itself)."""
        self._unacked.pop(tag, None)
        if self.lost:
            return False
        await self.channel.basic_nack(tag, requeue=True)
        return True

    async def ack_many(self, tags: list[int]) -> bool:
        """Ack deliveries whose outcomes are recorded: those that, with every delivery
        before them on the channel, are recorded go in one ``multiple`` frame (an ack
        frame per job cost a socket write and a GIL hand-off each); the others one by
        one. A delivery in hand or left is never covered. False if the channel is lost
        (nothing acked; the broker redelivers them)."""
        unacked = self._unacked
        if self.lost:
            for tag in tags:
                unacked.pop(tag, None)
            return False
        for tag in tags:
            if tag in unacked:
                unacked[tag] = RECORDED
        covered = await self._ack_recorded_run()
        for tag in tags:
            # Looked at again after each await: a frame sent meanwhile may have covered
            # it, and a second ack of one tag is a channel error (the channel is lost).
            if tag > covered and unacked.get(tag) == RECORDED:
                del unacked[tag]
                await self.channel.basic_ack(tag)
        return True

    async def _ack_recorded_run(self) -> int:
        """Ack the unbroken run of recorded deliveries from the oldest in one
        ``multiple`` frame; the last tag it covered (0: none)."""
        unacked = self._unacked
        covered = 0
        for tag, state in unacked.items():  # in delivery order
            if state != RECORDED:
                break
            covered = tag
        if covered:
            while unacked and next(iter(unacked)) <= covered:
                del unacked[next(iter(unacked))]
            await self.channel.basic_ack(covered, multiple=True)
        return covered
