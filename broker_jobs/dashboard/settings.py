"""What a dashboard serves and what it allows, and the rule it refuses to start by."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from broker_jobs.app import App
from broker_jobs.errors import ConfigurationError
from broker_jobs.store.base import Store
from broker_jobs.urls import BrokerURLs
from scheduler.schedules import Schedule
from topology.names import Names

#: Where the dashboard listens unless told otherwise: this host only.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: Seconds between the live refreshes of the overview and task pages.
REFRESH_SECONDS = 5
#: The environment variable of ``--token``.
TOKEN_VARIABLE = "BROKER_JOBS_DASHBOARD_TOKEN"


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
    refresh_seconds: int = REFRESH_SECONDS

    def __post_init__(self) -> None:
        check_binding(self.host, allow_actions=self.allow_actions, token=self.token)

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
