"""A steady load of confirmed jobs, for the benches that break the broker under it.

``bench.recovery`` and ``bench.faults`` publish with :class:`Load`: a thread sending a
steady rate of jobs, each with a unique key, that records which were confirmed (and
when) and which failed to publish, so that the end can count what each job became.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter

from broker_jobs import App, Job, JobRequest, PublishBatchError, Publisher

#: Seconds between two publishes of the load (rate x TICK jobs each).
TICK = 0.02
#: The publisher's confirm and connect timeouts (seconds): a publish meeting a dead
#: node fails at once (the kernel resets the socket); these only bound a stuck one.
CONFIRM_TIMEOUT, CONNECT_TIMEOUT = 5.0, 2.0


class Load:
    """A thread publishing ``rate`` confirmed jobs per second, on schedule: each tick
    publishes the jobs due since the last one. A publish that fails (the broker is
    down) counts its jobs as not published; the next tick tries again with new jobs.

    Each job is ``task`` with a unique key, ``prefix`` and a number (``bench.faults``
    runs one load per task, with prefixes of their own), also its idempotency key with
    ``keyed`` (else the key is the job id); with ``limit`` the thread ends after that
    many jobs (published or not)."""

    def __init__(
        self,
        url: str,
        app: App,
        rate: float,
        *,
        task: str,
        prefix: str = "k",
        limit: int | None = None,
        keyed: bool = False,
        name: str = "bench load",
    ) -> None:
        self.url, self.app, self.rate = url, app, rate
        self.task, self.prefix, self.limit, self.keyed = task, prefix, limit, keyed
        self.name = name
        self.lock = threading.Lock()
        #: Confirmed keys and the wall time of their confirm.
        self.confirmed: dict[str, float] = {}
        #: Keys whose publish failed (not counted as published).
        self.failed: dict[str, float] = {}
        self.errors: Counter[str] = Counter()
        #: The first error message of each kind in :attr:`errors`.
        self.messages: dict[str, str] = {}
        self.attempted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=CONFIRM_TIMEOUT + CONNECT_TIMEOUT + 5)

    def confirmed_since(self, moment: float) -> float | None:
        with self.lock:
            return min((at for at in self.confirmed.values() if at > moment), default=None)

    def _run(self) -> None:
        publisher = Publisher(
            self.url,
            self.app,
            confirm_timeout=CONFIRM_TIMEOUT,
            connect_timeout=CONNECT_TIMEOUT,
            connection_name=self.name,
        )
        try:
            started = time.monotonic()
            next_tick = started
            while not self._stop.is_set():
                due = int((time.monotonic() - started) * self.rate) - self.attempted
                if self.limit is not None:
                    if self.attempted >= self.limit:
                        break
                    due = min(due, self.limit - self.attempted)
                if due > 0:
                    self._publish(publisher, due)
                next_tick += TICK
                pause = next_tick - time.monotonic()
                if pause > 0:
                    self._stop.wait(pause)
                else:
                    next_tick = time.monotonic()
        finally:
            with contextlib.suppress(Exception):
                publisher.close()

    def _publish(self, publisher: Publisher, count: int) -> None:
        keys = [f"{self.prefix}{self.attempted + index:07d}" for index in range(count)]
        self.attempted += count

        def confirmed(job: Job) -> None:
            with self.lock:
                self.confirmed[str(job.payload["key"])] = time.time()

        try:
            publisher.publish_many(
                [
                    JobRequest(self.task, {"key": key}, idempotency_key=key if self.keyed else None)
                    for key in keys
                ],
                on_confirmed=confirmed,
            )
        except Exception as error:  # whatever the broker's state: count it, go on
            kind = type(error).__name__
            if isinstance(error, PublishBatchError):
                kinds = {type(e).__name__ for e in error.failed.values()}
                kind = f"{kind} ({', '.join(sorted(kinds))})"
            now = time.time()
            with self.lock:
                self.errors[kind] += 1
                self.messages.setdefault(kind, str(error))
                for key in keys:
                    if key not in self.confirmed:
                        self.failed[key] = now
