"""Delayed jobs of ``<ns>.unroutable`` sent on to their task queues.

``<ns>.delay.out`` sends a job it cannot route to ``<ns>.unroutable``
(:mod:`topology.delay`). Two kinds of job land there:

- a job for a task that has no queue: it waits until the task is declared;
- a job the broker released while it was starting. RabbitMQ starts a node's quorum
  queues before it restores the bindings (``rabbit_vhost:recover``), so level 0 can
  dead-letter a job that fell due during the outage before its task queue's binding
  on ``<ns>.delay.out`` is back: the alternate exchange takes it. Seen on RabbitMQ
  4.0.5: 1 of 200 jobs delayed across a restart of a loaded node.

:func:`reroute` makes one pass over the queue (:func:`~broker_jobs.ops.dead_letter_pass.one_pass`,
so nothing is lost and the order of what stays is kept). Each job goes to the work
exchange with the key ``<ns>.delay.out`` would have routed it by (its task, priority
level and shard: :func:`~topology.delay.released_key`), ``mandatory`` and confirmed,
and only then is it acked. A job whose task still has no queue comes back
(``basic.return``) and is moved to the back of ``<ns>.unroutable``: kept. A worker
makes a pass each time it connects and at its looks (:mod:`broker_jobs.worker.rerouting`);
an operator with ``broker-jobs jobs reroute``.

A job sent on is the message as it came, without RabbitMQ's ``x-*`` headers: the
same id, key, attempt and ``bj-due-at`` (past, or under the ladder's early margin,
which the worker waits out). A pass cut short (a lost connection) may leave one job
both sent on and still here: the next pass sends it again, and the worker's claim
runs it once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions

from broker_jobs.amqp.connecting import connect_first_blocking
from broker_jobs.errors import BrokerJobsError
from broker_jobs.ops.dead_letter_message import DeadLetter, rerouted_message
from broker_jobs.ops.dead_letter_pass import (
    NOT_FOUND,
    close_channel,
    depth_of,
    one_pass,
    settled_publish,
    translated,
)
from broker_jobs.publish.pika_link import PikaLink
from broker_jobs.urls import AnyBrokerURLs, BrokerURLs
from topology.delay import released_key
from topology.names import Names

#: Seconds to connect, and to wait for each confirm.
CONNECT_TIMEOUT = 10.0
CONFIRM_TIMEOUT = 10.0
#: What a pass needs of the broker's permissions.
REROUTE_PERMISSIONS = (
    "Sending on unroutable delayed jobs needs read and write permission on"
    " <ns>.unroutable and write permission on the work exchange (broker-jobs topology"
    " permissions --role worker)"
)
#: The key :attr:`Rerouted.kept` counts a message under that is not a delayed job.
NOT_A_LADDER_KEY = ""


@dataclass
class Rerouted:
    """What a pass did: jobs sent on and confirmed, by their key on the work exchange;
    jobs kept in ``queue`` (their task has no queue yet), by the same key
    (:data:`NOT_A_LADDER_KEY` for a message that did not come out of the ladder).
    ``depth``: what the queue held before the pass."""

    queue: str
    moved: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)
    depth: int = 0

    def document(self) -> dict[str, Any]:
        """JSON-ready (``broker-jobs jobs reroute --json``)."""
        return {
            "queue": self.queue,
            "moved": sum(self.moved.values()),
            "kept": sum(self.kept.values()),
            "moved_by_key": dict(sorted(self.moved.items())),
            "kept_by_key": dict(sorted(self.kept.items())),
        }


def reroute(
    urls: AnyBrokerURLs,
    names: Names,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    confirm_timeout: float = CONFIRM_TIMEOUT,
    connection_name: str = "broker-jobs reroute",
    going_on: Callable[[], bool] = lambda: True,
) -> Rerouted:
    """One pass over ``names``' unroutable queue (see the module's docstring). A
    namespace without the queue (declared before it existed) has nothing to send on.
    ``going_on`` False ends the pass before its next message. Raises
    :class:`BrokerConnectionError` for a lost broker, or one that confirms no publish
    (:func:`~broker_jobs.ops.dead_letter_pass.probe_publishing`),
    :class:`AccessRefusedError` for a refusal (permissions), :class:`BrokerJobsError`
    for another; a pass cut short loses nothing."""
    rerouted = Rerouted(names.unroutable_queue)
    urls = BrokerURLs.parse(urls)
    with translated(REROUTE_PERMISSIONS):
        connection, node = connect_first_blocking(
            urls, timeout=connect_timeout, connection_name=connection_name
        )
        try:
            rerouted.depth = _waiting(connection, rerouted.queue)
            if not rerouted.depth:
                return rerouted
            link = PikaLink.connect_first(
                urls.starting_at(node),
                connect_timeout=connect_timeout,
                connection_name=f"{connection_name} (publish)",
            )
            try:
                one_pass(
                    connection.channel(),
                    task=None,  # each message's routing key: the ladder's
                    queue=rerouted.queue,
                    link=link,
                    timeout=confirm_timeout,
                    visit=_Sender(names, rerouted, confirm_timeout).visit,
                    going_on=going_on,
                    back_through=names.unroutable_exchange,  # a fanout: keeps the key
                    # Not through the fanout, which would route a probe to the queue.
                    probe_through=names.work_exchange,
                )
            finally:
                link.close()
        finally:
            if connection.is_open:
                connection.close()
    return rerouted


def _waiting(connection: pika.BlockingConnection, queue: str) -> int:
    """How many messages ``queue`` holds; 0 when it does not exist."""
    channel = connection.channel()
    try:
        return depth_of(channel, queue)
    except pika.exceptions.ChannelClosedByBroker as error:
        if error.reply_code == NOT_FOUND:
            return 0
        raise
    finally:
        close_channel(channel)


@dataclass
class _Sender:
    names: Names
    rerouted: Rerouted
    timeout: float

    def visit(self, letter: DeadLetter, link: PikaLink) -> bool:
        """Send one job on: True once its task queue confirmed it; False to keep it."""
        key = released_key(letter.task)  # read with its routing key as its task
        if key is None:
            self.rerouted.kept[NOT_A_LADDER_KEY] += 1
            return False
        delivery = settled_publish(
            link,
            self.names.work_exchange,
            key,
            rerouted_message(letter),
            self.timeout,
            doing=f"sending a job of {self.rerouted.queue} on to {key}",
            meanwhile="it stays there (and may also have reached its queue: it runs once)",
        )
        if delivery.nacked:
            raise BrokerJobsError(
                f"the broker refused a job of {self.rerouted.queue} sent on to {key}"
                " (basic.nack: a full queue?): it stays there; try again later"
            )
        if delivery.returned:
            self.rerouted.kept[key] += 1
            return False
        self.rerouted.moved[key] += 1
        return True
