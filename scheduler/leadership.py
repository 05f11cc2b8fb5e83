"""Leader election for beat, through RabbitMQ only.

Only the leader emits scheduled jobs. Election needs nothing but the broker the jobs
go through:

- ``<namespace>.beat.leader`` is a durable quorum queue with single active consumer
  (SAC), fed by a fanout exchange of the same name (one permission pattern covers
  both; the default exchange would need write on ``amq.default``, which lets a user
  publish into every queue of the vhost). Every beat declares both, idempotently.
- Every beat consumes the queue (manual ack, prefetch :data:`PREFETCH`). SAC makes
  the broker deliver to one consumer only, so tokens published by anyone reach that
  one. A beat holding a token unacked is the candidate; it keeps the newest and acks
  the older ones (never its only one), so exactly one token is held.
- Tokens: each beat publishes one when it joins and, while it holds none, every
  ``refresh_every`` seconds (a queue that lost its tokens, say by RabbitMQ 4's
  delivery limit or a purge, gets one back).
- The holder renews a *lease*: every ``heartbeat / 4`` seconds it publishes a fresh
  token on the channel that holds the old one and waits for the confirm. The broker
  cannot declare that connection dead before two heartbeat intervals without data
  from it (RabbitMQ's receiver times out 2 to 3 intervals after the last byte), so a
  confirm for a token sent at ``t`` proves nobody else can hold the leadership
  before ``t + 2 * heartbeat``. The lease lasts half that: ``heartbeat`` seconds.
  Leadership starts on the first confirm. In a cluster, a node cut off from the
  queue's majority gets no confirm either, so the lease also ends a leader stranded
  on a minority node long before the majority hands its token over (net_ticktime).
  Renewals keep the held delivery young: RabbitMQ's consumer_timeout never fires on
  it, and its delivery count stays at 0 (RabbitMQ 4 drops a message returned 20
  times).
- Leadership ends at once, before any I/O, when the connection or the token channel
  closes, the consumer is cancelled (queue deleted), a renewal fails, the lease
  lapses, or the event loop stalls: a watchdog ticks every :data:`WATCHDOG_TICK`
  seconds, and a gap longer than ``heartbeat / 2`` (a SIGSTOP, a suspended VM, a
  blocking call) means the broker may have given the token away meanwhile. Then the
  connection is closed and the beat joins again as a follower: new connection, new
  token. :meth:`Leadership.is_leader` applies the same checks when asked, so code
  that resumes after a pause sees ``False`` before it can act.
- When the leader dies, its connection drops and the broker delivers the token it
  held to the next consumer, which becomes leader after one renewal. Measured on
  RabbitMQ 3.10 (one node): 11-20 ms after a kill -9, 5-22 ms after a graceful stop;
  after a SIGSTOP or a network cut, once the broker's heartbeat check drops the
  silent connection, 2 to 3 heartbeats (the check's phase follows the connection's
  start), while the cut-off leader itself stands down after one.

The emitter must publish on :attr:`Leadership.channel`, a channel of the connection
the leadership is held on, after checking :meth:`Leadership.is_leader`: a leader cut
off from the broker cannot emit, since its publishes go nowhere once the broker has
dropped the connection and handed the token over.

Permissions: configure and read on ``<ns>.beat.leader``, and write on it too (the
exchange: publishing tokens, binding the queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq.exceptions

from broker_jobs.amqp.connecting import connect_first
from broker_jobs.errors import BrokerConnectionError, ConfigurationError
from broker_jobs.urls import AnyBrokerURLs, BrokerURL, BrokerURLs, mask_text
from topology.names import ARG_QUEUE_TYPE, InvalidNameError, Names
from topology.permissions import beat_leader_queue

log = logging.getLogger(__name__)

#: RabbitMQ's queue argument for single active consumer (quorum queues ignore the
#: ``exclusive`` consume flag silently, so SAC is how one consumer is chosen).
ARG_SINGLE_ACTIVE_CONSUMER = "x-single-active-consumer"
#: Tokens delivered at once to the active consumer; extra ones are acked on arrival.
PREFETCH = 10
#: Seconds between watchdog ticks (lowered for heartbeats under 2 s).
WATCHDOG_TICK = 0.2
#: Seconds allowed for connecting and for each declare of a session.
CONNECT_TIMEOUT = 10.0
#: Seconds allowed for closing a connection before it is abandoned.
CLOSE_TIMEOUT = 5.0
#: Reconnect delays: the first, the factor between attempts, and the ceiling.
FIRST_RETRY = 0.2
RETRY_FACTOR = 2.0
MAX_RETRY = 10.0
#: A session that ended sooner than this (seconds) counts as a failed attempt.
STABLE_SESSION = 1.0


#: CLOCK_BOOTTIME (Linux) keeps counting while the machine sleeps, as the broker's does.
_CLOCK_ID: int = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def _clock() -> float:
    """Seconds on a clock that runs on while the process is stopped or suspended."""
    return time.clock_gettime(_CLOCK_ID)


@dataclass(frozen=True)
class ElectedAt:
    """When this beat last became leader: ``time.monotonic()`` and wall time (UTC)."""

    monotonic: float
    wall: datetime


@dataclass(frozen=True)
class LeadershipStats:
    """Counters since start (diagnostics): confirmed token publishes, tokens acked
    (replaced by a newer one), elections won, and whether a token is held now."""

    published: int
    acked: int
    elections: int
    holds_token: bool


class _Session:
    """One connection's state; callbacks of an ended session change nothing."""

    def __init__(self, connection: aio_pika.abc.AbstractConnection) -> None:
        self.connection = connection
        self.token_channel: aio_pika.abc.AbstractChannel | None = None
        self.exchange: aio_pika.abc.AbstractExchange | None = None
        self.emit_channel: aio_pika.abc.AbstractChannel | None = None
        self.token: aio_pika.abc.AbstractIncomingMessage | None = None
        self.leader = False
        self.lost = False
        #: Reported up through ``on_session`` (set up, not ended yet).
        self.up = False
        self.last_publish = -float("inf")
        self.lease_from = -float("inf")
        self.wake = asyncio.Event()
        self.closing: asyncio.Task[None] | None = None

    def close(self) -> asyncio.Task[None]:
        """Close the connection (once); the broker then returns the held token."""
        if self.closing is None:
            self.closing = asyncio.get_running_loop().create_task(self._close())
        return self.closing

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.connection.close(), CLOSE_TIMEOUT)


