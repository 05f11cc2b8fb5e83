"""What a worker is told: its tasks, concurrency, leases, and how it treats the broker."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from broker_jobs.errors import ConfigurationError
from broker_jobs.observe.heartbeat import HEARTBEAT_EVERY
from broker_jobs.store.base import DEFAULT_RETENTION
from broker_jobs.worker.success_summary import SUCCESS_LINES


@dataclass(frozen=True)
class WorkerSettings:
    """``tasks``: the task types to run (None: every task of the app with a handler).
    ``prefetch`` defaults to twice the concurrency plus room for delayed jobs held
    until due (up to 1.2 s each)."""

    tasks: tuple[str, ...] | None = None
    concurrency: int = 4
    prefetch: int | None = None
    burst: bool = False
    grace: float = 30.0
    lease: float = 60.0
    declare: bool = True
    worker_id: str | None = None
    #: The broker's consumer_timeout in seconds (RabbitMQ's default: 30 min). A
    #: delivery unacked for longer gets its channel closed and is redelivered.
    consumer_timeout: float = 1800.0
    #: Finished records older than this are pruned (hourly) from the ledger.
    retention: timedelta = DEFAULT_RETENTION
    #: Seconds without a broker after which the worker gives up (exits with
    #: :data:`~broker_jobs.worker.EXIT_BROKER_UNREACHABLE`); None: never.
    reconnect_timeout: float | None = None
    #: The longest pause between two connection attempts (seconds). Pauses grow
    #: from a tenth of a second to this, each drawn at random in its upper half.
    reconnect_max_delay: float = 1.0
    #: Seconds between the log lines saying that the worker still has no broker.
    still_trying_every: float = 30.0
    #: Seconds a sync handler interrupted at its time limit has to return; a handler
    #: still running then is stuck, and the worker is replaced (exit code 70:
    #: docs/worker.md, *Time limits*).
    overrun_grace: float = 30.0
    #: Seconds between two heartbeats in the ledger (``broker-jobs workers``).
    heartbeat_every: float = HEARTBEAT_EVERY
    #: Worker processes of the command that started this one (its heartbeat says).
    processes: int = 1
    #: How successes are logged: ``summary`` (one INFO line a second counting them,
    #: each at DEBUG) or ``each`` (a line per success at INFO): docs/metrics.md.
    success_lines: str = "summary"

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        if self.success_lines not in SUCCESS_LINES:
            raise ConfigurationError(
                f"success_lines must be one of {', '.join(SUCCESS_LINES)},"
                f" not {self.success_lines!r}"
            )
        if self.prefetch is not None and self.prefetch < self.concurrency:
            raise ConfigurationError(
                f"prefetch ({self.prefetch}) must be at least the concurrency"
                f" ({self.concurrency}): each running job holds one delivery"
            )
        if self.reconnect_timeout is not None and self.reconnect_timeout <= 0:
            raise ConfigurationError(
                "reconnect_timeout must be a positive number of seconds (or None: keep trying)"
            )
        if self.reconnect_max_delay <= 0:
            raise ConfigurationError("reconnect_max_delay must be a positive number of seconds")
        if self.heartbeat_every <= 0:
            raise ConfigurationError("heartbeat_every must be a positive number of seconds")
        if self.overrun_grace <= 0:
            raise ConfigurationError("overrun_grace must be a positive number of seconds")
        if self.lease <= 0:
            # A claim must outlive its own renewal (every sixth of the lease): with 0,
            # every claim failed and the renewal sweep spun the loop.
            raise ConfigurationError("lease must be a positive number of seconds (default 60)")
        if self.grace < 0:
            raise ConfigurationError("grace must be 0 or more seconds (default 30)")

    @property
    def prefetch_count(self) -> int:
        return self.prefetch or self.concurrency * 2 + 64


@dataclass
class ProtocolSettings:
    """What the execution protocol needs to know of its worker."""

    worker_id: str
    #: Seconds a claim stays ours without renewal; renewed every third of it.
    lease: float = 60.0
    confirm_timeout: float = 10.0
    #: WorkerSettings.overrun_grace.
    overrun_grace: float = 30.0
    #: WorkerSettings.grace: how long a stopping worker lets its jobs settle.
    shutdown_grace: float = 30.0

    @property
    def recheck_every(self) -> float:
        """How often a delivery whose job runs under a live lease looks again."""
        return min(5.0, self.lease / 4)

    @property
    def hold_busy_for(self) -> float:
        """How long such a delivery is held before it is handed back to the ladder:
        two leases cover a holder that died (its lease lapses), far below the
        broker's consumer_timeout."""
        return 2 * self.lease
