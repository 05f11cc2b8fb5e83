"""The sync publisher, for Flask, Django, scripts and threads (pika)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Unpack, overload

from pika.exceptions import ChannelClosedByBroker

from broker_jobs.app import ModelT, TaskSpec
from broker_jobs.closing import Closing
from broker_jobs.envelope import Job
from broker_jobs.errors import (
    BrokerConnectionError,
    BrokerJobsError,
    BrokerUnreachableError,
    ConfirmTimeoutError,
    NackedError,
    PublisherBusyError,
    TopologyMissingError,
)
from broker_jobs.fork_watch import ForkWatch
from broker_jobs.keywords import refuse_unknown_keywords
from broker_jobs.publish.pika_link import Delivery, PikaLink
from broker_jobs.publish.prepare import (
    BatchOutcome,
    JobOptions,
    JobRequest,
    Payload,
    Prepared,
    PublisherBase,
    TaskRef,
    check_unique_ids,
    confirm_timeout_hint,
)

log = logging.getLogger(__name__)

#: Publishes in flight before ``publish_many`` waits for confirms: enough to keep the
#: pipe full, few enough that a lost connection leaves a bounded unknown outcome.
CONFIRM_WINDOW = 1000
#: Seconds of idleness after which a publish first reads what the broker sent (a
#: close after a restart) before sending, so the job goes out on a live connection.
IDLE_REFRESH = 1.0
#: AMQP reply code for a missing exchange or queue.
NOT_FOUND = 404


class Publisher(PublisherBase, Closing):
    """Publishes jobs and returns them only once the broker confirmed them.

    Every job is persistent, published with ``mandatory`` (a task without a queue is
    an :class:`UnroutableError`, never a silent drop) and confirmed within
    ``confirm_timeout`` seconds or a :class:`ConfirmTimeoutError` is raised. The
    connection opens on first use and reopens on the next publish after it broke
    (a broker restart, say); ``publish`` retries once on a fresh connection then.
    Given the URLs of several nodes, it connects to the first that answers, and
    after a lost connection tries the other nodes before the lost one.

    Threads: a pika connection must not be used from two threads at once, so every
    call takes an internal lock. Sharing one publisher between threads is safe, and
    serialises their publishes; give each thread its own publisher for parallelism.
    Across ``fork()`` (gunicorn's ``--preload``, a module-level publisher), a child
    leaves the parent's connection alone and opens its own on its first publish.

    >>> with Publisher("amqp://guest:guest@localhost/", app) as publisher:
    ...     job = publisher.publish("image.resize", Resize(url="...", width=128))
    """

    def _init_connection_state(self) -> None:
        self._lock = threading.Lock()
        self._link: PikaLink | None = None
        ForkWatch.add(self)

    def after_fork_in_child(self) -> None:
        """In a forked child: drop the connection inherited from the parent without
        a frame or an epoll change (both are shared with the parent, whose connection
        they would break), and a lock another thread of the parent may have held."""
        self._lock = threading.Lock()
        if self._link is not None:
            self._link.abandon()
            self._link = None
        self._node = None

    @overload
    def publish(
        self, task: TaskSpec[ModelT], payload: ModelT, **options: Unpack[JobOptions]
    ) -> Job: ...

    @overload
    def publish(
        self, task: TaskSpec[Any], payload: Mapping[str, Any], **options: Unpack[JobOptions]
    ) -> Job: ...

    @overload
    def publish(self, task: str, payload: Payload, **options: Unpack[JobOptions]) -> Job: ...

    def publish(self, task: TaskRef, payload: Payload, **options: Unpack[JobOptions]) -> Job:
        """Publish one job and wait for its confirm; return the job (``job.id``).

        Options: ``job_id``, ``idempotency_key``, ``traceparent``, ``tracestate``, and
        ``delay`` (seconds or timedelta) or ``eta`` (aware datetime) to run it later.
        """
        with self._traced(self._factory.build(task, payload, **options)) as prepared:
            with self._turn(prepared.job):
                error = self._send_one(prepared)
                if isinstance(error, BrokerConnectionError) and not isinstance(
                    error, BrokerUnreachableError
                ):
                    # The connection was found dead mid-publish (a restart between two
                    # calls): the job may or may not be stored; sending it again with
                    # the same id and key is harmless, since it runs once.
                    log.warning("%s; reconnecting to publish it again", error)
                    unknown, error = error, self._send_one(prepared)
                    if isinstance(error, BrokerUnreachableError):
                        # Not sent again, but the first may be stored: the caller must
                        # learn that the outcome is unknown, not that no node answered.
                        raise unknown from error
            if error is not None:
                raise error
        self._record_confirmed([prepared.job])
        return prepared.job

    @refuse_unknown_keywords()
    def publish_many(
        self,
        requests: Iterable[JobRequest],
        *,
        on_confirmed: Callable[[Job], None] | None = None,
    ) -> list[Job]:
        """Publish a batch with pipelined confirms; return the jobs, all confirmed.

        Every job is validated before the first is sent. If any is not confirmed, a
        :class:`PublishBatchError` lists the confirmed ids and each failed id's
        error; ``on_confirmed`` is called for each job as its confirm arrives.
        """
        prepared = [self._factory.build_request(request) for request in requests]
        check_unique_ids([item.job for item in prepared])
        first = prepared[0].job if prepared else None
        with self._traced_batch(prepared) as batch, self._turn(first):
            outcome = self._send_batch(batch.prepared, on_confirmed)
            batch.failed = outcome.failed
        self._record_confirmed(outcome.confirmed_jobs())
        return outcome.settle()

    def connect(self) -> None:
        """Open the connection now, or check that it is open: a publisher otherwise
        connects on its first publish. For a service's start-up or readiness probe;
        raises :class:`BrokerConnectionError` (or a topology error) as a publish would."""
        with self._lock:
            self._connected_link()

    def close(self) -> None:
        with self._lock:
            if self._link is not None:
                self._link.close()
                self._link = None
            self._node = None  # used again, it starts with the first node

    # -- sending --------------------------------------------------------------------

    @contextlib.contextmanager
    def _turn(self, job: Job | None) -> Iterator[None]:
        """This thread's turn on the shared connection, waited for at most
        ``confirm_timeout``: a broker that blocks publishing holds each publish that
        long, and the threads queued behind it would otherwise wait for all of them."""
        timeout = self._settings.confirm_timeout
        if job is None:  # an empty batch: nothing to refuse
            self._lock.acquire()
        elif not self._lock.acquire(timeout=timeout):
            raise PublisherBusyError(job.task, job.id, timeout)
        try:
            yield
        finally:
            self._lock.release()

    def _send_one(self, prepared: Prepared) -> BrokerJobsError | None:
        """One job's publish and confirm: :meth:`_send_batch` of a batch of one, without
        the batch's books when the link is up and the job needs no ladder check
        (~8 us of a single publish's ~190 us of CPU). The job's error, or None."""
        try:
            link = self._connected_link()
        except BrokerConnectionError as error:
            return error
        if not link.is_open or self._needs_ladder_check((prepared,)):
            return self._send_batch([prepared], None).failed.get(prepared.job.id)
        route = self._factory.current_route(prepared)
        delivery = link.publish(route.exchange, route.routing_key, prepared.message)
        job = prepared.job  # its model built while the confirm travels (Prepared)
        settled = link.wait(lambda: delivery.settled, self._settings.confirm_timeout)
        link.forget_settled()
        if settled:
            return self._settled_error(job, delivery)
        outcome = BatchOutcome([job])
        self._fail_unsettled(link, deque([(job, delivery)]), [], outcome)
        return outcome.failed[job.id]

    def _send_batch(
        self, prepared: list[Prepared], on_confirmed: Callable[[Job], None] | None
    ) -> BatchOutcome:
        outcome = BatchOutcome([item.job for item in prepared])
        try:
            link = self._connected_link()
            if self._needs_ladder_check(prepared):
                outcome.failed.update(self._check_ladder(prepared))
        except BrokerConnectionError as error:
            outcome.failed = {item.job.id: error for item in prepared}
            return outcome
        to_send = [item for item in prepared if item.job.id not in outcome.failed]
        in_flight: deque[tuple[Job, Delivery]] = deque()
        timeout = self._settings.confirm_timeout
        sent = 0
        stalled = False
        for item in to_send:
            if not link.is_open:
                break
            route = self._factory.current_route(item)
            delivery = link.publish(route.exchange, route.routing_key, item.message)
            in_flight.append((item.job, delivery))
            sent += 1
            if len(in_flight) >= CONFIRM_WINDOW:
                stalled = not link.wait(lambda: in_flight[0][1].settled, timeout)
                self._record_settled(in_flight, outcome, on_confirmed)
                if stalled:
                    break  # timed out or the connection broke
        if not stalled:
            link.wait(lambda: all(delivery.settled for _, delivery in in_flight), timeout)
            self._record_settled(in_flight, outcome, on_confirmed)
        link.forget_settled()
        if in_flight or sent < len(to_send):
            self._fail_unsettled(link, in_flight, to_send[sent:], outcome)
        return outcome

    def _connected_link(self) -> PikaLink:
        if self._link is not None:
            self._link.refresh_if_idle(IDLE_REFRESH)
            if not self._link.is_open:
                log.warning("%s; reconnecting", self._link.describe_closed())
                self._link.close()
                self._link = None
        if self._link is None:
            self._forget_connection_facts()
            link = PikaLink.connect_first(
                self._urls,
                after=self._node,  # after a loss, the other nodes first
                connect_timeout=self._settings.connect_timeout,
                connection_name=self._settings.connection_name,
            )
            self._node = link.url
            if self._settings.declare:
                try:
                    self._declare(link.url)
                except BaseException:
                    link.close()
                    raise
            self._link = link
        return self._link

    def _record_settled(
        self,
        in_flight: deque[tuple[Job, Delivery]],
        outcome: BatchOutcome,
        on_confirmed: Callable[[Job], None] | None,
    ) -> None:
        while in_flight and in_flight[0][1].settled:
            job, delivery = in_flight.popleft()
            error = self._settled_error(job, delivery)
            if error is None:
                outcome.confirmed.add(job.id)
                if on_confirmed is not None:
                    on_confirmed(job)
            else:
                outcome.failed[job.id] = error

    def _settled_error(self, job: Job, delivery: Delivery) -> BrokerJobsError | None:
        if delivery.nacked:
            return NackedError(job.task, job.id)
        if delivery.returned:
            return self._factory.unroutable(job)
        return None

    def _fail_unsettled(
        self,
        link: PikaLink,
        in_flight: deque[tuple[Job, Delivery]],
        unsent: list[Prepared],
        outcome: BatchOutcome,
    ) -> None:
        """Give every job without a confirm its error, and drop the link: after a
        timeout its state is unknown, after a close it is dead."""
        if link.is_open:
            hint = confirm_timeout_hint(link.blocked_reason)
            for job, _ in in_flight:
                outcome.failed[job.id] = ConfirmTimeoutError(
                    job.task, job.id, self._settings.confirm_timeout, hint
                )
            lost = "earlier jobs of the batch got no confirm in time"
        elif _is_not_found(link.closed_reason):
            # Publishing to a missing exchange: the broker drops the message and
            # closes the channel. Nothing was stored.
            lost = link.describe_closed()
            for job, _ in in_flight:
                outcome.failed[job.id] = TopologyMissingError(_reply_text(link.closed_reason))
        else:
            lost = link.describe_closed()
            for job, _ in in_flight:
                outcome.failed[job.id] = BrokerConnectionError(
                    f"{lost} before job {job.id} was confirmed: its outcome is unknown;"
                    " publishing it again with the same id and key is safe"
                )
        for item in unsent:
            outcome.failed[item.job.id] = BrokerConnectionError(
                f"{lost}; job {item.job.id} was not sent"
            )
        link.close()
        self._link = None


def _is_not_found(reason: BaseException | None) -> bool:
    return isinstance(reason, ChannelClosedByBroker) and reason.reply_code == NOT_FOUND


def _reply_text(reason: BaseException | None) -> str:
    return reason.reply_text if isinstance(reason, ChannelClosedByBroker) else str(reason)
