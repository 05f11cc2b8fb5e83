"""Declare a topology on the broker from broker_jobs, translating errors.

Both publishers use this (the async one in a thread): declaration happens once per
connection, so a short-lived blocking connection costs little and keeps one
implementation of the conflict report.
"""

from __future__ import annotations

import asyncio

import pika
import pika.exceptions

from broker_jobs.errors import BrokerConnectionError, TopologyConflictError, TopologyError
from broker_jobs.urls import BrokerURL, mask_text
from topology import DeclareReport, Names, Topology, declare, ladder_topology
from topology import TopologyConflictError as _TopologyConflict

#: AMQP reply code for a missing exchange or queue.
NOT_FOUND = 404
#: Seconds a daemon (worker, beat) allows for declaring its topology at start-up.
DAEMON_DECLARE_TIMEOUT = 10.0


def blocking_connection(
    url: BrokerURL, *, timeout: float, connection_name: str
) -> pika.BlockingConnection:
    """A pika blocking connection, or :class:`BrokerConnectionError` naming the host."""
    parameters = pika.URLParameters(url.url)
    parameters.connection_attempts = 1
    parameters.socket_timeout = timeout
    parameters.stack_timeout = timeout
    parameters.blocked_connection_timeout = timeout
    parameters.client_properties = {"connection_name": connection_name}
    try:
        return pika.BlockingConnection(parameters)
    except pika.exceptions.AMQPError as error:
        raise BrokerConnectionError(
            f"cannot connect to the broker at {url.host}:{url.port} ({url.masked}):"
            f" {type(error).__name__} {mask_text(str(error))}."
            " Check that RabbitMQ runs there and that the"
            " credentials and vhost are right"
        ) from None


def declare_topology(
    url: BrokerURL, topology: Topology, *, timeout: float, connection_name: str
) -> DeclareReport:
    connection = blocking_connection(url, timeout=timeout, connection_name=connection_name)
    try:
        return declare(connection, topology)
    except _TopologyConflict as error:
        raise TopologyConflictError(str(error), error.conflicts) from None
    except pika.exceptions.AMQPChannelError as error:
        raise TopologyError(
            "the broker refused to declare the topology:"
            f" {mask_text(str(error))}. The user may lack configure permission: declare it"
            " as an operator and pass declare=False"
        ) from None
    except pika.exceptions.AMQPConnectionError as error:
        raise BrokerConnectionError(
            f"the connection to {url.masked} broke while declaring the topology:"
            f" {mask_text(str(error))}"
        ) from None
    finally:
        if connection.is_open:
            connection.close()


async def declare_at_start(url: BrokerURL, topology: Topology, daemon: str) -> DeclareReport:
    """A daemon's declaration at start-up, off its event loop (pika blocks);
    ``daemon`` names it in the broker's connection list."""
    return await asyncio.to_thread(
        declare_topology,
        url,
        topology,
        timeout=DAEMON_DECLARE_TIMEOUT,
        connection_name=f"{daemon} (declare)",
    )


def prepare_ladder(
    url: BrokerURL,
    names: Names,
    tasks: set[str],
    *,
    declare_ladder: bool,
    timeout: float,
    connection_name: str,
) -> set[str]:
    """Declare the delay ladder (``declare_ladder``) and return the tasks of
    ``tasks`` that have no queue.

    A delayed job is routable when published (it enters the ladder) whether or not
    its task has a queue; without one it would wait in the ladder's last level
    forever. So a publisher checks the queue first, and raises at the caller.
    """
    if declare_ladder:
        declare_topology(
            url, ladder_topology(names), timeout=timeout, connection_name=connection_name
        )
    connection = blocking_connection(url, timeout=timeout, connection_name=connection_name)
    try:
        return {task for task in tasks if not _queue_exists(connection, names.task_queue(task))}
    finally:
        if connection.is_open:
            connection.close()


def existing_queues(url: BrokerURL, queues: list[str], *, connection_name: str) -> list[str]:
    """Those of ``queues`` that exist (passive declares need no permission)."""
    connection = blocking_connection(
        url, timeout=DAEMON_DECLARE_TIMEOUT, connection_name=connection_name
    )
    try:
        return [queue for queue in queues if _queue_exists(connection, queue)]
    finally:
        if connection.is_open:
            connection.close()


def _queue_exists(connection: pika.BlockingConnection, queue: str) -> bool:
    # A passive declare of a missing queue closes the channel: one channel each.
    channel = connection.channel()
    try:
        channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as error:
        if error.reply_code == NOT_FOUND:
            return False
        raise
    channel.close()
    return True
