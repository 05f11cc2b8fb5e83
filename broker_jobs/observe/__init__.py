"""Seeing a running system: Prometheus metrics, health endpoints, logs, traces.

Each process (worker, beat, exporter) builds its own :class:`CollectorRegistry` and
serves it with :class:`ObservabilityServer`; nothing is registered at import time.
Metric names and labels are documented in ``docs/metrics.md``.
"""

from broker_jobs.observe.logs import LOG_FORMATS, LOG_LEVELS, configure_logging
from broker_jobs.observe.server import Health, ObservabilityServer

__all__ = [
    "Health",
    "ObservabilityServer",
    "configure_logging",
    "LOG_FORMATS",
    "LOG_LEVELS",
]
