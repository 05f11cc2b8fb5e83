"""Check that a broker can hold a topology before anything depends on it.

Each check ends ``ok``, ``warning`` (could not tell; says how to find out) or
``problem`` (must be fixed; says how). What the broker cannot tell over AMQP comes
from ``rabbitmqctl`` when the operator gives a command line that reaches the node
(``--rabbitmqctl``); otherwise the feature checks probe with temporary objects.

Measured on RabbitMQ 3.10.8, and why the probes are what they are:

- with the ``quorum_queue`` feature flag disabled, declaring a quorum queue closes
  the *connection* with ``541 INTERNAL_ERROR ... the corresponding feature flag is
  disabled``;
- with ``stream_queue`` disabled (a node upgraded from 3.8, e.g. Debian 11 to 12),
  a quorum queue declared with ``x-dead-letter-strategy=at-least-once`` is accepted
  and silently falls back to at-most-once (the node only logs a warning). Declaring
  a temporary *stream* queue is what tells: it fails as above while the flag is off.
- ``consumer_timeout`` is not visible over AMQP.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

import pika
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from topology import delay
from topology import names as n
from topology.model import Topology

Connect = Callable[[], pika.BlockingConnection]
#: Runs rabbitmqctl with the given arguments and returns its stdout.
Ctl = Callable[[Sequence[str]], str]

#: at-least-once dead-lettering appeared in 3.10; earlier brokers ignore the argument.
MINIMUM_VERSION = (3, 10)
#: RabbitMQ's default consumer_timeout (3.8.15 and later).
DEFAULT_CONSUMER_TIMEOUT_MS = 1_800_000
_DISABLED_FLAG = "feature flag is disabled"
_ACCESS_REFUSED = 403
_CONSUMER_TIMEOUT_HINT = (
    "rabbitmqctl environment | grep consumer_timeout  (3.x), or"
    " rabbitmq-diagnostics environment | grep consumer_timeout; the default is"
    " 1800000 ms (30 min)"
)


class Level(StrEnum):
    OK = "ok"
    WARNING = "warning"
    PROBLEM = "problem"


@dataclass(frozen=True)
class Check:
    title: str
    level: Level
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Needs:
    """What the topology asks of the broker, and the longest a task may run."""

    quorum: bool = True
    at_least_once: bool = True
    max_task_timeout: float | None = None

    @classmethod
    def of(cls, topology: Topology, max_task_timeout: float | None = None) -> Needs:
        arguments = [queue.arguments for queue in topology.queues]
        return cls(
            quorum=any(a.get(n.ARG_QUEUE_TYPE) == "quorum" for a in arguments),
            at_least_once=any(
                a.get(n.ARG_DEAD_LETTER_STRATEGY) == "at-least-once" for a in arguments
            ),
            max_task_timeout=max_task_timeout,
        )


class CtlError(Exception):
    """rabbitmqctl could not be run or failed."""


def rabbitmqctl(command: str, timeout: float = 60.0) -> Ctl:
    """A :data:`Ctl` running ``command`` (e.g. ``"rabbitmqctl -n rabbit@db1"`` or
    ``"docker compose exec -T rabbitmq rabbitmqctl"``) with extra arguments."""
    base = shlex.split(command)

    def run(arguments: Sequence[str]) -> str:
        line = " ".join([command, *arguments])
        try:
            result = subprocess.run(
                [*base, *arguments], capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise CtlError(f"cannot run `{line}`: {error}") from None
        if result.returncode != 0:
            output = (result.stderr or result.stdout).strip().splitlines()
            raise CtlError(f"`{line}` exited {result.returncode}: {' '.join(output[-3:])}")
        return result.stdout

    return run


def preflight(
    connect: Connect, needs: Needs, probe_prefix: str, ctl: Ctl | None = None
) -> list[Check]:
    """Run every check. ``probe_prefix`` starts the names of temporary objects (the
    namespace, so an operator limited to it may declare them)."""
    link = _Link(connect)
    try:
        version, server = _server(link.get())
        checks = [_version_check(version, server)]
        flags, flag_note = _feature_flags(ctl)
        if needs.quorum:
            checks.append(_quorum_check(link, probe_prefix, flags, flag_note))
        if needs.at_least_once:
            checks.append(_at_least_once_check(link, probe_prefix, version, flags, flag_note))
        checks.append(_consumer_timeout_check(ctl, needs.max_task_timeout))
    finally:
        link.close()
    return checks


class _Link:
    """A connection that reopens after a probe made the broker close it (541)."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._connection: pika.BlockingConnection | None = None

    def get(self) -> pika.BlockingConnection:
        if self._connection is None or not self._connection.is_open:
            self._connection = self._connect()
        return self._connection

    def close(self) -> None:
        if self._connection is not None and self._connection.is_open:
            self._connection.close()


