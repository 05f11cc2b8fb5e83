"""``broker-jobs dashboard``: a web view of the broker's queues and the ledger.

An ASGI app (Starlette) of server-rendered pages with a JSON API under ``/api/``.
It reads and acts only through the library's Python API (``status_report``, the
``Store`` methods, ``DeadLetterQueues``, the beat's store records), never with SQL or
AMQP of its own. docs/dashboard.md describes the pages, the API and the safety rules.
"""

from __future__ import annotations

from broker_jobs.dashboard.app import create_app
from broker_jobs.dashboard.settings import DashboardSettings, check_binding

__all__ = ["DashboardSettings", "check_binding", "create_app"]
