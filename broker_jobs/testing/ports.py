"""Ports for throwaway servers (RabbitMQ nodes, PostgreSQL): free, and below the
kernel's ephemeral range.

A port the kernel picks with ``bind(0)`` comes from the ephemeral range, which is
also where a client's own end of a connection comes from. A server stopped for a
fault test leaves its port free, and a flood of reconnects to it can then connect a
client to itself on that port (TCP simultaneous open): the server cannot start again
("address in use"). Ports below the range are never a client's.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The lowest port handed out; below it are well-known and registered services.
LOWEST = 20000
#: The first port not handed out: a rabbitmqctl run against a node listens on that
#: node's distribution port + 10000 (up to + 10010), which must not be the port of
#: another node picked here (a node's AMQP port was taken so, once).
HIGHEST = 30000
#: The kernel's default ephemeral range starts here (when its setting cannot be read).
EPHEMERAL_DEFAULT = 32768
#: Fewer ports than this below the ephemeral range: let the kernel pick instead.
ENOUGH = 1000


def port_free(port: int, host: str = "0.0.0.0") -> bool:
    """Nobody listens on ``port`` (SO_REUSEADDR, as servers bind: TIME_WAIT does not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def free_port(avoid: set[int] | frozenset[int] = frozenset()) -> int:
    """A port nobody listens on, below the ephemeral range when there is room, not in
    ``avoid``."""
    high = min(_ephemeral_start(), HIGHEST)
    while True:
        if high - LOWEST >= ENOUGH:
            port = random.randrange(LOWEST, high)
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
        if port not in avoid and port_free(port):
            return port


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_DEFAULT
