"""An in-memory RabbitMQ for tests: the exchanges, queues and bindings of a topology,
routed as RabbitMQ routes them, on a clock the test moves.

It knows what broker-jobs' topology uses and nothing more: direct, topic and fanout
exchanges, exchange-to-exchange bindings, alternate exchanges, ``mandatory`` (a
message no queue takes is refused), a queue-wide ``x-message-ttl`` with its
dead-letter exchange and routing key (the delay ladder), and a quorum queue's
``x-delivery-limit`` and ``x-delivery-count``. Time is the :class:`TestClock`'s:
messages in a TTL queue expire when the test advances it, never on their own.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from broker_jobs.envelope import WireMessage
from broker_jobs.errors import BrokerJobsError
from topology import names as n
from topology.model import ExchangeSpec, QueueSpec, Topology

#: When a test clock starts unless told: a fixed, recognisable moment.
DEFAULT_START = datetime(2030, 1, 1, tzinfo=UTC)


class TestClock:
    """The time of a test: it stands still until :meth:`advance` moves it."""

    __test__ = False  # not a pytest test class

    def __init__(self, start: datetime = DEFAULT_START) -> None:
        if start.tzinfo is None:
            raise BrokerJobsError("a test clock starts at a timezone-aware time, e.g. UTC")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, moment: datetime) -> None:
        """Move to ``moment`` (never backwards: a ledger's times only grow)."""
        with self._lock:
            if moment < self._now:
                raise BrokerJobsError(f"a test clock does not go back ({moment} < {self._now})")
            self._now = moment


class UnknownExchangeError(BrokerJobsError):
    """A publish to an exchange the topology does not have (RabbitMQ: 404 NOT_FOUND)."""


@dataclass
class Held:
    """A message in a queue: what was published, where, and how often delivered."""

    message: WireMessage
    routing_key: str
    #: Deliveries so far (a quorum queue's ``x-delivery-count`` header counts them).
    deliveries: int = 0
    #: When a queue-wide TTL dead-letters it (None: never).
    expires_at: datetime | None = None


@dataclass
class MemoryQueue:
    spec: QueueSpec
    ready: deque[Held] = field(default_factory=deque)

    @property
    def ttl(self) -> timedelta | None:
        milliseconds = self.spec.arguments.get(n.ARG_MESSAGE_TTL)
        return None if milliseconds is None else timedelta(milliseconds=int(milliseconds))

    @property
    def delivery_limit(self) -> int | None:
        limit = self.spec.arguments.get(n.ARG_DELIVERY_LIMIT)
        return None if limit is None else int(limit)


@dataclass(frozen=True)
class Route:
    """Where a binding sends what it matches."""

    destination: str
    to_exchange: bool


class MemoryBroker:
    """The queues of a topology in memory. Thread-safe: the worker publishes retries
    and dead letters from its loop while a test publishes from its own thread."""

    def __init__(self, topology: Topology, clock: TestClock) -> None:
        self.clock = clock
        self._lock = threading.RLock()
        self._exchanges: dict[str, ExchangeSpec] = {}
        self._bindings: dict[str, list[tuple[str, Route]]] = {}
        self._queues: dict[str, MemoryQueue] = {}
        self._tags = itertools.count(1)
        #: Delivered, not yet acked: tag -> (queue, message).
        self._unacked: dict[int, tuple[str, Held]] = {}
        self.declare(topology)

    def declare(self, topology: Topology) -> None:
        with self._lock:
            for exchange in topology.exchanges:
                self._exchanges.setdefault(exchange.name, exchange)
                self._bindings.setdefault(exchange.name, [])
            for queue in topology.queues:
                self._queues.setdefault(queue.name, MemoryQueue(queue))
            for binding in topology.bindings:
                route = Route(binding.destination, binding.to_exchange)
                pair = (binding.routing_key, route)
                if pair not in self._bindings[binding.exchange]:
                    self._bindings[binding.exchange].append(pair)

    # -- publishing ---------------------------------------------------------------------

    def publish(self, exchange: str, routing_key: str, message: WireMessage) -> bool:
        """Route ``message``; False if no queue took it (a ``mandatory`` publish is
        returned then). The confirm is this call returning."""
        with self._lock:
            queues = self._route(exchange, routing_key, set())
            for queue in queues:
                self._enqueue(queue, Held(message, routing_key))
            return bool(queues)

    def _route(self, exchange: str, routing_key: str, seen: set[str]) -> list[str]:
        if exchange == "":  # the default exchange: a queue by its name
            return [routing_key] if routing_key in self._queues else []
        spec = self._exchanges.get(exchange)
        if spec is None:
            raise UnknownExchangeError(f"NOT_FOUND - no exchange '{exchange}' in the memory broker")
        if exchange in seen:
            return []
        seen.add(exchange)
        found: list[str] = []
        for pattern, route in self._bindings[exchange]:
            if not _matches(spec.type, pattern, routing_key):
                continue
            if route.to_exchange:
                found += self._route(route.destination, routing_key, seen)
            elif route.destination not in found:
                found.append(route.destination)
        alternate = spec.arguments.get(n.ARG_ALTERNATE_EXCHANGE)
        if not found and alternate:
            found = self._route(str(alternate), routing_key, seen)
        return found

    def _enqueue(self, name: str, held: Held) -> None:
        queue = self._queues[name]
        ttl = queue.ttl
        held.expires_at = None if ttl is None else self.clock.now() + ttl
        queue.ready.append(held)

    # -- time ---------------------------------------------------------------------------

    def next_expiry(self) -> datetime | None:
        """When the next message in a TTL queue expires (None: none is held)."""
        with self._lock:
            heads = [
                queue.ready[0].expires_at
                for queue in self._queues.values()
                if queue.ready and queue.ready[0].expires_at is not None
            ]
            return min(heads, default=None)

    def expire(self) -> int:
        """Dead-letter every message whose TTL ran out by now (the ladder's next hop);
        how many moved."""
        moved = 0
        with self._lock:
            now = self.clock.now()
            for queue in list(self._queues.values()):
                while queue.ready and (due := queue.ready[0].expires_at) and due <= now:
                    self._dead_letter(queue, queue.ready.popleft())
                    moved += 1
        return moved

    def _dead_letter(self, queue: MemoryQueue, held: Held) -> None:
        exchange = queue.spec.arguments.get(n.ARG_DEAD_LETTER_EXCHANGE)
        if exchange is None:
            return  # RabbitMQ drops it too
        key = str(queue.spec.arguments.get(n.ARG_DEAD_LETTER_ROUTING_KEY) or held.routing_key)
        for target in self._route(str(exchange), key, set()):
            self._enqueue(target, Held(held.message, key))

    # -- consuming ----------------------------------------------------------------------

    def queue_names(self) -> list[str]:
        with self._lock:
            return list(self._queues)

    def depth(self, queue: str) -> int:
        with self._lock:
            return len(self._queues[queue].ready)

    def messages(self, queue: str) -> list[WireMessage]:
        """What ``queue`` holds, in order, left in place."""
        with self._lock:
            return [held.message for held in self._queues[queue].ready]

    def take(self, queue: str) -> tuple[int, WireMessage, str] | None:
        """The next message of ``queue`` as a delivery: its tag, the message (with
        ``x-delivery-count`` on a redelivery, as a quorum queue sets it) and its
        routing key; None if the queue is empty."""
        with self._lock:
            ready = self._queues[queue].ready
            if not ready:
                return None
            held = ready.popleft()
            message = held.message
            if held.deliveries:
                headers = {**message.headers, n.HEADER_DELIVERY_COUNT: held.deliveries}
                message = replace(message, headers=headers)
            held.deliveries += 1
            tag = next(self._tags)
            self._unacked[tag] = (queue, held)
            return tag, message, held.routing_key

    def ack(self, tag: int, *, multiple: bool = False) -> None:
        with self._lock:
            for acked in self._tags_up_to(tag, multiple):
                self._unacked.pop(acked, None)

    def requeue(self, tag: int, *, multiple: bool = False) -> None:
        """Give deliveries back (a nack, a lost channel): to the queue's head, or, past
        a quorum queue's delivery limit, to its dead-letter exchange."""
        with self._lock:
            for returned in sorted(self._tags_up_to(tag, multiple), reverse=True):
                queue_name, held = self._unacked.pop(returned)
                queue = self._queues[queue_name]
                limit = queue.delivery_limit
                if limit is not None and held.deliveries > limit:
                    self._dead_letter(queue, held)
                else:
                    queue.ready.appendleft(held)

    def unacked(self) -> int:
        with self._lock:
            return len(self._unacked)

    def _tags_up_to(self, tag: int, multiple: bool) -> Iterable[int]:
        if not multiple:
            return [tag] if tag in self._unacked else []
        return [held for held in self._unacked if held <= tag]


def _matches(kind: str, pattern: str, key: str) -> bool:
    if kind == "fanout":
        return True
    if kind == "direct":
        return pattern == key
    if kind == "topic":
        return _topic_match(tuple(pattern.split(".")), tuple(key.split(".")))
    raise BrokerJobsError(f"the memory broker has no {kind!r} exchanges")


@lru_cache(maxsize=4096)
def _topic_match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    """AMQP topic matching: ``*`` is one word, ``#`` zero or more."""
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_topic_match(rest, words[skip:]) for skip in range(len(words) + 1))
    if not words:
        return False
    return (head in ("*", words[0])) and _topic_match(rest, words[1:])
