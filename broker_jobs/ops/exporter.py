"""The exporter's figures (docs/metrics.md, "Exporter"): what neither a worker nor a
beat can see, polled from the broker over AMQP and from the ledger.

Each poll is one :func:`broker_jobs.ops.status.gather` on a connection kept open
between polls (reopened when it broke). The figures of the last successful poll are
served until the next one succeeds; ``broker_jobs_exporter_up`` says whether the last
poll did. A queue that does not exist has no series (an alert on ``absent()`` sees
it), and without a ledger there are no ledger series. With a ledger, each poll's
queue depths are sampled into it for the dashboard's history page
(:mod:`broker_jobs.ops.depth_sampling`).

Polls run on one thread of their own (:meth:`Exporter.run`): pika's connection and
SQLite's per-thread connections want one thread, and the event loop stays free to
beat for ``/healthz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pika
import pika.exceptions
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from broker_jobs.amqp.connecting import connect_first_blocking
from broker_jobs.errors import BrokerConnectionError
from broker_jobs.observe.heartbeat import Heartbeat, Pulse, process_record
from broker_jobs.ops.depth_sampling import DepthSampler
from broker_jobs.ops.processes import liveness_counts, process_views
from broker_jobs.ops.publishing_check import Publishing, PublishingWatch
from broker_jobs.ops.status import (
    CONNECT_TIMEOUT,
    FoundLanes,
    QueueState,
    StatusReport,
    gather,
)
from broker_jobs.store.base import Status, Store, StoreError, mask_dsn
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.processes import Liveness, ProcessKind, ProcessState
from broker_jobs.store.urls import open_store
from broker_jobs.urls import AnyBrokerURLs, BrokerURL, mask_text
from topology.names import Names

log = logging.getLogger(__name__)

#: Seconds between two polls, by default.
POLL_EVERY = 15.0
#: /readyz fails once no poll has finished for this long beyond three intervals: a
#: poll that hangs (a broker that stopped answering mid-poll) must not look healthy.
STALL_MARGIN = 60.0


class Exporter:
    """Polls ``tasks`` of ``names``' namespace on the broker at ``urls`` (and the
    ledger at ``store_url``, when given) and serves the figures as a collector of
    ``registry``. The ledger is opened read-only (an SQLite file that does not exist
    is a failed poll, not a new empty ledger), at the first poll that needs it."""

    def __init__(
        self,
        urls: AnyBrokerURLs,
        names: Names,
        tasks: Sequence[str],
        registry: CollectorRegistry,
        *,
        store_url: str | None = None,
        interval: float = POLL_EVERY,
        connection_name: str = "broker-jobs exporter",
        clock: Callable[[], float] = time.monotonic,
        lanes: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._urls = urls
        self._names = names
        self._tasks = tuple(tasks)
        #: Without the app's lanes, found on the broker once per task.
        self._lanes = FoundLanes() if lanes is None else dict(lanes)
        self._store_url = store_url
        self._interval = interval
        self._connection_name = connection_name
        self._clock = clock
        self._store: Store | None = None
        # gather() always reads a ledger: without one, an empty stand-in whose
        # figures are not exported.
        self._no_ledger = MemoryStore()
        self._connection: pika.BlockingConnection | None = None
        self._node: BrokerURL | None = None
        # Written by the poll thread, read by the metrics thread: whole values only.
        self._report: StatusReport | None = None
        self._up = False
        self._failure: str | None = None
        self._failures = 0
        self._polled_at: float | None = None
        #: This exporter's heartbeat (remade with each ledger it opens) and what the
        #: last poll read of every process's.
        self._heartbeat = Heartbeat(
            self._no_ledger,
            process_record(
                ProcessKind.EXPORTER,
                f"{socket.gethostname()}:{os.getpid()}:exporter",
                names.namespace,
                tasks=self._tasks,
                every=interval,
            ),
        )
        self._processes: Counter[tuple[str, str]] = Counter()
        self._depths = DepthSampler()
        #: Whether the broker takes publishes, asked at each poll on a link of its own.
        self._publishing_watch = PublishingWatch(
            urls, connection_name=f"{connection_name} (publishing check)"
        )
        self._publishing: Publishing | None = None
        registry.register(self)

    # -- polling (the poll thread) --------------------------------------------------

    def poll(self) -> bool:
        """One poll: the new figures, or a failure (logged once per streak)."""
        try:
            report = self._gather()
        except Exception as error:  # any failure is a failed poll; the loop goes on
            self._failed(error)
            return False
        finally:
            self._polled_at = self._clock()
        # Asked before the poll's figures are served: they change together.
        self._publishing = self._ask_publishing()
        self._report, self._up, self._failure = report, True, None
        if self._store_url is not None:
            self._depths.sample(self._ledger(), report)
            self._processes = self._beat_and_read_processes()
        if self._failures:
            log.info("exporter: polling works again after %d failed poll(s)", self._failures)
        self._failures = 0
        return True

    async def run(self, stopping: asyncio.Event) -> None:
        """Poll every ``interval`` seconds (after each poll ends) until ``stopping``."""
        loop = asyncio.get_running_loop()
        log.info(
            "exporter: polling %d task(s) of namespace %s%s every %g s",
            len(self._tasks),
            self._names.namespace,
            "" if self._store_url is None else " and the ledger",
            self._interval,
        )
        with ThreadPoolExecutor(1, thread_name_prefix="broker-jobs-exporter-poll") as thread:
            try:
                while not stopping.is_set():
                    await loop.run_in_executor(thread, self.poll)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stopping.wait(), self._interval)
            finally:
                await loop.run_in_executor(thread, self.close)

    def close(self) -> None:
        if self._store is not None:  # its last heartbeat: stopped
            self._heartbeat.write(Pulse(state=ProcessState.STOPPED))
        self._drop_connection()
        self._drop_store()
        self._publishing_watch.close()

    def _ask_publishing(self) -> Publishing | None:
        """Whether the broker takes publishes; None (no series) if the check itself
        broke, which must not fail the poll: its link is opened afresh next time."""
        try:
            return self._publishing_watch.check()
        except Exception:
            log.debug("exporter: the publishing check failed", exc_info=True)
            self._publishing_watch.close()
            return None

    def _gather(self) -> StatusReport:
        store = self._ledger()
        if self._connection is not None and self._connection.is_open:
            try:
                return self._gather_on(self._connection, store)
            except BrokerConnectionError:
                # Dropped while idle between polls (missed heartbeats): once more, anew.
                self._drop_connection()
        self._connection, self._node = connect_first_blocking(
            self._urls,
            timeout=CONNECT_TIMEOUT,
            connection_name=self._connection_name,
            after=self._node,  # after a loss, the other nodes first
        )
        return self._gather_on(self._connection, store)

    def _gather_on(self, connection: pika.BlockingConnection, store: Store) -> StatusReport:
        node = "" if self._node is None else self._node.masked
        return gather(connection, self._names, self._tasks, store, node=node, lanes=self._lanes)

    def _ledger(self) -> Store:
        if self._store_url is None:
            return self._no_ledger
        if self._store is None:
            self._store = store = open_store(self._store_url, must_exist=True)
            self._heartbeat = Heartbeat(store, self._heartbeat.record)
        return self._store

    def _beat_and_read_processes(self) -> Counter[tuple[str, str]]:
        """The exporter's own heartbeat (a ledger it may only read says so once, and
        the poll goes on), then every process's liveness, for ``broker_jobs_processes``."""
        store = self._ledger()
        self._heartbeat.write(Pulse())
        self._heartbeat.forget_old(self._clock())
        try:
            return liveness_counts(process_views(store, self._names.namespace))
        except StoreError as error:
            log.debug("exporter: the heartbeats cannot be read: %s", error)
            return Counter()

    def _failed(self, error: Exception) -> None:
        why = mask_dsn(mask_text(f"{type(error).__name__}: {error}"))
        self._up, self._failure = False, why
        self._failures += 1
        # A broken connection or ledger is opened afresh at the next poll.
        self._drop_connection()
        self._drop_store()
        if self._failures == 1:
            log.warning(
                "exporter: a poll failed: %s; serving the last figures with"
                " broker_jobs_exporter_up 0 (the next failures are logged at DEBUG)",
                why,
            )
        else:
            log.debug("exporter: poll %d of a streak failed: %s", self._failures, why)

    def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()

    def _drop_store(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(Exception):  # a broken ledger may fail to close too
                store.close()

    # -- serving (the metrics thread) -----------------------------------------------

    def ready(self) -> tuple[bool, str]:
        """Ready once a poll succeeded, while the last one did and polls go on."""
        polled_at = self._polled_at
        if self._report is None or polled_at is None:
            return False, self._failure or "no poll has succeeded yet"
        if not self._up:
            return False, f"the last poll failed: {self._failure}"
        silent = self._clock() - polled_at
        if silent > 3 * self._interval + STALL_MARGIN:
            return False, f"no poll has finished for {silent:.0f} s"
        return True, "polling"

    def collect(self) -> Iterator[Metric]:
        """The Prometheus collector's figures: those of the last successful poll."""
        up = GaugeMetricFamily(
            "broker_jobs_exporter_up", "1 when the last poll of broker and ledger succeeded"
        )
        up.add_metric([], 1 if self._up else 0)
        yield up
        report = self._report
        if report is not None:
            yield from _broker_figures(report)
            yield _publishing_figure(report.namespace, self._publishing)
            if self._store_url is not None:
                yield from _ledger_figures(report)
                yield _process_figures(report.namespace, self._processes)


def _broker_figures(report: StatusReport) -> Iterator[Metric]:
    ns = report.namespace
    per_task = ["namespace", "task"]
    ready = GaugeMetricFamily(
        "broker_jobs_queue_ready_messages", "Ready messages in the task queue", labels=per_task
    )
    consumers = GaugeMetricFamily(
        "broker_jobs_queue_consumers", "Consumers of the task queue", labels=per_task
    )
    dead = GaugeMetricFamily(
        "broker_jobs_dead_letter_messages",
        "Messages in the task's dead-letter queue",
        labels=per_task,
    )
    for task in report.tasks:
        _add(ready, [ns, task.task], task.queue, task.queue.messages)
        _add(consumers, [ns, task.task], task.queue, task.queue.consumers)
        _add(dead, [ns, task.task], task.dead_letters, task.dead_letters.messages)
    ladder = GaugeMetricFamily(
        "broker_jobs_delay_ladder_messages",
        "Jobs waiting in the namespace's delay ladder (every task's)",
        labels=["namespace"],
    )
    if len(report.ladder.missing) < report.ladder.levels:
        ladder.add_metric([ns], report.ladder.messages)
    unroutable = GaugeMetricFamily(
        "broker_jobs_unroutable_messages", "Delayed jobs no queue took", labels=["namespace"]
    )
    _add(unroutable, [ns], report.unroutable, report.unroutable.messages)
    yield from (ready, consumers, dead, ladder, unroutable)


def _publishing_figure(namespace: str, publishing: Publishing | None) -> Metric:
    blocked = GaugeMetricFamily(
        "broker_jobs_broker_publishing_blocked",
        "1 while the broker confirms no publish (a memory or disk alarm), else 0; no"
        " series while that is not known",
        labels=["namespace"],
    )
    if publishing is not None and publishing.accepted is not None:
        blocked.add_metric([namespace], 0 if publishing.accepted else 1)
    return blocked


def _ledger_figures(report: StatusReport) -> Iterator[Metric]:
    jobs = GaugeMetricFamily(
        "broker_jobs_ledger_jobs",
        "Ledger records by state (running stands in for unacked)",
        labels=["namespace", "task", "state"],
    )
    oldest = GaugeMetricFamily(
        "broker_jobs_oldest_waiting_seconds",
        "Age of the oldest job waiting to start (0: none waits)",
        labels=["namespace", "task"],
    )
    paused = GaugeMetricFamily(
        "broker_jobs_task_paused",
        "1 while the task is paused (broker-jobs pause): workers start none of its jobs",
        labels=["namespace", "task"],
    )
    for task in report.tasks:
        paused.add_metric([report.namespace, task.task], 0 if task.paused is None else 1)
        for status in Status:
            jobs.add_metric([report.namespace, task.task, status.value], task.ledger.counts[status])
        age = task.oldest_waiting_age(report.taken_at)
        oldest.add_metric([report.namespace, task.task], 0 if age is None else age.total_seconds())
    yield from (jobs, oldest, paused)


def _process_figures(namespace: str, counts: Counter[tuple[str, str]]) -> Metric:
    """Every kind and liveness, at 0 where none is (an alert on lost workers needs
    the series)."""
    processes = GaugeMetricFamily(
        "broker_jobs_processes",
        "Workers, beats and exporters by their heartbeats in the ledger (lost: silent"
        " past the threshold without having said it stopped)",
        labels=["namespace", "kind", "state"],
    )
    for kind in ProcessKind:
        for state in Liveness:
            processes.add_metric(
                [namespace, kind.value, state.value], counts[kind.value, state.value]
            )
    return processes


def _add(
    family: GaugeMetricFamily, labels: list[str], queue: QueueState, value: int | None
) -> None:
    """A queue's figure, unless the queue does not exist."""
    if queue.exists and value is not None:
        family.add_metric(labels, value)
