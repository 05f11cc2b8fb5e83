"""What a dashboard serves and what it allows, and the rule it refuses to start by."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from broker_jobs.app import App
from broker_jobs.dashboard.history_buckets import HistoryBuckets
from broker_jobs.dashboard.publishing_seen import PublishingSeen
from broker_jobs.dashboard.summaries import LedgerSummaries
from broker_jobs.errors import ConfigurationError
from broker_jobs.ops.status import FoundLanes
from broker_jobs.store.base import Store
from broker_jobs.urls import BrokerURLs
from scheduler.schedules import Schedule
from topology.names import Names

#: Where the dashboard listens unless told otherwise: this host only.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: Seconds between the live refreshes of the overview and task pages.
REFRESH_SECONDS = 5
#: The Host headers a dashboard bound to loopback answers.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
#: The environment variable of ``--token``.
TOKEN_VARIABLE = "BROKER_JOBS_DASHBOARD_TOKEN"


class BrokerSeen:
    """The broker as the dashboard's pages last found it: ``down`` is why it did not
    answer, None while it does (or before any page asked). Written by the request
    threads, one whole value at a time."""

    def __init__(self) -> None:
        self.down: str | None = None


@dataclass(frozen=True)
class DashboardSettings:
    """The open store (the caller closes it), the broker, the tasks shown, and the
    safety switches: read-only unless ``allow_actions``; ``token`` (if set) is asked
    for by every action."""

    store: Store
    urls: BrokerURLs
    names: Names
    tasks: tuple[str, ...]
    app: App | None = None  # None: chosen by --namespace and --task (no schedules then)
    schedules: tuple[Schedule, ...] = ()
    allow_actions: bool = False
    token: str | None = None
    host: str = DEFAULT_HOST
    #: The Host headers served; None: the loopback names when ``host`` is loopback
    #: (see :meth:`served_hosts`), any otherwise.
    allowed_hosts: tuple[str, ...] | None = None
    refresh_seconds: int = REFRESH_SECONDS
    #: The ledger's task summaries, kept a few seconds on a large ledger.
    summaries: LedgerSummaries = field(init=False, repr=False, compare=False)
    #: Whether the broker answered the last page that asked it (every page's banner).
    broker: BrokerSeen = field(init=False, repr=False, compare=False)
    #: The history page's executions per bucket, the closed buckets kept.
    history: HistoryBuckets = field(init=False, repr=False, compare=False)
    #: Without the app, the tasks' queues found on the broker (once per task).
    found_lanes: FoundLanes = field(init=False, repr=False, compare=False)
    #: Whether the broker takes publishes, as last checked (every page's banner).
    publishing: PublishingSeen = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_binding(self.host, allow_actions=self.allow_actions, token=self.token)
        object.__setattr__(self, "summaries", LedgerSummaries(self.store))
        object.__setattr__(self, "broker", BrokerSeen())
        object.__setattr__(self, "history", HistoryBuckets(self.store))
        object.__setattr__(self, "found_lanes", FoundLanes())
        object.__setattr__(self, "publishing", PublishingSeen(self.urls))

    @property
    def lanes(self) -> dict[str, tuple[str, ...]] | FoundLanes:
        """The queues of each task that has several: from the app, else found on the
        broker."""
        return self.found_lanes if self.app is None else self.app.lanes_by_task()

    def served_hosts(self) -> tuple[str, ...]:
        """Which ``Host`` headers are answered. Bound to loopback, only loopback names:
        a web page whose own host name an attacker points at 127.0.0.1 (DNS
        rebinding) would otherwise be same-origin with the dashboard, read its pages
        and its CSRF token, and post. Elsewhere the token guards the actions."""
        if self.allowed_hosts is not None:
            return self.allowed_hosts
        return LOOPBACK_NAMES if is_loopback(self.host) else ("*",)

    def __repr__(self) -> str:  # never print the token
        return (
            f"DashboardSettings(namespace={self.names.namespace!r}, tasks={self.tasks!r},"
            f" host={self.host!r}, allow_actions={self.allow_actions},"
            f" token={'***' if self.token else None})"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_binding(host: str, *, allow_actions: bool, token: str | None) -> None:
    """Refuse actions reachable from other hosts without a token: anyone who can reach
    the port could replay, purge or cancel jobs otherwise."""
    if allow_actions and not token and not is_loopback(host):
        raise ConfigurationError(
            f"--allow-actions on --host {host} (not this machine only) needs a token:"
            " add --token TOKEN (or set BROKER_JOBS_DASHBOARD_TOKEN), or bind to 127.0.0.1"
        )
