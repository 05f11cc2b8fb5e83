"""What the dashboard's indexes cost a worker: its claims and successes on an SQLite
ledger with them and without."""

from __future__ import annotations

import sqlite3
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.dashboard.fill import fill_sqlite
from bench.dashboard.rows import TASKS, ledger_rows
from broker_jobs.store import SQLiteStore

#: The indexes the dashboard's queries need, dropped in the "without" file of
#: :func:`claim_cost` (their names in the SQLite schema).
DASHBOARD_INDEXES = ("broker_jobs_records_updated", "broker_jobs_executions_finished")


def claim_cost(directory: Path, records: int, rounds: int, batch: int = 5) -> dict[str, Any]:
    """Median microseconds of a worker's claim of ``batch`` new jobs and of their
    success (``claim_many`` then ``succeed_many``, the SQLite worker's hot path), on
    two stores of ``records`` records: one with :data:`DASHBOARD_INDEXES`, one
    without; interleaved, one claim and success on each per round."""
    from broker_jobs import Job  # noqa: PLC0415

    now = datetime.now(UTC)
    stores = {}
    for variant in ("with", "without"):
        path = directory / f"claims-{variant}.db"
        fill_sqlite(path, ledger_rows(records, now, days=7, tasks=TASKS))
        if variant == "without":
            conn = sqlite3.connect(path, isolation_level=None)
            for name in DASHBOARD_INDEXES:
                conn.execute(f"DROP INDEX IF EXISTS {name}")
            present = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN (?, ?)",
                DASHBOARD_INDEXES,
            ).fetchone()[0]
            conn.close()
            assert present == 0
            # Open without recreating them: the store creates them on open.
            stores[variant] = _store_without_indexes(path)
        else:
            stores[variant] = SQLiteStore(path)
    samples: dict[str, dict[str, list[float]]] = {v: {"claim": [], "succeed": []} for v in stores}
    try:
        for round_ in range(rounds + 20):  # the first 20: warm-up
            order = list(stores) if round_ % 2 else list(reversed(stores))
            for variant in order:
                store = stores[variant]
                jobs = [Job(task="email.send") for _ in range(batch)]
                started = time.perf_counter()
                store.claim_many([(job, "bench-worker") for job in jobs], 30.0)
                claimed = time.perf_counter()
                store.succeed_many([(job.id, "bench-worker") for job in jobs])
                done = time.perf_counter()
                if round_ >= 20:
                    samples[variant]["claim"].append((claimed - started) * 1e6)
                    samples[variant]["succeed"].append((done - claimed) * 1e6)
    finally:
        for store in stores.values():
            store.close()
    figures: dict[str, Any] = {"records": records, "batch": batch, "rounds": rounds}
    for variant, by_step in samples.items():
        for step, values in by_step.items():
            figures[f"{step}_{variant}_us"] = round(statistics.median(values), 1)
    for step in ("claim", "succeed"):
        figures[f"{step}_ratio"] = round(
            figures[f"{step}_with_us"] / figures[f"{step}_without_us"], 3
        )
    return figures


def _store_without_indexes(path: Path) -> SQLiteStore:
    """An :class:`SQLiteStore` on ``path`` that does not create the dashboard's indexes
    (for :func:`claim_cost`'s comparison only)."""
    from broker_jobs.store import sqlite_schema as s  # noqa: PLC0415

    saved = s._CREATE_LEDGER_INDEXES
    s._CREATE_LEDGER_INDEXES = ()  # type: ignore[assignment]
    try:
        return SQLiteStore(path)
    finally:
        s._CREATE_LEDGER_INDEXES = saved
