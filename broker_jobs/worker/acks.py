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


class ChannelAcks:
    """The unacked deliveries of one channel, in delivery order, and whether each is
    ready to be acked (its outcome recorded)."""

    def __init__(self, channel: AbstractChannel) -> None:
        self.channel = channel
        self._unacked: dict[int, bool] = {}
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
        """A delivery arrived: not ready until its outcome is recorded."""
        if not self._lost:
            self._unacked[tag] = False

    def forget(self, tag: int) -> None:
        """A delivery left unsettled (the broker gives it back when the channel closes)."""
        self._unacked.pop(tag, None)

    async def ack(self, tag: int) -> bool:
        """Ack one delivery; False if its channel is lost (the broker redelivers it)."""
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
        before them on the channel, are all settled go in one ``multiple`` frame (an
        ack frame per job cost a socket write and a GIL hand-off each); the others
        one by one. A delivery still in hand (held, retrying) is never covered.
        False if the channel is lost (nothing acked; the broker redelivers them)."""
        if self.lost:
            for tag in tags:
                self._unacked.pop(tag, None)
            return False
        unacked = self._unacked
        for tag in tags:
            unacked[tag] = True
        covered = 0
        for tag, ready in unacked.items():  # in delivery order
            if not ready:
                break
            covered = tag
        if covered:
            while unacked and next(iter(unacked)) <= covered:
                del unacked[next(iter(unacked))]
            await self.channel.basic_ack(covered, multiple=True)
        for tag in tags:
            if tag > covered:
                unacked.pop(tag, None)
                await self.channel.basic_ack(tag)
        return True
