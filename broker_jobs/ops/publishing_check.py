"""Whether the broker takes publishes now: the line of ``broker-jobs status`` that
says so.

A broker under a memory or disk alarm blocks every connection that publishes, and
nothing an operator's passive declares read shows it: the queues look as they were
while publishers wait, workers hold their retries and dead letters, and the
dead-letter commands refuse to take anything. So ``status`` makes two publishes that
no queue takes (:func:`~broker_jobs.ops.dead_letter_pass.probe_publishing`, through
the default exchange) on a connection of its own, and says what the broker answered:
both confirmed, or none in time, with the reason of the broker's
``connection.blocked`` (``low on memory``, ``low on disk``) when it sent one.

The check has a connection of its own because a blocked connection is not read from
any more: the report's passive declares would wait behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pika.exceptions

from broker_jobs.errors import BrokerConnectionError
from broker_jobs.ops.dead_letter_pass import ACCESS_REFUSED, probe_publishing
from broker_jobs.publish.pika_link import PikaLink
from broker_jobs.urls import AnyBrokerURLs, BrokerURLs

#: Seconds to wait for the probes' confirms: a broker that takes publishes answers in
#: milliseconds; one under an alarm never does, and ``status`` waits this long.
CONFIRM_TIMEOUT = 2.0
CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class Publishing:
    """What the broker did with two probes. ``accepted`` None: it could not be asked
    (``why`` says why: no permission to publish, a lost connection)."""

    accepted: bool | None
    #: The reason of the broker's ``connection.blocked`` (``low on memory``), if sent.
    blocked_reason: str | None = None
    why: str | None = None

    def document(self) -> dict[str, Any]:
        """JSON-ready (``broker-jobs status --json``, ``publishing``)."""
        return {"accepted": self.accepted, "blocked_reason": self.blocked_reason, "why": self.why}


def check_publishing(
    urls: AnyBrokerURLs,
    *,
    confirm_timeout: float = CONFIRM_TIMEOUT,
    connect_timeout: float = CONNECT_TIMEOUT,
    connection_name: str = "broker-jobs status (publishing check)",
) -> Publishing:
    """Ask the first node of ``urls`` that answers whether it takes publishes (see the
    module's docstring). Never raises for the broker's answer; a node that cannot be
    reached raises :class:`BrokerConnectionError`, as connecting does."""
    link = PikaLink.connect_first(
        BrokerURLs.parse(urls), connect_timeout=connect_timeout, connection_name=connection_name
    )
    try:
        probe_publishing(link, "", confirm_timeout, before="reporting the broker's state")
    except BrokerConnectionError as error:
        return _failed(link, error)
    finally:
        link.close()
    return Publishing(accepted=True)


def _failed(link: PikaLink, error: BrokerConnectionError) -> Publishing:
    closed = link.closed_reason
    if (
        isinstance(closed, pika.exceptions.ChannelClosedByBroker)
        and closed.reply_code == ACCESS_REFUSED
    ):
        return Publishing(
            accepted=None,
            why="this user may not publish to the default exchange (write on amq.default),"
            " so whether the broker takes publishes is not known",
        )
    if link.blocked_reason is not None or link.is_open:  # no answer on an open link
        return Publishing(accepted=False, blocked_reason=link.blocked_reason)
    return Publishing(accepted=None, why=str(error))
