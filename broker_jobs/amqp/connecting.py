"""Connecting to the first node of a broker that answers.

Every client connects through this module, so "several broker URLs" means the same
everywhere: the URLs are tried in order (after a loss, starting with the node after
the lost one), each within ``timeout``, and the error names every node and why it
failed, with passwords masked.

- :func:`connect_first`: aio-pika (the worker, :class:`~broker_jobs.AsyncPublisher`,
  beat).
- :func:`connect_first_blocking`: a pika ``BlockingConnection`` (declaring, the
  operator's commands).
- :func:`first_answering`: any other single-node connect (the sync publisher's
  :class:`~broker_jobs.publish.pika_link.PikaLink`) that raises :class:`NodeUnreachable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq.abc
import pika
import pika.exceptions
from pika.adapters.utils import connection_workflow as workflow

from broker_jobs.amqp.driver_logs import connect_lines_dropped
from broker_jobs.amqp.tls import pika_parameters
from broker_jobs.errors import BrokerUnreachableError
from broker_jobs.urls import AnyBrokerURLs, BrokerURL, BrokerURLs, mask_text

log = logging.getLogger(__name__)
T = TypeVar("T")

#: What a failed connection attempt raises: the node is down, unreachable, slow,
#: or refuses us (credentials, vhost), which another node may not.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    *aio_pika.exceptions.CONNECTION_EXCEPTIONS,
)
#: The same for pika's ``BlockingConnection`` (a host name that does not resolve
#: comes out of it as the resolver's ``socket.gaierror``, an OSError).
BLOCKING_CONNECT_ERRORS: tuple[type[BaseException], ...] = (pika.exceptions.AMQPError, OSError)


class NodeUnreachable(BrokerUnreachableError):
    """One node did not answer. Raised by single-node connects; :func:`first_answering`
    goes on to the next node, and names them all if none answers."""

    def __init__(self, url: BrokerURL, reason: object) -> None:
        self.url = url
        self.line = node_failure(url, reason)
        super().__init__(unreachable_message([self.line]))


class Connection(aio_pika.Connection):
    """aio-pika's connection, without its warning after a broker restart.

    aio-pika's ``__del__`` schedules the close of a connection it finds unclosed (a
    failed connect, or one whose broker went away: a lost connection is not marked
    closed), creating the coroutine before it knows whether an event loop runs in
    that thread. The garbage collector runs in whichever thread allocates (a ledger
    or declare thread of ours, the user's own), so the coroutine is never awaited
    and Python warns "coroutine 'Connection.close' was never awaited". Here a failed
    connect closes itself, and a collection outside the connection's loop leaves the
    transport to close with its socket."""

    async def connect(self, timeout: aiormq.abc.TimeoutType = None) -> None:
        try:
            await super().connect(timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.close()  # before a transport exists: no I/O, it only marks it
            raise

    def __del__(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is getattr(self, "loop", None):
            super().__del__()


async def connect_first(
    urls: AnyBrokerURLs,
    *,
    timeout: float,
    connection_name: str,
    after: BrokerURL | None = None,
    **options: Any,
) -> tuple[aio_pika.abc.AbstractConnection, BrokerURL]:
    """A connection to the first of ``urls`` that answers (those after ``after``
    first), and the URL it went to; ``options`` go to :func:`aio_pika.connect`.
    Raises :class:`BrokerUnreachableError` naming each node tried."""
    failures: list[str] = []
    for url in BrokerURLs.parse(urls).after(after):
        try:
            with connect_lines_dropped():
                connection = await asyncio.wait_for(
                    aio_pika.connect(
                        url.url,
                        timeout=timeout,
                        client_properties={"connection_name": connection_name},
                        connection_class=Connection,
                        **options,
                    ),
                    timeout,
                )
        except CONNECT_ERRORS as error:
            failures.append(node_failure(url, error))
            continue
        _log_skipped(failures, url)
        return connection, url
    raise BrokerUnreachableError(unreachable_message(failures))


def connect_first_blocking(
    urls: AnyBrokerURLs,
    *,
    timeout: float,
    connection_name: str,
    after: BrokerURL | None = None,
) -> tuple[pika.BlockingConnection, BrokerURL]:
    """The pika twin of :func:`connect_first`: a ``BlockingConnection`` to the first
    of ``urls`` that answers, and its URL; same order, same error."""
    return first_answering(
        urls,
        lambda url: _blocking_connection(url, timeout, connection_name),
        after=after,
    )


def first_answering(
    urls: AnyBrokerURLs, connect: Callable[[BrokerURL], T], *, after: BrokerURL | None = None
) -> tuple[T, BrokerURL]:
    """``connect(url)`` for each of ``urls`` in turn (those after ``after`` first)
    until one does not raise :class:`NodeUnreachable`: its result and URL. Raises
    :class:`BrokerUnreachableError` naming each node tried."""
    failures: list[str] = []
    for url in BrokerURLs.parse(urls).after(after):
        try:
            with connect_lines_dropped():
                connected = connect(url)
        except NodeUnreachable as error:
            failures.append(error.line)
            continue
        _log_skipped(failures, url)
        return connected, url
    raise BrokerUnreachableError(unreachable_message(failures))


def _blocking_connection(
    url: BrokerURL, timeout: float, connection_name: str
) -> pika.BlockingConnection:
    parameters = pika_parameters(url.url)
    parameters.connection_attempts = 1
    parameters.socket_timeout = timeout
    parameters.stack_timeout = timeout
    parameters.blocked_connection_timeout = timeout
    parameters.client_properties = {"connection_name": connection_name}
    try:
        return pika.BlockingConnection(parameters)
    except BLOCKING_CONNECT_ERRORS as error:
        raise NodeUnreachable(url, error) from None


def node_failure(url: BrokerURL, reason: object) -> str:
    """``host:port (masked URL): why``, one node's part of a connection error."""
    why = describe(reason, url) if isinstance(reason, BaseException) else mask_text(str(reason))
    return f"{url.host}:{url.port} ({url.masked}): {why}"


def unreachable_message(failures: list[str]) -> str:
    return "cannot connect to the broker at " + "; ".join(failures)


def describe(error: BaseException, url: BrokerURL | None = None) -> str:
    """One line for a connection error that tells apart what an operator fixes
    differently: nothing listening, a refused login, a vhost that is missing or
    forbidden, no answer in time, a host name that does not resolve; else the error's
    type and masked text."""
    error = _innermost(error)
    if isinstance(error, socket.gaierror):
        host = f" {url.host!r}" if url is not None else ""
        return f"the host name{host} does not resolve ({error.strerror}): check the URL's host"
    text = mask_text(str(error)).strip()
    kind = type(error).__name__
    detail = f"{text} {mask_text(repr(error))}"  # pika keeps the cause in its repr only
    if "ACCESS_REFUSED" in text or kind == "ProbableAuthenticationError":
        user = f" for user {url.user!r}" if url is not None and url.user else ""
        return f"login refused{user} (ACCESS_REFUSED): check the user and password in the URL"
    if (
        "NOT_ALLOWED" in text
        or kind == "ProbableAccessDeniedError"
        or ("Connection.OpenOk" in text and "Connection.Close" in text)  # aiormq's words
    ):
        vhost = f" {url.vhost!r}" if url is not None else ""
        return (
            f"the broker refused the vhost{vhost} (NOT_ALLOWED): it does not exist or the"
            " user has no permissions on it; create it (rabbitmqctl add_vhost), grant them"
            " (rabbitmqctl set_permissions), or fix the URL's path (amqp://host/ is the"
            " default vhost /)"
        )
    if "Connection refused" in detail or "Connect call failed" in detail:
        return "connection refused: nothing listens there (is RabbitMQ running, on this port?)"
    if isinstance(error, TimeoutError) and not text:
        return "no answer in time (a firewall, a wrong host, or a broker too busy to answer)"
    return f"{kind}: {text}" if text else kind


def _innermost(error: BaseException) -> BaseException:
    """What failed under pika's connection workflow, which wraps it twice
    (``AMQPConnectionWorkflowFailed``, then one ``AMQPConnector...Error`` per attempt),
    with only the wrappers' type names as their text."""
    if isinstance(error, workflow.AMQPConnectionWorkflowFailed) and error.exceptions:
        error = error.exceptions[-1]
    if isinstance(error, workflow.AMQPConnectorPhaseErrorBase):
        cause: object = error.exception
        if isinstance(cause, BaseException):
            return cause
    return error


def _log_skipped(failures: list[str], url: BrokerURL) -> None:
    if failures:
        log.warning("connected to %s; no answer from %s", url.masked, "; ".join(failures))
