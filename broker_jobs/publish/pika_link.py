"""A confirm-mode pika channel driven by the calling thread, with deadlines.

pika's ``BlockingConnection`` waits for each confirm in turn and without a time
limit: a broker that stops confirming (a quorum queue without its majority, a
memory alarm) hangs the caller forever, and one confirm per round trip caps a batch
at about 1,400 jobs/s. :class:`PikaLink` instead runs a ``SelectConnection`` whose
I/O loop it turns only while a caller waits, so it can pipeline many publishes and
stop waiting at a deadline. While a caller waits for confirms, the link reads the
socket itself and takes a buffer of ``basic.ack`` frames without pika's loop and
decoder (``_OneWriteConnection.read_directly``; 0.81x the CPU of a single confirmed
publish, docs/worker.md); everything else is pika's. It is not thread-safe; the
publisher serialises calls.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.channel
import pika.frame
import pika.spec
from pika.adapters.select_connection import SelectConnection
from pika.adapters.utils.io_services_utils import (  # type: ignore[attr-defined]  # internals
    _AsyncPlaintextTransport,
)

from broker_jobs.amqp.connecting import NodeUnreachable, first_answering
from broker_jobs.amqp.driver_logs import link_lines_dropped
from broker_jobs.amqp.tls import pika_parameters
from broker_jobs.envelope import WireMessage
from broker_jobs.errors import BrokerConnectionError
from broker_jobs.publish.confirm_frames import read_acks
from broker_jobs.publish.frames import publish_frames
from broker_jobs.urls import AnyBrokerURLs, BrokerURL, mask_text

#: Seconds to wait for the broker's close-ok before dropping the socket.
CLOSE_TIMEOUT = 2.0


@dataclass
class Delivery:
    """Progress of one published message, by delivery tag."""

    message_id: str
    acked: bool = False
    nacked: bool = False
    returned: bool = False

    @property
    def settled(self) -> bool:
        return self.acked or self.nacked


@dataclass
class _State:
    deliveries: dict[int, Delivery] = field(default_factory=dict)
    returned_ids: set[str] = field(default_factory=set)
    next_tag: int = 1
    settled: int = 0
    lowest_unsettled: int = 1
    closed: BaseException | None = None
    blocked_reason: str | None = None


class PikaLink:
    """One connection and one confirm-mode channel; dead once closed. Opening one
    raises :class:`~broker_jobs.amqp.connecting.NodeUnreachable` (a
    :class:`BrokerConnectionError`) when the node does not answer."""

    def __init__(self, url: BrokerURL, *, connect_timeout: float, connection_name: str) -> None:
        self._url = url
        self._state = _State()
        self._channel: pika.channel.Channel | None = None
        self._open_error: BaseException | None = None
        self._last_turn = time.monotonic()
        parameters = pika_parameters(url.url)
        parameters.connection_attempts = 1
        parameters.socket_timeout = connect_timeout
        parameters.stack_timeout = connect_timeout
        parameters.client_properties = {"connection_name": connection_name}
        self._connection = _OneWriteConnection(
            parameters,
            on_open_callback=self._on_connection_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_connection_closed,
        )
        # We turn the loop ourselves (poll + process_timeouts) instead of start():
        # that needs the poller activated by hand.
        self._connection.ioloop.activate_poller()
        self._wait_until(
            lambda: self._channel is not None or self._open_error is not None,
            time.monotonic() + connect_timeout,
        )
        if self._channel is None:
            self._abort()
            raise NodeUnreachable(url, self._open_error or "no answer in time")

    @classmethod
    def connect_first(
        cls,
        urls: AnyBrokerURLs,
        *,
        after: BrokerURL | None = None,
        connect_timeout: float,
        connection_name: str,
    ) -> PikaLink:
        """A link to the first of ``urls`` that answers (those after ``after``
        first; see :func:`~broker_jobs.amqp.connecting.first_answering`)."""
        link, _ = first_answering(
            urls,
            lambda url: cls(url, connect_timeout=connect_timeout, connection_name=connection_name),
            after=after,
        )
        return link

    @property
    def url(self) -> BrokerURL:
        """The node this link is connected to."""
        return self._url

    @property
    def is_open(self) -> bool:
        return self._state.closed is None

    @property
    def closed_reason(self) -> BaseException | None:
        return self._state.closed

    @property
    def blocked_reason(self) -> str | None:
        return self._state.blocked_reason

    def refresh_if_idle(self, idle: float) -> None:
        """Handle events already waiting (a close by the broker) without blocking,
        when the loop has not turned for ``idle`` seconds."""
        if time.monotonic() - self._last_turn >= idle:
            self._turn(0.0)

    def publish(self, exchange: str, routing_key: str, message: WireMessage) -> Delivery:
        """Queue one mandatory, persistent publish; its :class:`Delivery` fills in
        as the broker answers while a caller waits."""
        channel = self._channel
        if channel is None or self._state.closed is not None:
            raise BrokerConnectionError(self.describe_closed())
        frames = publish_frames(
            channel.channel_number, exchange, routing_key, message, self._connection.body_max
        )
        if frames is not None and channel.is_open:
            self._connection.send_frames(frames)
        else:  # pika's own path, and its errors
            properties = pika_properties(message)
            channel.basic_publish(exchange, routing_key, message.body, properties, mandatory=True)
        delivery = Delivery(message.message_id or "")
        self._state.deliveries[self._state.next_tag] = delivery
        self._state.next_tag += 1
        return delivery

    def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        """Turn the I/O loop until ``done()``, the link closes, or ``timeout`` passes
        without any settled delivery. True when ``done()``."""
        return self._wait_until(done, time.monotonic() + timeout, extend_on_progress=timeout)

    def forget_settled(self) -> None:
        """Drop settled deliveries once the caller has read them."""
        self._state.deliveries = {
            tag: delivery
            for tag, delivery in self._state.deliveries.items()
            if not delivery.settled
        }
        self._state.returned_ids.clear()

    def close(self) -> None:
        """Close the connection, waiting briefly for the broker's close-ok (pika's
        lines about it, a dozen at INFO, dropped)."""
        with link_lines_dropped():
            self._close()

    def _close(self) -> None:
        connection = self._connection
        if not (connection.is_closed or connection.is_closing):
            connection.close()
        # A connection the broker blocks (connection.blocked: an alarm) is read from no
        # more, so its close-ok cannot come: the socket is dropped without the wait.
        wait = 0.0 if self._state.blocked_reason is not None else CLOSE_TIMEOUT
        deadline = time.monotonic() + wait
        while not connection.is_closed and time.monotonic() < deadline:
            self._turn(deadline - time.monotonic())
        if not connection.is_closed:
            # The broker never answered (a blocked connection is not read from):
            # drop the socket. pika exposes abort() only on its transport.
            transport = getattr(connection, "_transport", None)
            if transport is not None:
                transport.abort()
                self._turn(0.0)  # abort finishes (closes the socket) on the next pass
        self._abort()

    def abandon(self) -> None:
        """Forget this link in a forked child without touching the broker: its socket
        and the loop's epoll are the parent's too, so nothing is sent and nothing is
        unregistered (pika's close would do both, breaking the parent's connection);
        the child's copies of their descriptors are closed, the parent's stay open."""
        if self._state.closed is None:
            self._state.closed = BrokerConnectionError("left to the parent process at a fork")
        transport = getattr(self._connection, "_transport", None)
        poller = getattr(self._connection.ioloop, "_poller", None)  # pika's internals
        for inherited in (getattr(transport, "_sock", None), getattr(poller, "_poll", None)):
            if inherited is not None:
                with contextlib.suppress(OSError):
                    inherited.close()

    def describe_closed(self) -> str:
        reason = self._state.closed
        return (
            f"the connection to {self._url.masked} closed: {_describe(reason)}"
            if reason
            else f"the connection to {self._url.masked} is not open"
        )

    # -- the loop ---------------------------------------------------------------

    def _wait_until(
        self, done: Callable[[], bool], deadline: float, extend_on_progress: float = 0.0
    ) -> bool:
        settled = self._settled_count()
        self._connection.send_buffered()
        while not done():
            if self._state.closed is not None and self._channel is not None:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._turn(remaining)
            if extend_on_progress and self._settled_count() != settled:
                settled = self._settled_count()
                deadline = time.monotonic() + extend_on_progress
        return True

    def _turn(self, timeout: float) -> None:
        """One pass of the I/O loop, sleeping at most ``timeout`` seconds."""
        self._last_turn = time.monotonic()
        if self._connection.read_directly(timeout):
            return
        loop = self._connection.ioloop
        # A timer bounds the poll: without one pika sleeps up to 5 s per pass.
        wake = loop.call_later(max(timeout, 0.0), _nothing)
        try:
            with link_lines_dropped():  # a lost connection: our WARNING or error says it
                loop.poll()
                loop.process_timeouts()
        finally:
            loop.remove_timeout(wake)

    def _settled_count(self) -> int:
        return self._state.settled

    def _abort(self) -> None:
        if self._state.closed is None:
            self._state.closed = BrokerConnectionError("closed by the client")
        # Closing a dead loop must not mask the error that killed it.
        with contextlib.suppress(Exception):
            self._connection.ioloop.close()

    # -- pika callbacks ---------------------------------------------------------------

    def _on_connection_open(self, connection: Any) -> None:
        connection.add_on_connection_blocked_callback(self._on_blocked)
        connection.add_on_connection_unblocked_callback(self._on_unblocked)
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(
            self._on_confirm, callback=lambda _frame: self._set_channel(channel)
        )
        self._connection.take_acks(channel.channel_number, self._settle_acked)

    def _set_channel(self, channel: pika.channel.Channel) -> None:
        self._channel = channel

    def _on_open_error(self, _connection: Any, error: BaseException | str) -> None:
        self._open_error = error if isinstance(error, BaseException) else Exception(error)
        self._state.closed = self._open_error

    def _on_connection_closed(self, _connection: Any, reason: BaseException) -> None:
        # The first reason is the cause: a channel closed by the broker (a missing
        # exchange) closes the connection, whose close-ok may arrive in the same
        # read, and "normal shutdown" must not hide the 404.
        if self._state.closed is None:
            self._state.closed = reason
        if self._channel is None and self._open_error is None:
            self._open_error = reason

    def _on_channel_closed(self, _channel: Any, reason: BaseException) -> None:
        # A closed channel (a missing exchange, say) leaves this link useless: close
        # the connection too, and let the publisher open a fresh one next time.
        if self._state.closed is None:
            self._state.closed = reason
            if self._connection.is_open:
                self._connection.close()

    def _on_blocked(self, _connection: Any, frame: pika.frame.Method[Any]) -> None:
        self._state.blocked_reason = getattr(frame.method, "reason", "") or "unknown"

    def _on_unblocked(self, _connection: Any, _frame: Any) -> None:
        self._state.blocked_reason = None

    def _on_return(
        self,
        _channel: Any,
        _method: pika.spec.Basic.Return,
        properties: pika.BasicProperties,
        _body: bytes,
    ) -> None:
        # The broker sends basic.return before the basic.ack of the same message.
        self._state.returned_ids.add(properties.message_id or "")

    def _on_confirm(self, frame: pika.frame.Method[Any]) -> None:
        method = frame.method
        acked = isinstance(method, pika.spec.Basic.Ack)
        self._settle(method.delivery_tag, method.multiple, acked=acked)

    def _settle_acked(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, acked=True)

    def _settle(self, delivery_tag: int, multiple: bool, *, acked: bool) -> None:
        # Tags are consecutive from 1, so a multiple ack settles every tag from the
        # lowest unsettled one up to its own.
        first = self._state.lowest_unsettled if multiple else delivery_tag
        tags = range(first, delivery_tag + 1)
        for tag in tags:
            delivery = self._state.deliveries.get(tag)
            if delivery is None or delivery.settled:
                continue
            self._state.settled += 1
            if acked:
                delivery.acked = True
                delivery.returned = delivery.message_id in self._state.returned_ids
            else:
                delivery.nacked = True
        deliveries = self._state.deliveries
        while self._state.lowest_unsettled < self._state.next_tag:
            delivery = deliveries.get(self._state.lowest_unsettled)
            if delivery is not None and not delivery.settled:
                break
            self._state.lowest_unsettled += 1


def pika_properties(message: WireMessage) -> pika.BasicProperties:
    """``message``'s properties as pika takes them."""
    return pika.BasicProperties(
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=message.delivery_mode,
        message_id=message.message_id,
        type=message.type,
        timestamp=message.timestamp,
        headers=dict(message.headers),
    )


