"""Options shared by the command groups of the ``broker-jobs`` command line."""

from __future__ import annotations

import getpass
import math
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import click

from broker_jobs.errors import ConfigurationError
from broker_jobs.observe.logs import LOG_FORMATS, LOG_LEVELS
from broker_jobs.urls import BrokerURLs
from scheduler.config import parse_duration
from scheduler.errors import ScheduleError

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """Seconds, as a number (``30``, ``2.5``) or a duration as beat's schedules take
    it (``90s``, ``5m``, ``1h30m``, ``1d``); never negative."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float) or _is_number(value):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration("a duration", value.strip()).total_seconds()
            except ScheduleError:
                self.fail(
                    f"{value!r} is not a duration: seconds (30, 2.5) or 90s, 5m, 1h30m, 1d",
                    param,
                    ctx,
                )
        if seconds < 0:
            self.fail(f"{value!r} is negative", param, ctx)
        return seconds


F = TypeVar("F", bound=Callable[..., Any])


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _broker_urls(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> BrokerURLs:
    """The ``--url`` values (each may list URLs separated by commas) as one list."""
    try:
        return BrokerURLs.parse(value)
    except ConfigurationError as error:  # the message masks passwords
        raise click.BadParameter(str(error)) from None


#: ``--url``, repeatable; the command function gets a :class:`BrokerURLs` named ``url``.
url_option = click.option(
    "--url",
    envvar="BROKER_JOBS_URL",
    multiple=True,
    default=(DEFAULT_URL,),
    callback=_broker_urls,
    metavar="URL",
    show_default="$BROKER_JOBS_URL or amqp://guest:***@localhost:5672/",
    help="AMQP URL of the broker (amqps:// for TLS). For the nodes of a cluster, repeat"
    " --url or separate URLs with commas (in BROKER_JOBS_URL: commas or spaces): the"
    " first node that answers is used, the others when its connection is lost. Write a"
    " comma inside a password as %2C.",
)

#: ``--app MODULE:APP`` (or ``BROKER_JOBS_APP``): how every command names the app. The
#: worker and beat also take it as their first argument, as they always did.
app_option = click.option(
    "--app",
    "app_option",
    metavar="MODULE:APP",
    envvar="BROKER_JOBS_APP",
    help="The app: the module to import and the App in it, e.g. myproject.tasks:app"
    " ($BROKER_JOBS_APP).",
)


def from_environment(parameter: str) -> bool:
    """Whether the current command's ``parameter`` came from its environment variable
    (``BROKER_JOBS_APP``...): an explicit option given with it wins over it."""
    context = click.get_current_context(silent=True)
    if context is None:
        return False
    return context.get_parameter_source(parameter) is click.core.ParameterSource.ENVIRONMENT


app_argument = click.argument("app_argument", metavar="[MODULE:APP]", required=False)


def chosen_app(option: str | None, argument: str | None) -> str:
    """The app path given as ``--app`` or as the first argument (not both, unless equal)."""
    if option and argument and option != argument:
        raise click.UsageError(f"two apps given: --app {option} and {argument}; give one")
    path = option or argument
    if not path:
        raise click.UsageError("no app given: add --app MODULE:APP, e.g. --app myproject.tasks:app")
    return path


#: The embedded default: an SQLite file in the working directory.
DEFAULT_STORE = "sqlite:///broker-jobs.db"

store_option = click.option(
    "--store",
    "store_url",
    envvar="BROKER_JOBS_STORE",
    default=DEFAULT_STORE,
    show_default=True,
    show_envvar=True,
    metavar="STORE_URL",
    help="The ledger (idempotency store) the workers share: sqlite:///path.db,"
    " postgresql://..., memory:// (tests only).",
)


def log_options(function: F) -> F:
    """``--log-level`` and ``--log-format`` of a daemon; the command function gets
    ``log_level`` and ``log_format`` and passes them to :func:`configure_logging`."""
    function = click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        default="text",
        show_default=True,
        envvar="BROKER_JOBS_LOG_FORMAT",
        show_envvar=True,
        help="text for people; json: one object per line for log shippers (docs/metrics.md).",
    )(function)
    return click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="info",
        show_default=True,
        envvar="BROKER_JOBS_LOG_LEVEL",
        show_envvar=True,
        help="The lowest level logged.",
    )(function)


#: ``--metrics-port``: serve /metrics, /healthz and /readyz there (off by default).
metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="BROKER_JOBS_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus /metrics, /healthz and /readyz on this port (default: off).",
)

#: ``--no-declare``: a daemon that declares nothing, for a topology the operator applies.
no_declare_option = click.option(
    "--no-declare", is_flag=True, help="Declare nothing; the topology is operator-managed."
)


def daemon_options(function: F) -> F:
    """What every daemon (``worker``, ``beat``) takes alike, first in its help: --url,
    the app (as --app or as the first argument: pass ``app_option`` and
    ``app_argument`` to :func:`chosen_app`), --store, --no-declare, --metrics-port and
    the log options (:func:`log_options`)."""
    for option in (
        log_options,
        metrics_port_option,
        no_declare_option,
        store_option,
        app_option,
        app_argument,
        url_option,
    ):
        function = option(function)
    return function


def who_asks() -> str:
    """Who gives an operator's command, as the ledger records it: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in this container
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
