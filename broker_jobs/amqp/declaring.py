"""Declare a topology on the broker from broker_jobs, translating errors.

Both publishers use this (the async one in a thread): declaration happens once per
connection, so a short-lived blocking connection costs little and keeps one
implementation of the conflict report. Each function takes the broker's URLs
(anything :meth:`BrokerURLs.parse` takes) and connects to the first node that
answers (:func:`~broker_jobs.amqp.connecting.connect_first_blocking`).
"""

from __future__ import annotations

import asyncio

import pika
import pika.exceptions

from broker_jobs.amqp.connecting import connect_first_blocking
from broker_jobs.errors import BrokerConnectionError, TopologyConflictError, TopologyError
from broker_jobs.urls import AnyBrokerURLs, mask_text
from topology import DeclareReport, Names, Topology, declare, ladder_topology
from topology import TopologyConflictError as _TopologyConflict

#: AMQP reply code for a missing exchange or queue.
NOT_FOUND = 404
#: Seconds a daemon (worker, beat) allows for declaring its topology at start-up.
DAEMON_DECLARE_TIMEOUT = 10.0


def declare_topology(
    urls: AnyBrokerURLs, topology: Topology, *, timeout: float, connection_name: str
) -> DeclareReport:
    connection, url = connect_first_blocking(
        urls, timeout=timeout, connection_name=connection_name
    )
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


async def declare_at_start(urls: AnyBrokerURLs, topology: Topology, daemon: str) -> DeclareReport:
    """A daemon's declaration at start-up, off its event loop (pika blocks), on the
    first of ``urls`` that answers; ``daemon`` names it in the broker's connection
    list."""
    return await asyncio.to_thread(
        declare_topology,
        urls,
        topology,
        timeout=DAEMON_DECLARE_TIMEOUT,
        connection_name=f"{daemon} (declare)",
    )


def prepare_ladder(
    urls: AnyBrokerURLs,
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
    its task has a queue; without one it would end in the namespace's queue of
    unroutable jobs (``<ns>.unroutable``), not run. So a publisher checks the queue
    first, and raises at the caller.
    """
    if declare_ladder:
        declare_topology(
            urls, ladder_topology(names), timeout=timeout, connection_name=connection_name
        )
    connection, _ = connect_first_blocking(
        urls, timeout=timeout, connection_name=connection_name
    )
    try:
        return {task for task in tasks if not _queue_exists(connection, names.task_queue(task))}
    finally:
        if connection.is_open:
            connection.close()


def existing_queues(
    urls: AnyBrokerURLs, queues: list[str], *, connection_name: str
) -> list[str]:
    """Those of ``queues`` that exist (passive declares need no permission), asked
    of the first of ``urls`` that answers."""
    connection, _ = connect_first_blocking(
        urls, timeout=DAEMON_DECLARE_TIMEOUT, connection_name=connection_name
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
