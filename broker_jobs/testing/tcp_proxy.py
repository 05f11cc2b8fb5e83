"""A TCP proxy that fault tests put between a client and the broker to break the network.

:meth:`TcpProxy.cut` is a silent partition: both sockets of every connection stay open,
no FIN or RST reaches either side, and no byte passes in either direction until
:meth:`TcpProxy.heal`, when the bytes held meanwhile flow on, in order, none lost (as TCP
would retransmit them). A close by one side during the cut is passed on after the heal.
New connections during a cut are accepted but not connected upstream until the heal.
:meth:`TcpProxy.drop` closes every connection with an RST to both sides (as a firewall
or a rebooted host would reset them); the proxy keeps accepting.

What a user-space proxy cannot fake: the proxy's kernel still ACKs what each side sends
while cut, so a sender's socket buffers fill before its writes block, and its TCP never
times out on missing ACKs. Peers notice the cut through their own timeouts (AMQP
heartbeats, confirm timeouts), which is what the tests are about.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

#: SO_LINGER on, 0 s: close() sends an RST instead of a FIN.
_LINGER_RST = struct.pack("ii", 1, 0)
_CHUNK = 65536


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's socket and ours to the upstream."""

    client: socket.socket
    dropped: bool = False
    #: Pump threads still running (one per direction).
    pumps: int = 2
    sockets: list[socket.socket] = field(default_factory=list)


class TcpProxy:
    """Listens on 127.0.0.1 (a free port unless given) and forwards each connection to
    ``upstream``: a ``(host, port)`` pair or a URL (``amqp://user:pw@host:port/vhost``;
    :attr:`url` is then the same URL through the proxy).

    ``start()`` returns the proxy, so ``proxy = TcpProxy(url).start()`` works, and so
    does ``with TcpProxy(url) as proxy:``. Threads: one accepting, two per connection.
    """

    def __init__(self, upstream: str | tuple[str, int], *, port: int = 0) -> None:
        if isinstance(upstream, str):
            parts = urlsplit(upstream)
            default_port = 5671 if parts.scheme == "amqps" else 5672
            self.upstream: tuple[str, int] = (
                parts.hostname or "localhost",
                parts.port or default_port,
            )
            self._upstream_url: str | None = upstream
        else:
            self.upstream = upstream
            self._upstream_url = None
        self._port = port
        self._listener: socket.socket | None = None
        self._lock = threading.Condition()
        self._cut = False
        self._stopped = False
        self._links: list[_Link] = []

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> TcpProxy:
        """Start listening (and accepting, in a daemon thread)."""
        if self._listener is not None:
            raise RuntimeError("TcpProxy already started (a stopped one does not restart)")
        self._listener = socket.create_server(("127.0.0.1", self._port))
        threading.Thread(target=self._accept, name="tcp-proxy-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and close every connection (a FIN to both sides, like an
        orderly close; use :meth:`drop` first for an RST). Idempotent."""
        with self._lock:
            self._stopped = True
            links, self._links = self._links, []
            self._lock.notify_all()
        if self._listener is not None:
            _shutdown(self._listener)  # wakes accept() (Linux)
            _close(self._listener)
        for link in links:
            for sock in link.sockets:
                _shutdown(sock)
                _close(sock)

    close = stop

    def __enter__(self) -> TcpProxy:
        return self if self._listener is not None else self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- where to connect ----------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("TcpProxy not started")
        return int(self._listener.getsockname()[1])

    @property
    def address(self) -> tuple[str, int]:
        """Where clients connect: ``("127.0.0.1", port)``."""
        return ("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        """The upstream URL with host and port replaced by the proxy's (user, password,
        vhost and query kept). Only for a proxy created from a URL."""
        if self._upstream_url is None:
            raise RuntimeError("TcpProxy was given a (host, port), not a URL")
        parts = urlsplit(self._upstream_url)
        userinfo = parts.netloc.rpartition("@")[0]
        hostport = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{userinfo}@{hostport}" if userinfo else hostport))

    @property
    def connections(self) -> int:
        """Connections currently proxied (accepted, not yet closed or dropped)."""
        with self._lock:
            return len(self._links)

    # -- faults --------------------------------------------------------------------------

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> None:
        """Stop passing bytes both ways; every socket stays open (a silent partition)."""
        with self._lock:
            self._cut = True

    def heal(self) -> None:
        """Pass bytes again, first those held since :meth:`cut`."""
        with self._lock:
            self._cut = False
            self._lock.notify_all()

    def drop(self) -> None:
        """Reset every current connection: both sides get an RST (ECONNRESET), nothing
        held is delivered. Later connections are proxied as usual (cut or not)."""
        with self._lock:
            links, self._links = self._links, []
            for link in links:
                link.dropped = True
            self._lock.notify_all()
        for link in links:
            for sock in link.sockets:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
                    # Wakes a pump blocked in recv() without sending anything: a plain
                    # close() would not (its recv keeps the socket alive), shutdown(WR)
                    # would send a FIN before the RST.
                    sock.shutdown(socket.SHUT_RD)
                _close(sock)

    # -- the threads ---------------------------------------------------------------------

    def _passing(self, link: _Link) -> bool:
        """Block while cut; then whether the link should still pass bytes."""
        with self._lock:
            self._lock.wait_for(lambda: not self._cut or self._stopped or link.dropped)
            return not (self._stopped or link.dropped)

    def _accept(self) -> None:
        assert self._listener is not None
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                link = _Link(client, sockets=[client])
                with self._lock:
                    if self._stopped:
                        _close(client)
                        return
                    self._links.append(link)
                threading.Thread(
                    target=self._connect, args=(link,), name="tcp-proxy-link", daemon=True
                ).start()

    def _connect(self, link: _Link) -> None:
        if not self._passing(link):  # a cut holds new connections too
            return
        try:
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
        except OSError:
            with contextlib.suppress(OSError):  # upstream down: the client sees a reset
                link.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
            self._forget(link)
            return
        with self._lock:
            if self._stopped or link.dropped:
                _close(server)
                return
            link.sockets.append(server)
        for source, target in ((link.client, server), (server, link.client)):
            threading.Thread(
                target=self._pump, args=(link, source, target), name="tcp-proxy-pump", daemon=True
            ).start()

    def _pump(self, link: _Link, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(_CHUNK):
                if not self._passing(link):
                    return
                target.sendall(data)
            if self._passing(link):  # the source closed its side: pass the FIN on
                target.shutdown(socket.SHUT_WR)
        except OSError:
            if not link.dropped:  # one side reset or failed: end the other side too
                for sock in link.sockets:
                    _shutdown(sock)
        finally:
            self._pump_done(link)

    def _pump_done(self, link: _Link) -> None:
        """Once both directions finished, close the link's sockets and forget it."""
        with self._lock:
            link.pumps -= 1
            if link.pumps > 0:
                return
        self._forget(link)

    def _forget(self, link: _Link) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._links.remove(link)
        for sock in link.sockets:
            _close(sock)


def _shutdown(sock: socket.socket) -> None:
    """FIN to the peer, and wake a thread blocked on the socket (close() alone would
    not: the blocked call keeps the socket open)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
