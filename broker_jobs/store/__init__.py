"""The idempotency store and job ledger (``docs/store.md``).

The worker claims a job's idempotency key here before running it and records the
outcome before acking; the same records answer "what happened to my job?".

``PostgresStore`` is imported on first use: psycopg takes ~150 ms to import, which
SQLite users should not pay.
"""

from typing import TYPE_CHECKING, Any

from broker_jobs.store.base import DEFAULT_RETENTION, Store
from broker_jobs.store.errors import LeaseLostError, StoreError, StoreUnavailableError
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.records import (
    Claim,
    ClaimOutcome,
    Execution,
    ExecutionOutcome,
    JobRecord,
    LeaderRecord,
    Status,
)
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.store.urls import open_store
from broker_jobs.store.values import MAX_ERROR_BYTES

if TYPE_CHECKING:
    from broker_jobs.store.postgres import PostgresStore

__all__ = [
    # the interface
    "Store",
    "Claim",
    "ClaimOutcome",
    "JobRecord",
    "Execution",
    "ExecutionOutcome",
    "LeaderRecord",
    "Status",
    # errors
    "StoreError",
    "StoreUnavailableError",
    "LeaseLostError",
    # implementations
    "MemoryStore",
    "SQLiteStore",
    "PostgresStore",
    "open_store",
    # limits and defaults
    "MAX_ERROR_BYTES",
    "DEFAULT_RETENTION",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from broker_jobs.store.postgres import PostgresStore  # noqa: PLC0415

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
