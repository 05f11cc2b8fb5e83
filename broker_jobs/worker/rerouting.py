"""A worker sends the delayed jobs of ``<ns>.unroutable`` on, each time it connects.

A broker that restarts can release a delayed job before its task queue's binding is
back, and the job waits in ``<ns>.unroutable`` (:mod:`broker_jobs.ops.unroutable`).
The worker that connects again after the restart is the one that notices, so each
connection of the worker starts one pass (:func:`~broker_jobs.ops.unroutable.reroute`)
in a thread of its own; the worker consumes meanwhile. A node of a cluster can
restart without the worker losing its connection, so the worker also looks every
:data:`LOOK_EVERY` seconds (a passive declare on a channel of its own connection:
no connection opened, nothing in the broker's log) and makes a pass when the queue
holds another number of messages than its last pass kept there.

A pass at a connection is made only when the queue holds a message (its depth read
on the worker's connection), so the usual empty queue costs no connection.

A pass takes at most :data:`PASS_LIMIT` messages: jobs whose task has no queue are
moved to the back at each pass, and a long queue of them must not cost a worker
minutes at each connection. The lines: what was sent on (INFO); jobs kept for a
task without a queue (a WARNING when that count changes, so one line per change,
not one per connection); a refusal (a WARNING, once: the worker's user may not
read the queue, and the worker tries again only when it connects again, not at its
looks); another failure (a WARNING when they start, an INFO when a pass works again:
:class:`~broker_jobs.observe.failure_streak.FailureStreak`); a lost connection, or a
broker that confirms no publish now (DEBUG: the worker's link and its publishes say so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import aio_pika.abc
import aio_pika.exceptions

from broker_jobs.errors import AccessRefusedError, BrokerConnectionError
from broker_jobs.observe.failure_streak import FailureStreak
from broker_jobs.ops.unroutable import Rerouted, reroute
from broker_jobs.plural import plural
from broker_jobs.urls import BrokerURLs
from topology.names import Names

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The most messages one pass of a worker reads.
PASS_LIMIT = 1000
#: Seconds between a worker's looks at the queue while it is connected.
LOOK_EVERY = 60.0
#: The longest a stopping worker waits for a pass to end.
CLOSE_WAIT = 5.0
#: What a look meets when the worker's connection fails under it.
LOOK_FAILED: tuple[type[Exception], ...] = (
    aio_pika.exceptions.AMQPError,
    ConnectionError,
    TimeoutError,
    RuntimeError,  # a channel asked of a connection closing meanwhile
)


class Rerouting:
    """The passes of one worker: :meth:`connected` at each connection,
    :meth:`look_forever` meanwhile, :meth:`close` when the worker stops."""

    def __init__(self, names: Names, worker_id: str) -> None:
        self._names = names
        self._worker_id = worker_id
        self._pass: asyncio.Task[None] | None = None
        self._closing = False
        #: The worker's live connection and its nodes, for the looks.
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._urls: BrokerURLs | None = None
        #: What the last pass kept: a look makes a pass only when that changed.
        self._kept_last = 0
        self._refusal_said = False
        #: Another failure (a broker still starting, say): said once, and its end.
        self._failures = FailureStreak(log)

    def connected(self, connection: aio_pika.abc.AbstractConnection, urls: BrokerURLs) -> None:
        """The worker consumes on ``connection`` (its node first in ``urls``): a pass,
        if the queue holds anything (read on ``connection``: an empty queue, the usual
        case, costs no connection of the pass's own)."""
        self._connection, self._urls = connection, urls
        self._start(urls, look_first=True)

    async def look_forever(self) -> None:
        """A look every :data:`LOOK_EVERY` seconds, until cancelled."""
        while True:
            await asyncio.sleep(LOOK_EVERY)
            await self.look()

    async def look(self) -> None:
        """The queue's depth; a pass when it is not what the last pass kept there.
        Nothing while the worker has no connection (its next one makes a pass), or
        after a refusal (only its connections try again)."""
        connection, urls = self._connection, self._urls
        if connection is None or connection.is_closed or urls is None or self._refusal_said:
            return
        depth = await self._depth(connection)
        if self._refusal_said:  # a pass refused while this look read the depth
            return
        if depth is not None and depth not in {0, self._kept_last}:
            self._start(urls)

    async def close(self) -> None:
        """End a running pass before its next message, and wait for it, at most
        :data:`CLOSE_WAIT` seconds: a pass whose broker stopped answering (a network
        black hole) blocks in pika until its heartbeat gives up, and the worker's
        stop must not wait for that. Its thread is a daemon; what it leaves is safe
        (an unacked message goes back to the queue, a job both sent on and still
        there runs once)."""
        self._closing = True
        if self._pass is None or self._pass.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._pass), CLOSE_WAIT)
        except TimeoutError:
            log.info(
                "leaving a pass over %s unfinished: the broker does not answer (nothing is"
                " lost: the next pass takes up what it left)",
                self._names.unroutable_queue,
            )
            # Its task, not its thread: cancelled, so that it is not left pending as
            # the worker's loop ends.
            self._pass.cancel()
            await asyncio.wait({self._pass}, timeout=CLOSE_WAIT)

    def _start(self, urls: BrokerURLs, *, look_first: bool = False) -> None:
        """A pass on the first of ``urls`` that answers, unless one still runs (what
        arrived meanwhile waits for the next look); ``look_first``: only if the queue
        holds anything."""
        if self._closing or (self._pass is not None and not self._pass.done()):
            return
        self._pass = asyncio.create_task(
            self._run(urls, look_first=look_first), name="reroute unroutable jobs"
        )

    async def _depth(self, connection: aio_pika.abc.AbstractConnection) -> int | None:
        """The queue's depth (0 when it does not exist), on a channel of its own: a
        passive declare of a missing queue closes its channel. None: the connection
        failed meanwhile (the worker's link says so)."""
        try:
            channel = await connection.channel()
        except LOOK_FAILED:
            return None
        try:
            queue = await channel.declare_queue(self._names.unroutable_queue, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return 0
        except LOOK_FAILED:
            return None
        finally:
            if not channel.is_closed:
                with contextlib.suppress(*LOOK_FAILED):
                    await channel.close()
        return queue.declaration_result.message_count or 0

    async def _run(self, urls: BrokerURLs, *, look_first: bool) -> None:
        if look_first and not await self._holds_any():
            return
        read = 0

        def going_on() -> bool:
            nonlocal read
            read += 1
            return not self._closing and read <= PASS_LIMIT

        try:
            rerouted = await in_daemon_thread(lambda: self._reroute(urls, going_on))
        except BrokerConnectionError as error:
            log.debug("sending on the jobs of %s stopped: %s", self._names.unroutable_queue, error)
        except AccessRefusedError as error:
            self._refused(error)
        except Exception as error:  # a pass must never take the worker down
            log.debug("the pass over %s failed", self._names.unroutable_queue, exc_info=True)
            self._failures.failed(
                "sending on the jobs of %s failed (tried again at the next look): %s: %s",
                self._names.unroutable_queue,
                type(error).__name__,
                error,
            )
        else:
            self._failures.worked(
                "sending on the jobs of %s works again", self._names.unroutable_queue
            )
            self._say(rerouted)

    async def _holds_any(self) -> bool:
        """Whether the queue holds a message, read on the worker's connection; False
        when that failed (the worker's next connection looks again)."""
        connection = self._connection
        depth = None if connection is None else await self._depth(connection)
        if depth == 0:
            self._kept_last = 0  # emptied since (an operator's reroute, a purge)
        return bool(depth)

    def _reroute(self, urls: BrokerURLs, going_on: Callable[[], bool]) -> Rerouted:
        return reroute(
            urls,
            self._names,
            connection_name=f"broker-jobs worker {self._worker_id} (reroute)",
            going_on=going_on,
        )

    def _refused(self, error: AccessRefusedError) -> None:
        """Said once: the worker's user may not read the queue (its permissions)."""
        if not self._refusal_said:
            self._refusal_said = True
            log.warning(
                "worker %s cannot send on the delayed jobs of %s: %s",
                self._worker_id,
                self._names.unroutable_queue,
                error,
            )

    def _say(self, rerouted: Rerouted) -> None:
        moved = sum(rerouted.moved.values())
        if moved:
            log.info(
                "sent on %s from %s to their task queues (%s): the broker released them"
                " before their queues' bindings were back, or their tasks were declared since",
                plural(moved, "delayed job"),
                rerouted.queue,
                ", ".join(f"{key}: {count}" for key, count in sorted(rerouted.moved.items())),
            )
        kept, before = sum(rerouted.kept.values()), self._kept_last
        self._kept_last = kept
        if kept and kept != before:
            keys = ", ".join(
                f"{key or 'not from the ladder'}: {count}"
                for key, count in sorted(rerouted.kept.items())
            )
            log.warning(
                "%s in %s for tasks without a queue (%s): declare the task, then"
                " `broker-jobs jobs reroute --namespace %s`",
                plural(kept, "delayed job waits", "delayed jobs wait"),
                rerouted.queue,
                keys,
                self._names.namespace,
            )


async def in_daemon_thread(call: Callable[[], T]) -> T:
    """``call()`` in a daemon thread of its own: unlike ``asyncio.to_thread`` (the
    loop's executor, whose threads the interpreter joins at exit), a call blocked on
    a silent broker cannot keep the process from exiting."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not done.done():  # not cancelled meanwhile
            outcome()

    def run() -> None:
        try:
            result = call()
        except BaseException as error:  # handed to the awaiting task
            failed = error
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, lambda: done.set_exception(failed))
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, lambda: done.set_result(result))

    threading.Thread(target=run, name="broker-jobs reroute", daemon=True).start()
    return await done
