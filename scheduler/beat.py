"""The beat process: several run, the one leading emits the schedules' fires.

Leadership comes from RabbitMQ (:mod:`scheduler.leadership`); the leader emits over
the channel it leads on, so a leader cut off from the broker cannot emit. A term of
leadership goes:

    elected -> read each schedule's last fire from the store
            -> emit what is due: missed fires by the schedule's catch-up policy
               (within its lookback), on-time fires always
            -> sleep until the next fire; repeat while still leading

Each fire is published (confirmed) before it is recorded as the schedule's last
fire. A leader that dies between the two leaves the fire to its successor, which
emits it again under the same fence key: the workers run it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from broker_jobs.amqp.declaring import declare_at_start
from broker_jobs.app import App
from broker_jobs.clock import utc_now
from broker_jobs.envelope import Job
from broker_jobs.errors import BrokerConnectionError, ConfigurationError, PublishError
from broker_jobs.observe.beat_metrics import BeatMetrics
from broker_jobs.observe.failure_streak import FailureStreak
from broker_jobs.observe.heartbeat import Heartbeat, Pulse, process_record
from broker_jobs.publish.prepare import JobFactory
from broker_jobs.store.base import Store, StoreError
from broker_jobs.store.processes import ProcessKind, ProcessState
from broker_jobs.urls import AnyBrokerURLs, BrokerURLs
from scheduler.agreement import ScheduleAgreement
from scheduler.digests import schedule_digests
from scheduler.emitter import Emitter
from scheduler.leadership import Leadership
from scheduler.schedules import FireKind, Schedule

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Longest sleep between two looks at the schedules and the leadership.
MAX_NAP = 1.0
#: How long a failed emission, or a term that ended on an error, waits to try again.
RETRY_AFTER = 1.0

#: Seconds between two announcements of the leader in the store (``beat status``),
#: and between two comparisons of a follower's schedules with the leader's.
ANNOUNCE_EVERY = 5.0
#: A leader that has not announced itself for this many announce periods is shown
#: as stale (it died, or lost the broker, since).
STALE_AFTER_ANNOUNCES = 3

#: Called after each emitted fire (tests, benchmarks, metrics).
OnEmitted = Callable[[Schedule, datetime, Job], None]


@dataclass(frozen=True)
class BeatSettings:
    #: Shown by ``beat status`` and in the broker's connection list; default host:pid.
    identity: str | None = None
    #: AMQP heartbeat in seconds: a paused or cut-off leader loses its leadership
    #: about two heartbeats later.
    heartbeat: int = 5
    confirm_timeout: float = 10.0
    declare: bool = True
    announce_every: float = ANNOUNCE_EVERY
    #: Testing only: emit whenever connected, as if leading (simulates a split brain).
    force_leader: bool = False

    def __post_init__(self) -> None:
        if self.heartbeat < 1:
            raise ConfigurationError("heartbeat must be at least 1 second")
        if not self.confirm_timeout > 0:
            raise ConfigurationError("confirm_timeout must be a positive number of seconds")


class _StandDown(Exception):
    """Leadership was lost in the middle of a term."""


class Beat:
    """One beat process. ``await beat.run()`` until :meth:`stop`."""

    def __init__(
        self,
        url: AnyBrokerURLs,
        app: App,
        schedules: Sequence[Schedule],
        store: Store,
        settings: BeatSettings | None = None,
        *,
        on_emitted: OnEmitted | None = None,
        clock: Callable[[], datetime] = utc_now,
        metrics: BeatMetrics | None = None,
    ) -> None:
        """``url``: the broker's URL, or its nodes' URLs (a sequence, or separated by
        commas; the first that answers is used, the others after a loss). ``clock``
        gives the time the schedules are evaluated at (tests fix it). ``metrics``:
        where to count leadership, fires and the broker link (docs/metrics.md);
        without it they go to a registry nobody serves."""
        self._urls = BrokerURLs.parse(url)
        self._app = app
        self._schedules = tuple(schedules)
        self._store = store
        self._settings = settings or BeatSettings()
        self._on_emitted = on_emitted
        self._clock = clock
        self._metrics = metrics or BeatMetrics(
            CollectorRegistry(), app.namespace, [s.name for s in self._schedules]
        )
        # What /readyz answers; written on the event loop, read by the metrics thread.
        self._connected = False
        self._leading = False
        self._identity = self._settings.identity or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )
        self._emitter = Emitter(
            JobFactory(app, None), confirm_timeout=self._settings.confirm_timeout
        )
        self._digests = schedule_digests(self._schedules)
        #: A store that fails is said once, and once when it answers again: the
        #: leader tries again every RETRY_AFTER seconds meanwhile.
        self._store_streak = FailureStreak(log)
        self._agreement = ScheduleAgreement(
            self._identity,
            self._digests,
            self._metrics,
            stale_after=STALE_AFTER_ANNOUNCES * self._settings.announce_every,
        )
        self._stopping = asyncio.Event()
        # One thread for the store's calls, as in the worker: SQLite writes queue anyway.
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="broker-jobs-beat-store")

    @property
    def identity(self) -> str:
        return self._identity

    def fire_key(self, schedule: Schedule) -> str:
        """The store's key of a schedule's last fire."""
        return fire_key(self._app.namespace, schedule.name)

    def readiness(self) -> tuple[bool, str]:
        """Ready while a session with the broker is up, leading or following (for
        :class:`broker_jobs.observe.Health`; only reads flags, from any thread)."""
        if not self._connected:
            return False, "no session with the broker"
        return True, "leading" if self._leading else "following"

    def stop(self) -> None:
        """Stop (safe from a signal handler): a leader stops emitting at once and
        its leadership passes to another beat when its connection closes."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop)

    async def run(self) -> None:
        settings = self._settings
        if settings.declare:
            await declare_at_start(
                self._urls, self._app.topology(), f"broker-jobs beat {self._identity}"
            )
        leadership = Leadership(
            self._urls,
            self._app.namespace,
            self._identity,
            heartbeat=settings.heartbeat,
            on_change=self._on_leadership,
            on_session=self._on_session,
            force_leader=settings.force_leader,
        )
        await leadership.start()
        log.info(
            "beat %s started: %d schedules, waiting for the leadership",
            self._identity,
            len(self._schedules),
        )
        for schedule in self._schedules:
            if (past := schedule.past_for_good(utc_now())) is not None:
                log.warning(
                    "schedule %s fires once, at %s: more than its lookback (%s) ago, so it"
                    " never fires (whether or not it fired then); move its time, or remove it",
                    schedule.name,
                    past.isoformat().replace("+00:00", "Z"),
                    schedule.lookback,
                )
        heartbeat = Heartbeat(
            self._store,
            process_record(
                ProcessKind.BEAT, self._identity, self._app.namespace, every=settings.announce_every
            ),
            pulse=self._pulse,
            call=self._in_store,
            quiet=lambda: self._store_streak.failing,  # one outage, said once
        )
        beating = asyncio.create_task(heartbeat.run())
        try:
            retrying = False  # leading still, after the store failed under the last term
            while await self._until_leader(leadership):
                try:
                    await self._lead(leadership, retrying=retrying)
                except _StandDown:
                    retrying = False
                    log.warning("beat %s lost the leadership; standing down", self._identity)
                except StoreError as error:
                    retrying = True
                    # Without the store no fire can be recorded: emit nothing, keep
                    # the leadership (another beat would meet the same store) and retry.
                    self._store_streak.failed(
                        "beat %s cannot use the store: %s; it emits nothing and tries"
                        " again every %g s until the store answers (then it catches up"
                        " the fires due meanwhile, within their lookback)",
                        self._identity,
                        error,
                        RETRY_AFTER,
                    )
                # Not at once: a leader whose emit channel is reopening, or whose store
                # failed, would otherwise spin.
                await self._nap(RETRY_AFTER)
        finally:
            beating.cancel()
            await leadership.stop()
            await heartbeat.stopped()
            self._store_thread.shutdown(wait=True)

    def _pulse(self) -> Pulse:
        """The beat's heartbeat: its role in the election."""
        role = ("leading" if self._leading else "following") if self._connected else "connecting"
        stopping = self._stopping.is_set()
        return Pulse(state=ProcessState.STOPPING if stopping else ProcessState.RUNNING, role=role)

    def _on_leadership(self, leader: bool) -> None:
        self._leading = leader
        self._metrics.leading(leader)

    def _on_session(self, up: bool) -> None:
        self._connected = up
        self._metrics.session(up)

    async def _until_leader(self, leadership: Leadership) -> bool:
        """Wait to lead, comparing this beat's schedules with the leader's every
        announce period meanwhile; False when stopping first."""
        stopping = asyncio.ensure_future(self._stopping.wait())
        leading = asyncio.ensure_future(leadership.wait_until_leader())
        waiters = (stopping, leading)
        period = self._settings.announce_every
        try:
            while True:
                done, _ = await asyncio.wait(
                    waiters, timeout=period, return_when=asyncio.FIRST_COMPLETED
                )
                if done:
                    break
                await self._compare_with_leader()  # a period passed, still following
        finally:
            for waiter in waiters:
                waiter.cancel()
        return not self._stopping.is_set()

    async def _compare_with_leader(self) -> None:
        """Read the leader's record and compare schedules (:mod:`scheduler.agreement`).
        A store that fails here costs nothing: the leader reports its store itself."""
        try:
            record = await self._in_store(self._store.leader, self._app.namespace)
        except StoreError as error:
            log.debug("beat %s cannot read the leader's record: %s", self._identity, error)
            return
        self._agreement.check(record, self._clock())

    async def _lead(self, leadership: Leadership, *, retrying: bool = False) -> None:
        """Emit the due fires while leading. ``retrying``: the same leadership again
        after the store failed (its "leads" line is not said at each try)."""
        elected = self._clock()
        if not retrying:
            log.info("beat %s leads %s", self._identity, self._app.namespace)
        self._agreement.leading()
        cursors = {s.name: await self._cursor(s, elected) for s in self._schedules}
        announce_at = 0.0
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            self._check_leading(leadership)
            if loop.time() >= announce_at:
                await self._in_store(
                    self._store.record_leader,
                    self._app.namespace,
                    self._identity,
                    elected,
                    schedules=self._digests,
                )
                announce_at = loop.time() + self._settings.announce_every
            now = self._clock()
            for schedule in self._schedules:
                cursors[schedule.name] = await self._emit_due(
                    leadership, schedule, cursors[schedule.name], now
                )
            # A pass whose every store call answered: an outage is over.
            self._store_streak.worked(
                "beat %s: the store answers again; the fires due meanwhile are emitted",
                self._identity,
            )
            await self._nap(self._next_wake(cursors, now))

    async def _cursor(self, schedule: Schedule, elected: datetime) -> datetime:
        """Where a term starts for a schedule: its last emitted fire, or (never
        fired) the election minus the schedule's grace."""
        last = await self._in_store(self._store.last_fire, self.fire_key(schedule))
        return last if last is not None else elected - schedule.grace

    async def _emit_due(
        self, leadership: Leadership, schedule: Schedule, cursor: datetime, now: datetime
    ) -> datetime:
        """Emit the schedule's due fires; return the new cursor: ``now`` once all
        fires up to now were emitted or deliberately skipped, else the last fire
        emitted (the rest are tried again)."""
        due = schedule.due(cursor, now)
        # Skipped fires precede every emitted one: counted once the cursor passes them
        # (a pass failing before that moves nothing; the next one meets them again).
        skips = due.skipped
        for fire, kind in due.with_kinds():
            self._check_leading(leadership)
            try:
                job = await self._emitter.emit(leadership.channel, schedule, fire)
            except BrokerConnectionError as error:  # its text names the schedule
                log.warning("%s", error)
                raise _StandDown from None
            except PublishError as error:
                # An operator's problem (a deleted queue, a full one): say it loudly,
                # without a traceback, and keep the fire for the next try.
                log.error("emitting %s failed: %s; trying again", schedule.name, error)  # noqa: TRY400
                await asyncio.sleep(RETRY_AFTER)
                return cursor
            await self._in_store(self._store.record_fire, self.fire_key(schedule), fire)
            cursor = fire
            self._skipped(schedule, skips)
            skips = 0
            self._metrics.fired(schedule.name, kind)
            late = " (caught up)" if kind is FireKind.CAUGHT_UP else ""
            log.info("emitted %s %s%s", schedule.name, job.idempotency_key, late)
            if self._on_emitted is not None:
                self._on_emitted(schedule, fire, job)
        self._skipped(schedule, skips)
        return max(cursor, now)

    def _skipped(self, schedule: Schedule, skips: int) -> None:
        """Count (and say) the missed fires that ``schedule``'s catch-up skipped, once
        the cursor passed them."""
        self._metrics.skipped(schedule.name, skips)
        if skips:
            log.info(
                "skipped %d missed fire(s) of %s (catch_up %s, lookback %s)",
                skips,
                schedule.name,
                schedule.catch_up.value,
                schedule.lookback,
            )

    def _next_wake(self, cursors: dict[str, datetime], now: datetime) -> float:
        """Seconds until the earliest next fire, at most :data:`MAX_NAP`."""
        nap = MAX_NAP
        for schedule in self._schedules:
            upcoming = schedule.timing.next_fire(cursors[schedule.name])
            if upcoming is not None:
                nap = min(nap, (upcoming - now) / timedelta(seconds=1))
        return max(nap, 0.0)

    async def _nap(self, seconds: float) -> None:
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), seconds)

    def _check_leading(self, leadership: Leadership) -> None:
        if not leadership.is_leader():
            raise _StandDown

    async def _in_store(self, call: Callable[..., T], *args: Any, **options: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._store_thread, functools.partial(call, *args, **options)
        )


def fire_key(namespace: str, schedule: str) -> str:
    """The store's key of a schedule's last fire: schedules are per namespace."""
    return f"{namespace}/{schedule}"