class Leadership:
    """Take part in the election of one beat leader per namespace.

    ``url`` is the broker's URL, or the URLs of its nodes (a sequence, or separated
    by commas): a session goes to the first node that answers, the next one to the
    other nodes first (:attr:`node` is the one in use). ``identity`` names this beat
    in tokens, logs and the connection name. ``heartbeat`` (seconds) sets how fast
    the broker drops a silent beat, hence how long a paused leader keeps others
    waiting (two to three heartbeats) and the lease (one heartbeat).
    ``refresh_every`` is how often a beat holding no token publishes one.
    ``on_change(leader)`` is called on the event loop when leadership is won or lost,
    ``on_session(up)`` when a session with the broker is set up or ends; keep them
    quick. ``force_leader`` is for tests only (a split-brain proof): the beat
    takes no part in the election and :meth:`is_leader` is true whenever it is
    connected.

    Use from one event loop: ``await start()``, then call :meth:`is_leader` just
    before each emit and publish on :attr:`channel`; ``await stop()`` hands the
    leadership over at once.
    """

    def __init__(
        self,
        url: AnyBrokerURLs,
        namespace: str,
        identity: str,
        *,
        heartbeat: int = 5,
        refresh_every: float = 60.0,
        on_change: Callable[[bool], None] | None = None,
        on_session: Callable[[bool], None] | None = None,
        force_leader: bool = False,
    ) -> None:
        self._urls = BrokerURLs.parse(url)
        #: The node of the current session, or of the last one: a new session
        #: tries the other nodes first.
        self._node: BrokerURL | None = None
        try:
            names = Names(namespace)
        except InvalidNameError as error:
            raise ConfigurationError(str(error)) from None
        if not identity:
            raise ConfigurationError("identity must name this beat (for example host:pid)")
        if isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or heartbeat < 1:
            raise ConfigurationError(
                f"heartbeat must be a whole number of seconds, at least 1 (got {heartbeat!r}):"
                " without heartbeats the broker never drops a paused leader"
            )
        if not refresh_every > 0:
            raise ConfigurationError(f"refresh_every must be positive (got {refresh_every!r})")
        self._queue = beat_leader_queue(names)
        self._identity = identity
        self._heartbeat = heartbeat
        self._refresh_every = float(refresh_every)
        self._on_change = on_change
        self._on_session = on_session
        self._force = force_leader
        #: The broker drops a silent connection 2 to 3 heartbeats after its last byte.
        self._lease = float(heartbeat)
        self._renew_every = heartbeat / 4
        self._stall_limit = heartbeat / 2
        self._tick = min(WATCHDOG_TICK, heartbeat / 10)
        self._session: _Session | None = None
        self._elected_at: ElectedAt | None = None
        self._leader_event = asyncio.Event()
        self._last_tick = _clock()
        self._runner: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._stopping = False
        self._published = 0
        self._acked = 0
        self._elections = 0

    # -- public surface -----------------------------------------------------------

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def queue(self) -> str:
        """The election queue (and the name of the exchange that feeds it)."""
        return self._queue

    @property
    def elected_at(self) -> ElectedAt | None:
        """When leadership was last won (kept after it is lost)."""
        return self._elected_at

    @property
    def node(self) -> BrokerURL | None:
        """The broker node of the current session (or of the last one)."""
        return self._node

    @property
    def connected(self) -> bool:
        session = self._session
        return session is not None and not session.lost and session.emit_channel is not None

    @property
    def connection(self) -> aio_pika.abc.AbstractConnection:
        """The connection the leadership is held on."""
        return self._live_session().connection

    @property
    def channel(self) -> aio_pika.abc.AbstractChannel:
        """A publisher-confirm channel of :attr:`connection` for the emitter (not the
        one holding the token, so an emitter's channel error costs no leadership;
        reopened when it closes)."""
        channel = self._live_session().emit_channel
        if channel is None or channel.is_closed:
            raise BrokerConnectionError(f"beat {self._identity}: the emit channel is reopening")
        return channel

    @property
    def stats(self) -> LeadershipStats:
        session = self._session
        return LeadershipStats(
            published=self._published,
            acked=self._acked,
            elections=self._elections,
            holds_token=session is not None and session.token is not None,
        )

    def is_leader(self) -> bool:
        """Whether this beat leads now. Checks the watchdog and the lease first, so a
        process that was paused gets ``False`` (and stands down) at once."""
        session = self._session
        if session is None or not session.leader:
            return False
        now = _clock()
        stalled = now - self._last_tick
        if stalled > self._stall_limit:
            self._lose(session, f"the event loop stalled for {stalled:.1f} s")
            return False
        if not self._force and now - session.lease_from >= self._lease:
            self._lose(session, f"no renewal confirmed for {now - session.lease_from:.1f} s")
            return False
        if session.connection.is_closed:
            self._lose(session, "the connection is closed")
            return False
        return True

    async def wait_until_leader(self, timeout: float | None = None) -> bool:
        """Wait until this beat leads; False when ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_leader():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if self._leader_event.is_set():
                self._leader_event.clear()  # a win withdrawn by the checks above
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._leader_event.wait(), remaining)
        return True

    async def start(self) -> None:
        """Join the election in the background; returns at once. The broker being
        unreachable is retried with backoff (and logged), never raised."""
        if self._runner is not None:
            raise ConfigurationError("this Leadership was already started; create a new one")
        self._last_tick = _clock()
        self._watchdog = asyncio.create_task(self._watch(), name=f"beat {self._identity} watchdog")
        self._runner = asyncio.create_task(self._run(), name=f"beat {self._identity} leadership")

    async def stop(self) -> None:
        """Stand down first, then close the connection: the broker hands the token
        to the next beat at once."""
        self._stopping = True
        session = self._session
        if session is not None:
            self._lose(session, "stopping")
        for task in (self._runner, self._watchdog):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if session is not None:
            await asyncio.shield(session.close())

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- leadership state ---------------------------------------------------------

    def _live_session(self) -> _Session:
        session = self._session
        if session is None or session.lost or session.connection.is_closed:
            raise BrokerConnectionError(
                f"beat {self._identity} is not connected to the broker at {self._urls.masked}"
            )
        return session

    def _elect(self, session: _Session) -> None:
        if session.leader or session.lost or session is not self._session:
            return
        session.leader = True
        self._elections += 1
        self._elected_at = ElectedAt(time.monotonic(), datetime.now(UTC))
        log.info("beat %s is the leader of %s", self._identity, self._queue)
        self._leader_event.set()
        self._notify(leader=True)

    def _lose(self, session: _Session, reason: str) -> None:
        """End ``session`` now (no I/O before the flag flips); its connection closes
        in the background and the runner joins again."""
        if session.lost:
            return
        session.lost = True
        session.token = None  # not acked: the broker returns it when the channel closes
        was_leader = session.leader
        session.leader = False
        session.wake.set()
        session.close()
        if session is self._session:
            self._leader_event.clear()
        if was_leader:
            level = logging.INFO if self._stopping else logging.WARNING
            log.log(level, "beat %s lost the leadership: %s", self._identity, reason)
            self._notify(leader=False)
        elif not self._stopping:
            log.info("beat %s leaves its session: %s", self._identity, reason)
        if session.up:
            session.up = False
            self._call(self._on_session, False)

    def _session_up(self, session: _Session) -> None:
        if not session.lost:  # it may have ended while being set up
            session.up = True
            self._call(self._on_session, True)

    def _notify(self, *, leader: bool) -> None:
        self._call(self._on_change, leader)

    def _call(self, callback: Callable[[bool], None] | None, value: bool) -> None:
        """A callback of the owner: its failure is logged, never the election's."""
        if callback is None:
            return
        try:
            callback(value)
        except Exception:
            log.exception("a callback of beat %s failed", self._identity)

    # -- background tasks ---------------------------------------------------------

    async def _watch(self) -> None:
        """Tick; a late tick means the loop was stalled long enough for the broker to
        have dropped us, and a lapsed lease means the broker stopped confirming."""
        while True:
            await asyncio.sleep(self._tick)
            now = _clock()
            gap, self._last_tick = now - self._last_tick, now
            session = self._session
            if session is None or session.lost:
                continue
            if gap > self._stall_limit:
                self._lose(session, f"the event loop stalled for {gap:.1f} s")
            elif session.leader and not self._force and now - session.lease_from >= self._lease:
                self._lose(session, f"no renewal confirmed for {now - session.lease_from:.1f} s")

    async def _run(self) -> None:
        """Sessions one after another until stopped; failures are logged, retried."""
        failures = 0
        while not self._stopping:
            if failures:
                delay = min(FIRST_RETRY * RETRY_FACTOR ** (failures - 1), MAX_RETRY)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))  # jitter
            session: _Session | None = None
            try:
                session = await self._open_session()
                self._session_up(session)
                opened = _clock()
                await self._serve(session)
                # Join again at once, unless sessions keep dying young.
                failures = failures + 1 if _clock() - opened < STABLE_SESSION else 0
            except Exception as error:  # the loop must survive anything
                failures += 1
                self._log_failure(
                    error, min(FIRST_RETRY * RETRY_FACTOR ** (failures - 1), MAX_RETRY)
                )
            finally:
                if session is not None:
                    self._lose(session, "session ended")
                    await asyncio.shield(session.close())

    def _log_failure(self, error: Exception, delay: float) -> None:
        described = f"{type(error).__name__}: {mask_text(str(error))}"
        hint = ""
        if isinstance(error, aio_pika.exceptions.ChannelPreconditionFailed):
            hint = (
                f" ({self._queue} exists with other arguments: it must be a quorum queue"
                " with x-single-active-consumer; delete it so that beats can declare it)"
            )
        elif isinstance(error, aiormq.exceptions.ChannelAccessRefused):
            hint = f" (the beat user needs configure, write and read on ^{self._queue}$)"
        log.warning(
            "beat %s: no session with the broker at %s: %s%s; retrying in %.1f s",
            self._identity,
            self._urls.masked,
            described,
            hint,
            delay,
        )

    async def _open_session(self) -> _Session:
        connection, self._node = await connect_first(
            self._urls,
            timeout=CONNECT_TIMEOUT,
            connection_name=f"broker-jobs beat {self._identity}",
            after=self._node,  # after a session ended, the other nodes first
            heartbeat=self._heartbeat,
        )
        session = _Session(connection)
        self._session = session
        self._leader_event.clear()
        connection.close_callbacks.add(functools.partial(self._on_closed, session, "connection"))
        try:
            await asyncio.wait_for(self._prepare(session), CONNECT_TIMEOUT)
        except BaseException:
            self._lose(session, "the session could not be set up")
            raise
        if self._force:
            self._elect(session)
        return session

    async def _prepare(self, session: _Session) -> None:
        channel = await session.connection.channel(publisher_confirms=True, on_return_raises=True)
        session.token_channel = channel
        channel.close_callbacks.add(functools.partial(self._on_closed, session, "token channel"))
        if not self._force:
            await channel.set_qos(prefetch_count=PREFETCH)
            exchange = await channel.declare_exchange(
                self._queue, aio_pika.ExchangeType.FANOUT, durable=True
            )
            queue = await channel.declare_queue(
                self._queue,
                durable=True,
                arguments={ARG_QUEUE_TYPE: "quorum", ARG_SINGLE_ACTIVE_CONSUMER: True},
            )
            await queue.bind(exchange)
            session.exchange = exchange
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(
                functools.partial(self._on_cancelled, session)
            )
            if not await self._publish_token(session):  # our join token
                raise BrokerConnectionError("the broker did not confirm the join token")
            await queue.consume(functools.partial(self._on_token, session))
        await self._open_emit_channel(session)

    async def _open_emit_channel(self, session: _Session) -> None:
        emit = await session.connection.channel(publisher_confirms=True, on_return_raises=True)
        emit.close_callbacks.add(lambda *_: session.wake.set())
        session.emit_channel = emit

    async def _serve(self, session: _Session) -> None:
        """Publish tokens on time until the session ends: renewals while holding one,
        a refresh every ``refresh_every`` otherwise."""
        while not session.lost and not self._stopping:
            emit = session.emit_channel
            if emit is not None and emit.is_closed:
                log.info("beat %s: the emit channel closed; opening another", self._identity)
                await self._open_emit_channel(session)
            if self._force:
                due = float("inf")
            elif session.token is None:
                due = session.last_publish + self._refresh_every
            elif session.leader:
                due = session.last_publish + self._renew_every
            else:
                due = 0.0  # a token arrived: confirm a renewal, then lead
            wait = due - _clock()
            if wait > 0:
                session.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(session.wake.wait(), min(wait, 3600.0))
                continue
            if not await self._publish_token(session):
                return

    async def _publish_token(self, session: _Session) -> bool:
        """Publish one token, confirmed; on success renew the lease when a token is
        held (and lead, on the first one). A failure ends the session."""
        if session.lost or session.exchange is None:
            return False
        body = {"identity": self._identity, "pid": os.getpid(), "at": time.time()}
        message = aio_pika.Message(
            json.dumps(body).encode(),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=uuid.uuid4().hex,
        )
        sent = _clock()
        try:
            await session.exchange.publish(message, "", mandatory=True, timeout=self._lease)
        except (TimeoutError, *aio_pika.exceptions.CONNECTION_EXCEPTIONS) as error:
            described = f"{type(error).__name__}: {mask_text(str(error))}"
            self._lose(session, f"a token publish failed: {described}")
            return False
        self._published += 1
        session.last_publish = sent
        fresh = _clock() - sent < self._lease and _clock() - self._last_tick <= self._stall_limit
        if session.token is not None and not session.lost and fresh:
            session.lease_from = sent
            self._elect(session)
        return True

    async def _on_token(
        self, session: _Session, message: aio_pika.abc.AbstractIncomingMessage
    ) -> None:
        if session.lost:
            return  # the channel is closing: the broker takes the token back
        previous, session.token = session.token, message
        if previous is None:
            session.wake.set()  # renew now, to lead
            return
        try:
            await previous.ack()
        except aio_pika.exceptions.CONNECTION_EXCEPTIONS:
            return  # the channel closed; its close callback ends the session
        self._acked += 1

    def _on_closed(self, session: _Session, what: str, _: Any, error: BaseException | None) -> None:
        reason = "closed" if error is None else f"{type(error).__name__}: {error}"
        self._lose(session, f"the {what} closed ({mask_text(reason)})")

    def _on_cancelled(self, session: _Session, _: object) -> None:
        self._lose(session, f"the broker cancelled the consumer of {self._queue}")
