"""The async publisher, for FastAPI and other asyncio code (aio-pika)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack, overload

import aio_pika
import aio_pika.abc
import aio_pika.exceptions

from broker_jobs.amqp.cancelling import cancelled_by_closing
from broker_jobs.amqp.connecting import CONNECT_ERRORS, connect_first, describe
from broker_jobs.app import ModelT, TaskSpec
from broker_jobs.envelope import Job, WireMessage
from broker_jobs.errors import (
    BrokerConnectionError,
    BrokerJobsError,
    BrokerUnreachableError,
    ConfirmTimeoutError,
    NackedError,
    PublishError,
    TopologyMissingError,
    UnroutableError,
)
from broker_jobs.keywords import refuse_unknown_keywords
from broker_jobs.publish.prepare import (
    BatchOutcome,
    JobOptions,
    JobRequest,
    Payload,
    Prepared,
    PublisherBase,
    TaskRef,
    check_unique_ids,
    confirm_timeout_hint,
)
from broker_jobs.urls import mask_text

log = logging.getLogger(__name__)

#: Publishes in flight at once in ``publish_many`` (see the sync publisher's window).
CONFIRM_WINDOW = 1000
#: A full window is refilled once this few remain unconfirmed: waking the sender in
#: bursts rather than once per confirm saves a timer and a task switch per job.
REFILL_BELOW = CONFIRM_WINDOW * 3 // 4


class AsyncPublisher(PublisherBase):
    """The asyncio twin of :class:`~broker_jobs.publish.publisher.Publisher`, same semantics:
    persistent, confirmed within ``confirm_timeout``, ``mandatory``, reconnect on the
    next publish after the connection broke (trying the other nodes first, given
    several URLs). Use it from one event loop; concurrent publishes from tasks of
    that loop are safe and share the connection.
    """

    default_connection_name = "broker-jobs async publisher"

    def _init_connection_state(self) -> None:
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._exchanges: dict[str, aio_pika.abc.AbstractExchange] = {}
        self._connecting = asyncio.Lock()
        #: How many times ``close()`` was called: a publish under way when it was does
        #: not open a new connection for itself (the publisher was closed under it).
        self._closings = 0
        #: Sends whose callers stopped waiting (cancelled): kept until they end.
        self._sending: set[asyncio.Future[Job]] = set()

    @overload
    async def publish(
        self, task: TaskSpec[ModelT], payload: ModelT, **options: Unpack[JobOptions]
    ) -> Job: ...

    @overload
    async def publish(
        self, task: TaskSpec[Any], payload: Mapping[str, Any], **options: Unpack[JobOptions]
    ) -> Job: ...

    @overload
    async def publish(self, task: str, payload: Payload, **options: Unpack[JobOptions]) -> Job: ...

    async def publish(self, task: TaskRef, payload: Payload, **options: Unpack[JobOptions]) -> Job:
        """Publish one job and wait for its confirm; return the job (``job.id``).
        Options as for ``Publisher.publish``, ``delay`` and ``eta`` included."""
        return await self._publish_prepared(self._factory.build(task, payload, **options))

    async def publish_again(self, job: Job, original: WireMessage) -> Job:
        """Publish ``job`` as the message that replaces ``original``, a delivery of an
        earlier attempt of it (a retry; the same job sent through the ladder) and wait
        for its confirm: the original's body and its publisher's own headers are kept
        (``docs/wire-format.md``, "Compatibility"). ``job.due_at`` routes it."""
        return await self._publish_prepared(self._factory.again(job, original))

    async def _publish_prepared(self, prepared: Prepared) -> Job:
        """Send ``prepared`` and wait for its confirm, shielded from the caller's
        cancellation (a request's timeout, a client gone): cancelling a confirm's
        future in aiormq as the broker returns the message breaks the channel's
        reader, and with it every publish in flight. A cancelled caller's send goes
        on to its end; the job may then be stored, as the docs say."""
        # A close() from here on is one under this publish: it does not reconnect.
        sending = asyncio.ensure_future(self._send_and_record(prepared, self._closings))
        self._sending.add(sending)
        sending.add_done_callback(self._sent)
        return await asyncio.shield(sending)

    def _sent(self, sending: asyncio.Future[Job]) -> None:
        self._sending.discard(sending)
        if not sending.cancelled():
            sending.exception()  # retrieved: its caller may have stopped waiting

    async def _send_and_record(self, prepared: Prepared, closings: int) -> Job:
        with self._traced(prepared) as sent:
            error = await self._send_one(sent, closings)
            if (
                isinstance(error, BrokerConnectionError)
                and not isinstance(error, BrokerUnreachableError)
                and self._closings == closings
            ):
                # Found dead mid-publish: send again on a fresh connection; a copy
                # that did arrive carries the same id and key, so it runs once.
                log.warning("%s; reconnecting to publish it again", error)
                unknown, error = error, await self._send_one(sent, closings)
                if isinstance(error, BrokerUnreachableError):
                    raise unknown from error  # the first may be stored: outcome unknown
            if error is not None:
                raise error
        await self._record_confirmed_async([sent.job])
        return sent.job

    @refuse_unknown_keywords()
    async def publish_many(
        self,
        requests: Iterable[JobRequest],
        *,
        on_confirmed: Callable[[Job], None] | None = None,
    ) -> list[Job]:
        """Publish a batch with pipelined confirms (see ``Publisher.publish_many``):
        at most ``CONFIRM_WINDOW`` unconfirmed at once, and a timeout when no confirm
        arrives for ``confirm_timeout`` seconds."""
        prepared = [self._factory.build_request(request) for request in requests]
        check_unique_ids([item.job for item in prepared])
        with self._traced_batch(prepared) as batch:
            outcome = await self._send_batch(batch.prepared, on_confirmed)
            batch.failed = outcome.failed
        await self._record_confirmed_async(outcome.confirmed_jobs())
        return outcome.settle()

    async def _send_batch(
        self, prepared: list[Prepared], on_confirmed: Callable[[Job], None] | None
    ) -> BatchOutcome:
        outcome = BatchOutcome([item.job for item in prepared])
        try:
            channel, refused = await self._ready_channel(prepared)
        except BrokerConnectionError as error:
            outcome.failed = {item.job.id: error for item in prepared}
            return outcome
        outcome.failed.update(refused)
        to_send = [item for item in prepared if item.job.id not in refused]
        connection = self._connection
        batch = _Batch(
            self._settings.confirm_timeout,
            lambda job, error: self._translate(job, error, connection),
            outcome,
            on_confirmed,
        )
        sent = 0
        for item in to_send:
            if len(batch) >= CONFIRM_WINDOW and not await batch.wait_below(REFILL_BELOW):
                break
            if batch.stopped:
                break
            route = self._factory.current_route(item)
            exchange = await self._exchange(channel, route.exchange)
            message = amqp_message(item.message)
            batch.add(item.job, exchange.publish(message, route.routing_key, mandatory=True))
            sent += 1
        await batch.wait_below(1)
        if batch.fail_unsettled(to_send[sent:]):
            await self._drop_connection(connection)  # its state is unknown now
        return outcome

    async def connect(self) -> None:
        """Open the connection now, or check that it is open: a publisher otherwise
        connects on its first publish. For a service's start-up or readiness probe;
        raises :class:`BrokerConnectionError` (or a topology error) as a publish would."""
        await self._ready_channel(())

    async def close(self) -> None:
        self._closings += 1
        # After a connect under way (a publish's first): else the connection it opens
        # would outlive close(), held by a closed publisher.
        async with self._connecting:
            connection = self._connection
            self._forget_channel()
            self._node = None  # used again, it starts with the first node
        if connection is not None and not connection.is_closed:
            await connection.close()

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # -- sending --------------------------------------------------------------------

    async def _record_confirmed_async(self, jobs: list[Job]) -> None:
        """The ledger's write (blocking: SQLite, psycopg) off the event loop."""
        if self._ledger is not None and jobs:
            await asyncio.to_thread(self._record_confirmed, jobs)

    async def _send_one(self, prepared: Prepared, closings: int) -> BrokerJobsError | None:
        """One send of ``prepared``; its error, or None once confirmed. ``closings``:
        :attr:`_closings` when the publish began (closed since: no new connection)."""
        job = prepared.job
        if self._closings != closings and self._channel is None:
            return _outcome_unknown(job, "the publisher was closed")
        try:
            channel, refused = await self._ready_channel([prepared])
        except BrokerConnectionError as error:
            return error
        connection = self._connection
        if refused:
            return refused[job.id]
        route = self._factory.current_route(prepared)
        try:
            exchange = await self._exchange(channel, route.exchange)
            await exchange.publish(
                amqp_message(prepared.message),
                routing_key=route.routing_key,
                mandatory=True,
                timeout=self._settings.confirm_timeout,
            )
        except asyncio.CancelledError:
            if not cancelled_by_closing():
                raise
            # Another publish on this connection failed and dropped it under this one.
            await self._drop_connection(connection)
            return _outcome_unknown(job, f"the connection to {self._node_name()} closed")
        except Exception as error:  # translated below; unknown errors are re-raised
            translated = self._translate(job, error, connection)
            if not isinstance(translated, UnroutableError | NackedError):
                # The channel is closed or in an unknown state: start afresh next time.
                await self._drop_connection(connection)
            return translated
        return None

    def _translate(
        self,
        job: Job,
        error: Exception,
        connection: aio_pika.abc.AbstractConnection | None,
    ) -> BrokerJobsError:
        """``error`` of ``job``'s publish on ``connection`` as the library's."""
        if isinstance(error, aio_pika.exceptions.ChannelNotFoundEntity):
            return TopologyMissingError(mask_text(str(error.args[-1] if error.args else error)))
        if isinstance(error, aio_pika.exceptions.PublishError):  # returned; a DeliveryError
            return self._factory.unroutable(job)
        if isinstance(error, aio_pika.exceptions.DeliveryError):
            return NackedError(job.task, job.id)
        if isinstance(error, TimeoutError):
            hint = confirm_timeout_hint(None, blocked=_blocked(connection))
            return ConfirmTimeoutError(job.task, job.id, self._settings.confirm_timeout, hint)
        why = f"({type(error).__name__}: {mask_text(str(error))})"
        if isinstance(error, aio_pika.exceptions.CONNECTION_EXCEPTIONS):
            return _outcome_unknown(job, f"the connection to {self._node_name()} broke {why}")
        if connection is None or connection.is_closed or connection is not self._connection:
            # Closed or closing under the publish (a close(), another publish dropping
            # it): aiormq raises bare errors then.
            return _outcome_unknown(job, f"the connection to {self._node_name()} closed {why}")
        raise error

    async def _ready_channel(
        self, prepared: Sequence[Prepared]
    ) -> tuple[aio_pika.abc.AbstractChannel, dict[str, BrokerJobsError]]:
        """The open confirm channel, and the jobs refused by the delay-ladder check."""
        async with self._connecting:
            if self._connection is not None and self._connection.is_closed:
                log.warning("the connection to %s closed; reconnecting", self._node_name())
                self._forget_channel()
            if self._channel is None:
                self._forget_connection_facts()
                self._channel = await self._connect()
            refused: dict[str, BrokerJobsError] = {}
            if self._needs_ladder_check(prepared):
                refused = await asyncio.to_thread(self._check_ladder, prepared)
            return self._channel, refused

    async def _exchange(
        self, channel: aio_pika.abc.AbstractChannel, name: str
    ) -> aio_pika.abc.AbstractExchange:
        exchange = self._exchanges.get(name)
        if exchange is None:
            exchange = self._exchanges[name] = await channel.get_exchange(name, ensure=False)
        return exchange

    def _forget_channel(self) -> None:
        self._connection, self._channel = None, None
        self._exchanges.clear()

    async def _connect(self) -> aio_pika.abc.AbstractChannel:
        """Connect to the first node that answers (after a loss, the others first),
        open the confirm channel, then declare the topology on that node."""
        settings = self._settings
        self._connection, node = await connect_first(
            self._urls,
            timeout=settings.connect_timeout,
            connection_name=settings.connection_name,
            after=self._node,
        )
        self._node = node
        connection = self._connection
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            if settings.declare:
                await asyncio.to_thread(self._declare, node)
        except BaseException as error:
            # Closed under the opening (by the broker, or by another publish's drop
            # before it dropped only its own): aiormq raises a bare Exception then,
            # which is the link's failure, not the caller's.
            closed_under = (
                isinstance(error, Exception)
                and not isinstance(error, BrokerJobsError)
                and connection.is_closed
            )
            await self._drop_connection(connection)
            if isinstance(error, CONNECT_ERRORS) or closed_under:
                raise BrokerConnectionError(
                    f"cannot open a channel on the broker at {node.host}:{node.port}"
                    f" ({node.masked}): {describe(error)}"
                ) from None
            raise
        return channel

    async def _drop_connection(self, used: aio_pika.abc.AbstractConnection | None) -> None:
        """Close ``used``, the connection a publish failed on, and forget it if it is
        still the publisher's: a publish that fails late on an old connection must
        not close the one another publish opened meanwhile to send again."""
        if used is not None and used is self._connection:
            self._forget_channel()
        if used is not None and not used.is_closed:
            # Already broken: the next publish opens a new one.
            with contextlib.suppress(*aio_pika.exceptions.CONNECTION_EXCEPTIONS):
                await used.close()


def _outcome_unknown(job: Job, what: str) -> BrokerConnectionError:
    """``what`` happened before ``job``'s confirm came: it may or may not be stored."""
    return BrokerConnectionError(
        f"{what} before job {job.id} was confirmed: its outcome is unknown; publishing it"
        " again with the same id and key is safe"
    )


def _blocked(connection: aio_pika.abc.AbstractConnection | None) -> bool:
    """Whether the broker blocked ``connection`` (``connection.blocked``: a memory or
    disk alarm). aiormq keeps that only in a private event, which it waits on before
    each write, and logs the reason; read defensively: False if its shape changed."""
    transport = getattr(connection, "transport", None)
    underlay = getattr(transport, "connection", None)
    unblocked = getattr(underlay, "_Connection__connection_unblocked", None)
    return isinstance(unblocked, asyncio.Event) and not unblocked.is_set()


def amqp_message(message: WireMessage) -> aio_pika.Message:
    """The AMQP form of a job: persistent, with its properties and headers."""
    return aio_pika.Message(
        message.body,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message.message_id,
        type=message.type,
        timestamp=message.timestamp,
        headers=dict(message.headers),
    )


class _Batch:
    """The publishes of one ``publish_many`` call in flight on one channel.

    A done-callback per publish records its outcome and wakes the sender, so that
    waiting costs one timer per wake-up rather than one per message.
    """

    def __init__(
        self,
        confirm_timeout: float,
        translate: Callable[[Job, Exception], BrokerJobsError],
        outcome: BatchOutcome,
        on_confirmed: Callable[[Job], None] | None,
    ) -> None:
        self._confirm_timeout = confirm_timeout
        self._translate = translate
        self._outcome = outcome
        self._on_confirmed = on_confirmed
        self._in_flight: dict[asyncio.Future[object], Job] = {}
        self._progress = asyncio.Event()
        self._wake_below = 0
        self._last_settled = time.monotonic()
        self.broken: BrokerConnectionError | None = None
        self.timed_out = False

    def __len__(self) -> int:
        return len(self._in_flight)

    @property
    def stopped(self) -> bool:
        return self.broken is not None or self.timed_out

    def add(self, job: Job, publish: Awaitable[object]) -> None:
        future = asyncio.ensure_future(publish)
        self._in_flight[future] = job
        future.add_done_callback(self._settled)

    async def wait_below(self, limit: int) -> bool:
        """Wait until fewer than ``limit`` publishes are unconfirmed; False when
        ``confirm_timeout`` passes without any confirm."""
        self._wake_below = limit
        while len(self._in_flight) >= limit:
            self._progress.clear()
            remaining = self._last_settled + self._confirm_timeout - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                return False
            with contextlib.suppress(TimeoutError):  # re-checked against _last_settled
                await asyncio.wait_for(self._progress.wait(), remaining)
        return True

    def fail_unsettled(self, unsent: list[Prepared]) -> bool:
        """Give jobs without a confirm, and jobs never sent, their errors. True when
        the connection is in an unknown state and must be dropped."""
        failed = self._outcome.failed
        unknown_state = bool(self._in_flight) or self.broken is not None
        for future, job in list(self._in_flight.items()):
            future.remove_done_callback(self._settled)
            future.cancel()
            failed[job.id] = self._translate(job, TimeoutError())  # with the hint why
        self._in_flight.clear()
        reason = "the connection broke" if self.broken else "confirms stopped coming"
        for item in unsent:
            failed[item.job.id] = BrokerConnectionError(
                f"{reason} earlier in this batch; job {item.job.id} was not sent"
            )
        return unknown_state

    def _settled(self, future: asyncio.Future[object]) -> None:
        job = self._in_flight.pop(future)
        self._last_settled = time.monotonic()
        if len(self._in_flight) < self._wake_below:
            self._progress.set()
        error = future.exception() if not future.cancelled() else None
        if error is None:
            self._outcome.confirmed.add(job.id)
            if self._on_confirmed is not None:
                self._on_confirmed(job)
            return
        try:
            translated = self._translate(job, error)  # type: ignore[arg-type]
        except Exception as unexpected:  # not ours to raise in a callback: report it
            translated = PublishError(f"job {job.id} failed to publish: {unexpected!r}")
        self._outcome.failed[job.id] = translated
        if isinstance(translated, BrokerConnectionError):
            self.broken = translated