def _server_text(connection: pika.BlockingConnection) -> dict[str, str]:
    # pika's BlockingConnection keeps the server's connection.start properties on
    # its underlying connection only.
    properties: dict[str, Any] = cast(Any, connection)._impl.server_properties or {}
    return {key: _text(value) for key, value in properties.items() if key != "capabilities"}


def server_version(connection: pika.BlockingConnection) -> tuple[int, ...] | None:
    """The broker's version, e.g. ``(4, 0, 5)``, from the connection's handshake;
    None when it did not say."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", _server_text(connection).get("version", ""))
    return tuple(int(part) for part in match.groups("0")) if match else None


def _server(connection: pika.BlockingConnection) -> tuple[tuple[int, ...] | None, str]:
    text = _server_text(connection)
    version_text = text.get("version", "")
    version = server_version(connection)
    server = f"{text.get('product', 'unknown product')} {version_text or '(version unknown)'}"
    if platform := text.get("platform"):
        server += f" on {platform}"
    return version, server


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _version_check(version: tuple[int, ...] | None, server: str) -> Check:
    title = "server version"
    if version is None:
        return Check(title, Level.WARNING, f"{server}: cannot read the version")
    if version[:2] < MINIMUM_VERSION:
        return Check(
            title,
            Level.PROBLEM,
            f"{server}: at-least-once dead-lettering needs RabbitMQ 3.10 or later",
            "upgrade RabbitMQ (Debian 12 ships 3.10; compose/docker-compose.yml runs 4.x)",
        )
    return Check(title, Level.OK, server)


def _feature_flags(ctl: Ctl | None) -> tuple[dict[str, str] | None, str]:
    """Feature flag states from rabbitmqctl, or None and why not."""
    if ctl is None:
        return None, ""
    try:
        listing = json.loads(ctl(["-q", "list_feature_flags", "--formatter", "json"]))
        return {str(flag["name"]): str(flag["state"]) for flag in listing}, ""
    except (CtlError, ValueError, KeyError, TypeError) as error:
        return None, f"rabbitmqctl did not list the feature flags ({error}); probed instead. "


def _quorum_check(link: _Link, prefix: str, flags: dict[str, str] | None, note: str) -> Check:
    title = "quorum queues"
    fix = "rabbitmqctl enable_feature_flag quorum_queue"
    if flags is not None:
        return _flag_check(title, flags, "quorum_queue", fix)
    outcome = _probe(link, f"{prefix}.preflight.{uuid.uuid4().hex[:8]}", "quorum")
    return _probe_check(title, outcome, note + "a temporary quorum queue was declared", fix)


def _at_least_once_check(
    link: _Link,
    prefix: str,
    version: tuple[int, ...] | None,
    flags: dict[str, str] | None,
    note: str,
) -> Check:
    title = "at-least-once dead-lettering"
    if version is not None and version[:2] < MINIMUM_VERSION:
        return Check(title, Level.PROBLEM, "needs RabbitMQ 3.10 or later", "upgrade RabbitMQ")
    fix = (
        "rabbitmqctl enable_feature_flag stream_queue (RabbitMQ 3.10 and 3.11 need it"
        " for at-least-once; quorum queues declared while it was off may keep"
        " at-most-once: look for 'Falling back to dead-letter-strategy' in the node log)"
    )
    if flags is not None:
        return _flag_check(title, flags, "stream_queue", fix)
    # A quorum queue with at-least-once is accepted even when the strategy is not
    # available; a stream queue is refused then, so it is the probe.
    outcome = _probe(link, f"{prefix}.preflight.{uuid.uuid4().hex[:8]}", "stream")
    how = note + "the stream_queue feature it needs was probed: a temporary stream was declared"
    return _probe_check(title, outcome, how, fix)


def _flag_check(title: str, flags: dict[str, str], flag: str, fix: str) -> Check:
    state = flags.get(flag)
    if state is None:
        # Newer brokers drop flags that every node must have: the feature is built in.
        return Check(title, Level.OK, f"built in (no {flag} feature flag listed)")
    if state == "enabled":
        return Check(title, Level.OK, f"feature flag {flag} is enabled")
    return Check(title, Level.PROBLEM, f"feature flag {flag} is {state}", fix)


def _probe(link: _Link, name: str, queue_type: str) -> str:
    """Declare and delete a temporary queue; "" when it worked, else the refusal."""
    try:
        channel = link.get().channel()
        channel.queue_declare(name, durable=True, arguments={n.ARG_QUEUE_TYPE: queue_type})
        channel.queue_delete(name)
        channel.close()
    except (ChannelClosedByBroker, ConnectionClosedByBroker) as error:
        return f"{error.reply_code} {error.reply_text}"
    return ""


def _probe_check(title: str, outcome: str, how: str, fix: str) -> Check:
    if not outcome:
        return Check(title, Level.OK, f"available ({how} and deleted)")
    if _DISABLED_FLAG in outcome:
        return Check(title, Level.PROBLEM, f"not available: the broker said {outcome!r}", fix)
    if outcome.startswith(str(_ACCESS_REFUSED)):
        return Check(
            title,
            Level.WARNING,
            f"cannot probe: {outcome}",
            "run preflight as a user that may declare in the namespace, or pass"
            " --rabbitmqctl to read the feature flags",
        )
    return Check(title, Level.WARNING, f"cannot tell: the probe failed with {outcome!r}")


def _consumer_timeout_check(ctl: Ctl | None, max_task_timeout: float | None) -> Check:
    title = "consumer_timeout"
    # A consumer may hold a job up to MAX_HOLD before its due time, then runs it.
    needed_ms = None if max_task_timeout is None else (max_task_timeout + delay.MAX_HOLD) * 1000
    need = "" if needed_ms is None else f" (must exceed {needed_ms:.0f} ms for the longest task)"
    if ctl is None:
        return Check(
            title,
            Level.WARNING,
            f"not readable over AMQP{need}",
            f"on the node: {_CONSUMER_TIMEOUT_HINT}; or pass --rabbitmqctl",
        )
    try:
        timeout_ms = _read_consumer_timeout(ctl)
    except CtlError as error:
        hint = f"on the node: {_CONSUMER_TIMEOUT_HINT}"
        return Check(title, Level.WARNING, f"{error}{need}", hint)
    if timeout_ms is None:
        return Check(title, Level.OK, "disabled: a worker may hold a job for any time")
    shown = f"{timeout_ms} ms ({timeout_ms / 60_000:g} min)"
    if needed_ms is None:
        return Check(
            title,
            Level.OK,
            f"{shown}: every job must finish within it; pass --max-task-timeout to compare",
        )
    if timeout_ms > needed_ms:
        return Check(title, Level.OK, f"{shown}{need}")
    # Whole minutes, with half again as margin: the broker checks only periodically.
    suggested = math.ceil(needed_ms * 1.5 / 60_000) * 60_000
    return Check(
        title,
        Level.PROBLEM,
        f"{shown} is too short{need}: the broker would close a worker's channel"
        " mid-job and the job would run again",
        f"set consumer_timeout = {suggested} in rabbitmq.conf and restart the node"
        " (RabbitMQ 3.12 and later also take a per-queue consumer-timeout policy)",
    )


def _read_consumer_timeout(ctl: Ctl) -> int | None:
    """The node's consumer_timeout in ms, None when disabled."""
    raw = ctl(["-q", "eval", "application:get_env(rabbit, consumer_timeout)."]).strip()
    if raw == "undefined":
        return None
    match = re.fullmatch(r"\{ok,\s*(\d+)\}", raw)
    if not match:
        raise CtlError(f"unexpected consumer_timeout {raw!r}")
    return int(match[1])
