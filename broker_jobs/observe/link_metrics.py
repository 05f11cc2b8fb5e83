"""Metrics of a daemon's link to the broker, shared by the worker and the beat."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class LinkMetrics:
    """``broker_jobs_broker_connected``, ``..._reconnects_total`` and
    ``..._disconnected_seconds_total`` (docs/metrics.md) in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._connected = Gauge(
            "broker_jobs_broker_connected",
            "1 while connected to a broker node, else 0",
            registry=registry,
        )
        self._reconnects = Counter(
            "broker_jobs_broker_reconnects",
            "Connections re-established after a loss",
            registry=registry,
        )
        self._disconnected = Counter(
            "broker_jobs_broker_disconnected_seconds",
            "Time spent without a broker",
            registry=registry,
        )

    def connected(self) -> None:
        """The first connection is up."""
        self._connected.set(1)

    def lost(self) -> None:
        self._connected.set(0)

    def back(self, outage_seconds: float) -> None:
        """Connected again after ``outage_seconds`` without a broker."""
        self._connected.set(1)
        self._reconnects.inc()
        self._disconnected.inc(max(0.0, outage_seconds))
