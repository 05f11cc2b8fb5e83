"""One small HTTP server per process: ``/metrics`` (Prometheus text format),
``/healthz`` (the process lives and its event loop turns) and ``/readyz`` (the
process does its work: connected and consuming, or leading or following).

It runs in a daemon thread of its own (``http.server``), so a scrape or a probe is
answered even while the event loop is busy, and tells the truth about that loop: the
loop beats (:meth:`Health.beat`, called from the loop every second by
:meth:`Health.keep_beating`), and ``/healthz`` fails once the last beat is older than
``stall_after`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from broker_jobs.errors import ConfigurationError

log = logging.getLogger(__name__)

#: How often the event loop beats, and after how long without a beat it counts as stuck.
BEAT_EVERY = 1.0
STALL_AFTER = 10.0


class Health:
    """What ``/healthz`` and ``/readyz`` answer. ``ready`` is asked on the server's
    thread: it must only read state (a flag, a connection's ``is_closed``), returning
    ``(ready, why)`` with ``why`` saying what it waits for when not ready."""

    def __init__(
        self,
        ready: Callable[[], tuple[bool, str]] | None = None,
        *,
        stall_after: float = STALL_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ready = ready or (lambda: (True, "ready"))
        self._stall_after = stall_after
        self._clock = clock
        self._last_beat = clock()

    def beat(self) -> None:
        """The event loop turned (called from the loop)."""
        self._last_beat = self._clock()

    async def keep_beating(self, every: float = BEAT_EVERY) -> None:
        """Beat until cancelled: run it as a task of the loop that does the work."""
        while True:
            self.beat()
            await asyncio.sleep(every)

    def live(self) -> tuple[bool, str]:
        silent = self._clock() - self._last_beat
        if silent > self._stall_after:
            return False, f"the event loop has not turned for {silent:.1f} s"
        return True, "alive"

    def ready(self) -> tuple[bool, str]:
        live, why = self.live()
        if not live:
            return False, why
        try:
            return self._ready()
        except Exception as error:  # a probe must answer, not raise
            return False, f"readiness check failed: {type(error).__name__}: {error}"


class ObservabilityServer:
    """Serves ``registry`` and ``health`` on ``host:port`` (port 0: any free port, see
    :attr:`port`) until :meth:`close`."""

    def __init__(
        self, registry: CollectorRegistry, health: Health, port: int, host: str = "0.0.0.0"
    ) -> None:
        handler = _handler(registry, health)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="broker-jobs metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ObservabilityServer:
        self._thread.start()
        log.info("serving /metrics, /healthz and /readyz on port %d", self.port)
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ObservabilityServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


def process_registry() -> CollectorRegistry:
    """A registry for a daemon's own metrics, with the process's beside them:
    ``process_*`` (CPU seconds, resident memory, open and max file descriptors, start
    time; Linux), ``python_info`` and ``python_gc_*`` (docs/metrics.md, "Process")."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


@contextlib.asynccontextmanager
async def serving(registry: CollectorRegistry, health: Health, port: int) -> AsyncIterator[None]:
    """Serve ``registry`` and ``health`` on ``port`` while the block runs, the running
    event loop beating for /healthz from a task of its own (worker, beat, exporter).
    A port that cannot be bound is a :class:`ConfigurationError` saying so."""
    try:
        server = ObservabilityServer(registry, health, port)
    except OSError as error:  # taken, or not ours to bind
        raise ConfigurationError(f"cannot serve metrics on port {port}: {error}") from None
    with server:
        beating = asyncio.create_task(health.keep_beating())
        try:
            yield
        finally:
            beating.cancel()


def _handler(registry: CollectorRegistry, health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/healthz":
                self._probe(*health.live())
            elif path == "/readyz":
                self._probe(*health.ready())
            else:
                self._send(404, "text/plain; charset=utf-8", b"try /metrics, /healthz, /readyz\n")

        def _probe(self, ok: bool, why: str) -> None:
            body = json.dumps({"ok": ok, "status": why}).encode() + b"\n"
            self._send(200 if ok else 503, "application/json", body)

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Scrapes and probes every few seconds are not worth a log line each."""

    return Handler
