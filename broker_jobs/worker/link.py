"""The worker's link to the broker, kept up for as long as the worker runs.

A worker must never be alive and idle: when its connection or channel is lost (a
node killed or stopped, missed heartbeats, a network cut, a channel closed by the
broker) it connects again, to the first node that answers (the lost one last), with
pauses that grow from :data:`FIRST_DELAY` to ``reconnect_max_delay`` seconds, each
drawn in its upper half (jitter, so that a fleet of workers does not reconnect in
step). It logs one WARNING when the link is lost, a reminder every
``still_trying_every`` seconds while it is down, and one INFO line with the
outage's length when it is back; after ``reconnect_timeout`` seconds without a
broker it raises :class:`~broker_jobs.errors.ReconnectTimeoutError`, whose exit code
tells a supervisor to restart the worker.

Work that must reach the broker (a retry, a dead letter) waits for the link with
:meth:`BrokerLink.wait_up`: it is published, confirmed, on the next connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterator

import aio_pika.abc

from broker_jobs.amqp.connecting import connect_first
from broker_jobs.errors import BrokerConnectionError, BrokerJobsError, ReconnectTimeoutError
from broker_jobs.observe.link_metrics import LinkMetrics
from broker_jobs.urls import BrokerURL, BrokerURLs
from broker_jobs.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

#: Seconds before the first reconnection attempt after a loss.
FIRST_DELAY = 0.1
#: Seconds a node gets to answer a connection attempt.
CONNECT_TIMEOUT = 10.0


class LinkStoppedError(BrokerJobsError):
    """The worker is stopping while the broker is away: work waiting for the link
    gives up (and leaves its delivery to be redelivered)."""


class BrokerLink:
    """Connects, notices losses, reconnects; :meth:`wait_up` for the live channel."""

    def __init__(
        self,
        urls: BrokerURLs,
        *,
        name: str,
        settings: WorkerSettings,
        stopping: asyncio.Event,
        rng: random.Random | None = None,
        metrics: LinkMetrics | None = None,
    ) -> None:
        self._urls = urls
        #: Told where the link's WARNING and INFO lines are logged (connected, lost, back).
        self._metrics = metrics
        self._name = name
        self._settings = settings
        self._stopping = stopping
        self._rng = rng or random.Random()
        self._url: BrokerURL | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._up = asyncio.Event()
        #: Loop time the current outage began (None while up, or before the first link).
        self._down_since: float | None = None
        #: When the outage was last logged.
        self._reminded_at = 0.0
        self._connected_once = False
        #: The next pause between attempts (seconds).
        self._delay = FIRST_DELAY
        #: Pause before the next attempt: the last connection could not consume.
        self._pause_first = False

    @property
    def url(self) -> BrokerURL:
        """The node connected to (or last connected to); the first before any."""
        return self._url or self._urls.first

    @property
    def is_up(self) -> bool:
        return self._up.is_set()

    @property
    def urls(self) -> BrokerURLs:
        return self._urls

    async def connect(self) -> aio_pika.abc.AbstractConnection | None:
        """A new connection, trying until one is made; None if the worker is asked to
        stop meanwhile. Raises :class:`ReconnectTimeoutError` past the timeout."""
        while not self._stopping.is_set():
            if self._pause_first:  # the last connection could not consume
                self._pause_first = False
                await self._back_off()
                continue
            try:
                connection, self._url = await connect_first(
                    self._urls, after=self._url, timeout=CONNECT_TIMEOUT, connection_name=self._name
                )
            except BrokerConnectionError as error:
                self._failed(str(error), "no broker")
                await self._back_off()
                continue
            return connection
        return None

    def could_not_consume(self, cause: str) -> None:
        """A connection was made but consuming on it failed (a broker still starting,
        a channel error): the next :meth:`connect` pauses first, so that a broker that
        accepts connections but not consumers is not hammered."""
        self._failed(cause, "cannot consume")
        self._pause_first = True

    def _failed(self, cause: str, what: str) -> None:
        """Log the first failure of an outage and a reminder every
        ``still_trying_every`` seconds; raise past the reconnect timeout."""
        now = asyncio.get_running_loop().time()
        if self._down_since is None:  # the worker starts with no broker
            self._down_since = self._reminded_at = now
            log.warning("%s yet at %s: %s; %s", what, self.url, cause, self._how_long())
        elif now - self._reminded_at >= self._settings.still_trying_every:
            self._reminded_at = now
            log.warning(
                "%s after %.0f s at %s: %s; trying again", what, now - self._down_since,
                self.url, cause,
            )  # fmt: skip
        timeout = self._settings.reconnect_timeout
        if timeout is not None and now - self._down_since >= timeout:
            raise ReconnectTimeoutError(
                f"no broker for {now - self._down_since:.0f} s (--reconnect-timeout"
                f" {timeout:g}): {cause}"
            )

    def _how_long(self) -> str:
        """How long the worker goes on trying, for the outage's first line: a worker
        that waits for ever (a --burst run in CI, say) must say how to make it stop."""
        timeout = self._settings.reconnect_timeout
        if timeout is None:
            return (
                f"trying again for as long as it takes (said every"
                f" {self._settings.still_trying_every:g} s; --reconnect-timeout SECONDS"
                " makes the worker exit with code 75 instead)"
            )
        return f"trying again for up to {timeout:g} s (--reconnect-timeout), then exiting 75"

    async def _back_off(self) -> None:
        """Pause before the next attempt: the pauses double up to the cap, each drawn
        in its upper half, and never past the reconnect timeout."""
        pause = self._rng.uniform(self._delay / 2, self._delay)
        timeout = self._settings.reconnect_timeout
        if timeout is not None and self._down_since is not None:
            left = self._down_since + timeout - asyncio.get_running_loop().time()
            pause = min(pause, max(0.0, left))
        await self._pause(pause)
        self._delay = min(self._delay * 2, self._settings.reconnect_max_delay)

    def established(self, channel: aio_pika.abc.AbstractChannel) -> None:
        """The new connection consumes again; ``channel`` takes confirmed publishes."""
        self._channel = channel
        if self._down_since is not None and self._connected_once:
            outage = asyncio.get_running_loop().time() - self._down_since
            log.info("broker link back at %s after %.1f s without it", self.url, outage)
            if self._metrics is not None:
                self._metrics.back(outage)
        elif self._metrics is not None:
            self._metrics.connected()
        self._down_since = None
        self._connected_once = True
        self._delay = FIRST_DELAY
        self._up.set()

    def lost(self, cause: str) -> None:
        """The connection or its channel is gone (logged once per outage)."""
        if not self._up.is_set():
            return
        self._up.clear()
        self._channel = None
        self._down_since = self._reminded_at = asyncio.get_running_loop().time()
        log.warning("lost the broker at %s: %s; reconnecting", self.url, cause)
        if self._metrics is not None:
            self._metrics.lost()

    async def wait_up(self) -> aio_pika.abc.AbstractChannel:
        """The live channel, once the link is up; :class:`LinkStoppedError` if the
        worker is asked to stop while it is down."""
        while not self._up.is_set():
            if self._stopping.is_set():
                raise LinkStoppedError("the worker is stopping and the broker is away")
            up = asyncio.ensure_future(self._up.wait())
            stop = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({up, stop}, return_when=asyncio.FIRST_COMPLETED)
            up.cancel()
            stop.cancel()
        assert self._channel is not None  # set whenever the link is up
        return self._channel

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the worker is asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)


class ExpectedDisconnects(logging.Filter):
    """Drops aiormq's own lines about a lost connection (a traceback at WARNING, an
    ERROR per refused attempt) and about a consumer the broker cancelled: the link
    logs each of these once, in one line, with the cause and the masked URL."""

    #: The beginnings of aiormq's messages (their format strings) that are dropped.
    EXPECTED = (
        "Cancelling cause reader exited abnormally",
        "error when creating transport",
        "Consumer %r cancelled by the broker",
    )
    #: The loggers they come from.
    LOGGERS = ("aiormq.connection", "aiormq.channel")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.EXPECTED))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """While the worker runs (not at import: other users of aiormq keep its lines)."""
        loggers = [logging.getLogger(name) for name in self.LOGGERS]
        for logger in loggers:
            logger.addFilter(self)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeFilter(self)