class _OneWriteConnection(SelectConnection):
    """A ``SelectConnection`` that sends a message's frames (method, header, body) as
    one buffer, at once when nothing waits to be sent before them.

    pika writes each buffer with a ``send(2)`` of its own, so a confirmed publish
    cost three system calls and three TCP segments for the broker to read (measured,
    single confirmed publishes, A/B in one run: 243 -> 224 us of CPU each). And pika
    sends only when its loop sees the socket writable: a publish cost a watcher
    turned on and off (two ``epoll_ctl``) and, before :meth:`send_buffered`, a turn
    of the loop to send and another to read the confirm.
    These are pika's internals (not in its type stubs): pika is pinned below 2, and
    tests/test_publishing.py fails if the overrides stop taking effect."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._ack_taker: tuple[int, Callable[[int, bool], None]] | None = None
        self._readable_poll: select.poll | None = None
        super().__init__(*args, **kwargs)

    def _output_marshaled_frames(self, marshaled_frames: Sequence[bytes]) -> None:
        # What pika's own method counts, for its statistics.
        self.bytes_sent += sum(len(frame) for frame in marshaled_frames)
        self.frames_sent += len(marshaled_frames)
        data = b"".join(marshaled_frames)  # one frame: the same bytes, not a copy
        transport = self._plain_transport()
        if (
            transport is not None
            and transport._state == transport._STATE_ACTIVE
            and not transport.get_write_buffer_size()  # else it goes behind what waits
        ):
            data = data[_send_now(transport._sock, data) :]
            if not data:
                return
        self._adapter_emit_data(data)  # type: ignore[attr-defined]

    def take_acks(self, channel: int, on_ack: Callable[[int, bool], None]) -> None:
        """Have buffers of nothing but ``basic.ack`` frames of ``channel`` read in one
        step (:func:`~broker_jobs.publish.confirm_frames.read_acks`) and each given to
        ``on_ack(delivery_tag, multiple)``, instead of through pika's frame decoder and
        its callbacks (which still take everything else: nacks, returns, closes)."""
        self._ack_taker = (channel, on_ack)

    def _on_data_available(self, data_in: bytes) -> None:
        taker = self._ack_taker
        if taker is not None and not self._frame_buffer:  # type: ignore[attr-defined]
            channel, on_ack = taker
            acks = read_acks(data_in, channel)
            if acks is not None:
                # What pika counts of what it reads: its heartbeat checker looks at
                # bytes_received to know the broker is alive.
                self.bytes_received += len(data_in)
                self.frames_received += len(acks)
                for tag, multiple in acks:
                    on_ack(tag, multiple)
                return
        with link_lines_dropped():  # a close by the broker: our error says it
            super()._on_data_available(data_in)  # type: ignore[misc]

    def read_directly(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds (or the loop's next timer or queued callback)
        for the socket to be readable, read what it holds, and run what of the loop's
        timers and callbacks is due:
        a turn of the loop without its machinery (a timer of ours added and removed,
        an epoll dispatch, a second ``recv`` to meet EAGAIN). False, having done
        nothing, where the loop must turn: TLS, bytes waiting to be sent, a
        transport not active, or the socket showing more than readability (an
        error, a hang-up), which pika's own handlers meet."""
        transport = self._plain_transport()
        if (
            transport is None
            or transport._state != transport._STATE_ACTIVE
            or transport.get_write_buffer_size()
        ):
            return False
        loop = self.ioloop
        # The loop's next timer, or 0 with callbacks queued (add_callback_threadsafe):
        # pika's own poll bounds its wait so.
        next_timer = loop._get_remaining_interval()  # type: ignore[attr-defined]
        timer_due = next_timer is not None and next_timer <= timeout
        if timer_due:
            timeout = next_timer
        for _fd, events in self._read_poll(transport._sock).poll(max(timeout, 0.0) * 1000):
            if events != select.POLLIN:
                return False
            try:
                data = transport._sock.recv(transport._MAX_RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:  # what pika's reader does with it
                with link_lines_dropped():
                    transport._initiate_abort(error)
                return True
            if not data:  # end of file: pika's reader meets it again, and says so
                return False
            try:
                transport._protocol.data_received(data)
            except Exception as error:  # as pika's reader does: the connection ends
                with link_lines_dropped():
                    transport._initiate_abort(error)
                return True
        if timer_due:  # pika's heartbeat may find the connection gone: our error says so
            with link_lines_dropped():
                loop.process_timeouts()
        return True

    def _read_poll(self, sock: socket.socket) -> select.poll:
        """A poll object watching ``sock`` for reading, made on first use."""
        poll = self._readable_poll
        if poll is None:
            poll = select.poll()
            poll.register(sock.fileno(), select.POLLIN)
            self._readable_poll = poll
        return poll

    def send_frames(self, frames: Sequence[bytes]) -> None:
        """Send frames marshaled already (:func:`~broker_jobs.publish.frames.publish_frames`)
        as pika sends those it marshals."""
        self._output_marshaled_frames(frames)

    @property
    def body_max(self) -> int:
        """The longest body frame's payload, as pika splits a body (after tuning)."""
        length: int = self._body_max_length  # type: ignore[attr-defined]
        return length

    def send_buffered(self) -> None:
        """Send what is buffered now (what the socket did not take at once), without
        a turn of the loop. Plain TCP only (a TLS transport may need a read first);
        anything the socket does not take now waits for the loop's writability
        watcher as before, and an error is left for the loop to meet (pika's own
        handler closes the connection)."""
        transport = self._plain_transport()
        if transport is not None and transport.get_write_buffer_size():
            with link_lines_dropped():  # a lost connection: our WARNING or error says it
                transport._on_socket_writable()  # the loop's own handler for writability

    def _plain_transport(self) -> _AsyncPlaintextTransport | None:
        """The transport when it is plain TCP (none before connecting; a TLS one may
        need a read before a write, so it keeps pika's own path)."""
        transport = getattr(self, "_transport", None)
        return transport if isinstance(transport, _AsyncPlaintextTransport) else None


def _send_now(sock: socket.socket, data: bytes) -> int:
    """Bytes of ``data`` the socket took without waiting: 0 when it would block or
    failed (the rest goes through pika's transport, whose loop meets the error again
    and closes the connection as it always did)."""
    try:
        return sock.send(data)
    except OSError:
        return 0


def _nothing() -> None:
    return None


def _describe(reason: object) -> str:
    return mask_text(str(reason) or type(reason).__name__)
