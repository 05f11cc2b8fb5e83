"""Connecting aio-pika to the first node of a broker that answers.

Every async client (the worker, :class:`~broker_jobs.AsyncPublisher`, beat) connects
through :func:`connect_first`, so "several broker URLs" means the same everywhere:
the URLs are tried in order (after a loss, starting with the node after the lost
one), each within ``timeout``, and the error names every node and why it failed,
with passwords masked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import aio_pika.abc
import aio_pika.exceptions

from broker_jobs.errors import BrokerConnectionError
from broker_jobs.urls import BrokerURL, BrokerURLs, mask_text

#: What a failed connection attempt raises: the node is down, unreachable, slow,
#: or refuses us (credentials, vhost), which another node may not.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    *aio_pika.exceptions.CONNECTION_EXCEPTIONS,
)


async def connect_first(
    urls: BrokerURLs,
    *,
    timeout: float,
    connection_name: str,
    after: BrokerURL | None = None,
    **options: Any,
) -> tuple[aio_pika.abc.AbstractConnection, BrokerURL]:
    """A connection to the first of ``urls`` that answers (those after ``after``
    first), and the URL it went to; ``options`` go to :func:`aio_pika.connect`.
    Raises :class:`BrokerConnectionError` naming each node tried."""
    failures = []
    for url in urls.after(after):
        try:
            connection = await asyncio.wait_for(
                aio_pika.connect(
                    url.url,
                    timeout=timeout,
                    client_properties={"connection_name": connection_name},
                    **options,
                ),
                timeout,
            )
        except CONNECT_ERRORS as error:
            failures.append(f"{url.host}:{url.port} ({url.masked}): {describe(error)}")
            continue
        return connection, url
    raise BrokerConnectionError(
        "cannot connect to the broker at " + "; ".join(failures) + ". Check that RabbitMQ"
        " runs there and that the credentials and vhost are right"
    )


def describe(error: BaseException) -> str:
    """One line for a connection error: its type and its masked text."""
    text = mask_text(str(error)).strip()
    if isinstance(error, TimeoutError) and not text:
        text = "no answer in time"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
