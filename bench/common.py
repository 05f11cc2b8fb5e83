"""What every benchmark shares: the broker it measures, the admin connection to it,
the command line's common options and the configuration block each one prints first.

The broker is ``--url``, else ``$BROKER_JOBS_BENCH_URL``, else a throwaway RabbitMQ
node started from the local ``rabbitmq-server`` (:func:`broker`) and removed at the
end; :func:`throwaway_postgres` likewise starts a PostgreSQL cluster for one run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import os
import platform
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from broker_jobs import mask_url
from broker_jobs.testing.postgres_node import PostgresNode
from broker_jobs.testing.rabbit_node import RabbitNode
from topology import Topology, declare

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

URL_ENV = "BROKER_JOBS_BENCH_URL"
#: The checkout's root: where the benchmarks' subprocesses run (``python -m bench...``).
REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T", bound="DataclassInstance")


# -- the command line ---------------------------------------------------------------------


def add_url_argument(parser: argparse.ArgumentParser) -> None:
    """``--url``, shared by every benchmark: the broker to measure."""
    parser.add_argument(
        "--url",
        default=os.environ.get(URL_ENV),
        help=f"AMQP URL (default: ${URL_ENV}; neither: start a throwaway RabbitMQ node)",
    )


def bench_parser(
    name: str, doc: str | None, *, url: bool = True, **kwargs: Any
) -> argparse.ArgumentParser:
    """The parser of ``python -m bench.<name>``: described by the first paragraph of
    ``doc`` (the benchmark's docstring), with ``--url`` unless ``url`` is false."""
    parser = argparse.ArgumentParser(
        prog=f"python -m bench.{name}", description=(doc or "").split("\n\n", 1)[0], **kwargs
    )
    if url:
        add_url_argument(parser)
    return parser


def add_number(
    parser: argparse.ArgumentParser,
    flag: str,
    kind: type[int] | type[float],
    default: float,
    what: str,
    *,
    later: bool = False,
) -> None:
    """A numeric option whose help ends with its default: ``rounds (5)``. ``later``:
    the parser's default is None and the benchmark picks the value (``--quick`` has
    defaults of its own)."""
    parser.add_argument(
        flag, type=kind, default=None if later else default, help=f"{what} ({default:g})"
    )


def from_args(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """The options ``cls`` (a dataclass) from the parsed arguments of the same names,
    ``given`` taking precedence."""
    names = {field.name for field in dataclasses.fields(cls)}
    return cls(**{**{k: v for k, v in vars(args).items() if k in names}, **given})


# -- the broker and PostgreSQL --------------------------------------------------------------


@contextlib.contextmanager
def broker(url: str | None) -> Iterator[tuple[str, RabbitNode | None]]:
    """The given broker, or a throwaway node started for this run and removed after."""
    if url:
        yield url, None
        return
    if not RabbitNode.available():
        raise SystemExit(f"no --url, no ${URL_ENV} and no local rabbitmq-server to start")
    node = RabbitNode.create()
    print(f"No --url and no ${URL_ENV}: starting a throwaway RabbitMQ node ({node.nodename})")
    try:
        node.start()
        print(f"Throwaway node up at {mask_url(node.url)}; it is removed at the end")
        yield node.url, node
    finally:
        node.cleanup()


def measure_on_broker(
    url: str | None, measure: Callable[[str, RabbitNode | None], dict[str, Any]]
) -> dict[str, Any]:
    """``measure(url, node)`` on the broker of :func:`broker`, then its figures printed
    as the output's last line: one JSON object."""
    with broker(url) as (found, node):
        figures = measure(found, node)
    print(json.dumps(figures, sort_keys=False))
    return figures


class BrokerOptions(Protocol):
    @property
    def url(self) -> str | None: ...


OptionsT = TypeVar("OptionsT", bound=BrokerOptions)


def run_bench(
    options: OptionsT, bench: Callable[[OptionsT, str, RabbitNode | None], dict[str, Any]]
) -> int:
    """A bench's ``main``: ``bench(options, url, node)`` on the broker ``options.url``
    names (else a throwaway node), its figures printed last; the exit status."""
    measure_on_broker(options.url, functools.partial(bench, options))
    return 0


class QuietNoTimeLimit(logging.Filter):
    """The no-op tasks have no time limit on purpose: drop the worker's warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "has no time limit" not in str(record.msg)


def measure_workers_on_broker(
    url: str | None, measure: Callable[[str, RabbitNode | None], dict[str, Any]]
) -> int:
    """:func:`measure_on_broker` for a benchmark that runs workers in this process,
    without their warning about the no-op tasks' missing time limit; exit code 0."""
    # On the logger that logs it: a logger's filters skip records its children pass up.
    logging.getLogger("broker_jobs.worker.daemon").addFilter(QuietNoTimeLimit())
    measure_on_broker(url, measure)
    return 0


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[PostgresNode]:
    """A PostgreSQL cluster started for this run from the installed server, removed
    after (also when its start fails half-way)."""
    node = PostgresNode.create()
    try:
        node.start()
        print(f"Throwaway PostgreSQL on port {node.port}; it is removed at the end")
        yield node
    finally:
        node.cleanup()


class Admin:
    """A plain pika connection to declare, purge, count and finally delete a run's
    queues and exchanges; as a context manager, closed at its end."""

    def __init__(self, url: str, name: str = "bench admin") -> None:
        parameters = pika.URLParameters(url)
        parameters.heartbeat = 0  # idle while the benchmark runs; must not be dropped
        parameters.client_properties = {"connection_name": name}
        self._connection = pika.BlockingConnection(parameters)
        self._channel = self._connection.channel()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def server_version(self) -> str | None:
        impl = getattr(self._connection, "_impl", None)
        properties = getattr(impl, "server_properties", None) or {}
        found = properties.get("version")
        return found.decode() if isinstance(found, bytes) else found

    def declare(self, topology: Topology) -> None:
        """Declare up front, so the raw variants never depend on running after ours."""
        declare(self._connection, topology)

    def purge(self, queue: str) -> None:
        self._fresh_channel().queue_purge(queue)

    def depth(self, queue: str) -> int:
        """Ready messages in ``queue`` (unacked ones are not counted)."""
        return self._fresh_channel().queue_declare(queue, passive=True).method.message_count or 0

    def consumers(self, queue: str) -> int:
        """Consumers of ``queue`` now."""
        return self._fresh_channel().queue_declare(queue, passive=True).method.consumer_count or 0

    def depth_if_exists(self, queue: str) -> int | None:
        """:meth:`depth`, None if ``queue`` does not exist."""
        try:
            return self.depth(queue)
        except pika.exceptions.ChannelClosedByBroker:
            return None

    def exchange_exists(self, exchange: str) -> bool:
        try:
            self._fresh_channel().exchange_declare(exchange, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return False
        return True

    def delete(self, topology: Topology) -> None:
        self.delete_named(
            [queue.name for queue in topology.queues],
            [exchange.name for exchange in topology.exchanges],
        )

    def delete_named(self, queues: Sequence[str] = (), exchanges: Sequence[str] = ()) -> None:
        for queue in queues:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self._fresh_channel().queue_delete(queue)
        for exchange in exchanges:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self._fresh_channel().exchange_delete(exchange)

    def close(self) -> None:
        with contextlib.suppress(pika.exceptions.AMQPError):
            self._connection.close()

    def _fresh_channel(self) -> BlockingChannel:
        if not self._channel.is_open:
            self._channel = self._connection.channel()
        return self._channel


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess that imports ``bench``: this one's, with the
    checkout first on ``PYTHONPATH`` (``bench`` is not installed), and ``extra``."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **(extra or {}), "PYTHONPATH": path}


# -- the configuration block ------------------------------------------------------------------


def describe_broker(url: str, node: RabbitNode | None, admin: Admin) -> dict[str, Any]:
    """What every benchmark prints about the broker, the client and the machine."""
    server = admin.server_version()
    if server is None and node is not None:
        server = node.server_version()
    return {
        "broker": mask_url(url),
        "broker_origin": "throwaway node" if node is not None else "given",
        "rabbitmq": server or "unknown",
        "python": platform.python_version(),
        "pika": version("pika"),
        "aio_pika": version("aio-pika"),
        "cpus": os.cpu_count(),
    }


def print_config(title: str, config: dict[str, Any], width: int = 16) -> None:
    """The benchmark's title, a line per entry of ``config``, then a blank line."""
    print(title)
    for key, value in config.items():
        print(f"  {key:<{width}} {value}")
    print()
