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

from broker_jobs.errors import BrokerConnectionError, BrokerJobsError
from broker_jobs.ops.dead_letter_pass import ACCESS_REFUSED, probe_publishing
from broker_jobs.publish.pika_link import PikaLink
from broker_jobs.urls import AnyBrokerURLs, BrokerURLs, mask_text

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
    """Ask the first node of ``urls`` that answers whether it takes publishes, on a
    connection opened for it (see the module's docstring). Never raises: a node that
    cannot be reached is ``accepted`` None, with why."""
    watch = PublishingWatch(
        urls,
        confirm_timeout=confirm_timeout,
        connect_timeout=connect_timeout,
        connection_name=connection_name,
    )
    try:
        return watch.check()
    finally:
        watch.close()


class PublishingWatch:
    """:func:`check_publishing` again and again on one connection, kept open between
    checks (the exporter's polls), so that the broker's log does not show a connection
    opened and closed at each. A connection the broker blocked stays blocked until the
    alarm clears (RabbitMQ reads nothing from it, and sends ``connection.unblocked``
    then): a check meanwhile reports it blocked without another probe. A connection
    lost or refused is opened afresh at the next check. Not thread-safe."""

    def __init__(
        self,
        urls: AnyBrokerURLs,
        *,
        confirm_timeout: float = CONFIRM_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
        connection_name: str = "broker-jobs (publishing check)",
    ) -> None:
        self._urls = BrokerURLs.parse(urls)
        self._confirm_timeout = confirm_timeout
        self._connect_timeout = connect_timeout
        self._connection_name = connection_name
        self._link: PikaLink | None = None

    def check(self) -> Publishing:
        """What the broker does with two probes now (see :class:`Publishing`)."""
        kept = self._link is not None
        found, lost = self._check_once()
        if lost and kept:  # the kept link was closed while idle (missed heartbeats)
            found, _ = self._check_once()
        return found

    def _check_once(self) -> tuple[Publishing, bool]:
        """The finding, and whether the link was lost on the way."""
        try:
            link = self._open_link()
        except BrokerJobsError as error:
            return Publishing(accepted=None, why=mask_text(str(error))), False
        link.refresh_if_idle(0.0)  # what arrived since the last check: unblocked, confirms
        if link.blocked_reason is not None:  # still blocked: a probe would wait in vain
            return Publishing(accepted=False, blocked_reason=link.blocked_reason), False
        try:
            probe_publishing(link, "", self._confirm_timeout, before="reporting the broker's state")
        except BrokerConnectionError as error:
            found = _failed(link, error)
            if found.accepted is not None:
                return found, False
            self.close()  # lost or refused: anew next time
            return found, not _refused(link)
        return Publishing(accepted=True), False

    def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()

    def _open_link(self) -> PikaLink:
        link = self._link
        if link is None or not link.is_open:
            after = None
            if link is not None:  # lost: its loop is closed, the other nodes tried first
                self.close()
                after = link.url
            self._link = link = PikaLink.connect_first(
                self._urls,
                after=after,
                connect_timeout=self._connect_timeout,
                connection_name=self._connection_name,
            )
        return link


def _refused(link: PikaLink) -> bool:
    """Whether the broker refused the link's publishes (the user's permissions)."""
    closed = link.closed_reason
    return (
        isinstance(closed, pika.exceptions.ChannelClosedByBroker)
        and closed.reply_code == ACCESS_REFUSED
    )


def _failed(link: PikaLink, error: BrokerConnectionError) -> Publishing:
    if _refused(link):
        return Publishing(
            accepted=None,
            why="this user may not publish to the default exchange (write on amq.default),"
            " so whether the broker takes publishes is not known",
        )
    if link.is_open:  # no answer in time on a link still open: blocked
        return Publishing(accepted=False, blocked_reason=link.blocked_reason)
    return Publishing(accepted=None, why=mask_text(str(error)))
