"""A task's queues, its "lanes": one per priority level when it has priorities
(:mod:`topology.priority`), times one per shard when it has shards.

A shard spreads one hot task over several queues: a quorum queue is led by one
node and runs on one core of it, so one queue has a ceiling whatever the cluster's
size (docs/scaling.md). A task declared with ``shards=N`` has N queues per level:
``<ns>.task.<task>`` (shard 0: the queue of a task without shards) and
``<ns>.task.<task>:1`` ... ``:N-1`` (after the level's suffix: ``<task>@high:3``),
bound with the routing keys ``<task>``, ``<task>:1``... A publisher sends a job to
the shard of its idempotency key, ``crc32(key UTF-8) mod N`` (the same shard for
every copy of a job); any shard is correct, since a worker of the task consumes
them all and the ledger, not the queue, decides what already ran. ``:`` cannot
appear in a task name, so no lane of one task collides with another task's queue.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from topology.priority import LEVEL_SEPARATOR, Priority

SHARD_SEPARATOR = ":"
#: Shards of one task: enough to spread it over every node of a large cluster.
MAX_SHARDS = 64
_SHARD_SUFFIX = re.compile(re.escape(SHARD_SEPARATOR) + r"([0-9]+)$")


class InvalidShardsError(ValueError):
    """A shard count that cannot be used; the message says why."""


def check_shards(shards: int) -> int:
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise InvalidShardsError(
            f"shards must be a whole number from 1 to {MAX_SHARDS} (queues per level), got"
            f" {shards!r}"
        )
    return shards


@dataclass(frozen=True)
class Lane:
    """One queue of a task: its priority level and its shard."""

    level: Priority = Priority.NORMAL
    shard: int = 0

    @property
    def suffix(self) -> str:
        """What the lane adds to the task's queue name and routing key."""
        return self.level.suffix + (f"{SHARD_SEPARATOR}{self.shard}" if self.shard else "")


#: The lane of a task without priorities or shards: its one queue.
ONLY_LANE = Lane()


def task_lanes(levels: tuple[Priority, ...], shards: int) -> tuple[Lane, ...]:
    """Every lane of a task of these levels and shards, high first, shard 0 first."""
    return tuple(Lane(level, shard) for level in levels for shard in range(shards))


def shard_of(key: str, shards: int) -> int:
    """The shard of a job of idempotency key ``key``: CRC-32 (as zlib, Java's
    ``java.util.zip.CRC32``, Go's ``hash/crc32`` IEEE compute it) of the key's UTF-8
    bytes, modulo ``shards``."""
    if shards == 1:
        return 0
    return zlib.crc32(key.encode("utf-8")) % shards


def lane_of_routing_key(routing_key: str | None) -> Lane:
    """The lane a delivery was queued in, from its routing key: ``<task>@high:3`` on
    the work exchange, ``<digits>.<task>@high:3`` out of the delay ladder, or the
    queue's name through the default exchange. Only a binding of that lane's queue
    matches such a key, so the key names the queue it came from."""
    if not routing_key or (
        LEVEL_SEPARATOR not in routing_key and SHARD_SEPARATOR not in routing_key
    ):
        return ONLY_LANE  # every delivery of a task of one lane: no regex on the hot path
    shard = 0
    found = _SHARD_SUFFIX.search(routing_key)
    if found:
        shard = int(found.group(1))
        routing_key = routing_key[: found.start()]
    _, separator, level = routing_key.rpartition(LEVEL_SEPARATOR)
    if not separator:
        return Lane(Priority.NORMAL, shard)
    try:
        return Lane(Priority(level), shard)
    except ValueError:
        return Lane(Priority.NORMAL, shard)
