"""Timing in ``bench.dashboard``: an action's p50, p95 and max; the store's queries
behind the pages, each on its own; and, on SQLite, their plans (``EXPLAIN QUERY
PLAN``: a ``SCAN`` of the records is a query whose time grows with the ledger)."""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.dashboard.fill import sqlite_text
from bench.dashboard.rows import DEMO_TASKS, TASKS
from broker_jobs.dead_letter import DeadLetterFilter
from broker_jobs.store import Store
from broker_jobs.store.base import Status
from broker_jobs.store.ledger import Filters


@dataclass
class Timing:
    name: str
    samples: list[float]  # ms

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)

    @property
    def p95(self) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]

    def figures(self) -> dict[str, Any]:
        return {
            "p50_ms": round(self.p50, 2),
            "p95_ms": round(self.p95, 2),
            "max_ms": round(max(self.samples), 2),
            "n": len(self.samples),
        }


def timed(name: str, action: Callable[[], object], requests: int) -> Timing:
    """``action`` once to warm up, then ``requests`` times, each timed."""
    action()
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return Timing(name, samples)


def print_timings(title: str, timings: Sequence[Timing], aim: float | None = None) -> None:
    print(f"\n{title}")
    width = max(len(t.name) for t in timings)
    print(f"  {'':{width}}  {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for t in timings:
        mark = ""
        if aim is not None:
            mark = "  ok" if t.p50 < aim else f"  ABOVE {aim:g} ms"
        print(f"  {t.name:{width}}  {t.p50:8.2f} {t.p95:8.2f} {max(t.samples):8.2f}{mark}")


def deep_cursor(
    store: Store, depth: int, *, oldest_first: bool = False
) -> tuple[datetime, str] | None:
    """The cursor of the page ``depth`` records down /jobs' unfiltered order (newest
    updated first, or oldest), found by following pages of 1000 (the way a reader
    gets there, without OFFSET)."""
    after: tuple[datetime, str] | None = None
    left = depth
    while left > 0:
        page = store.page(after=after, limit=min(1000, left), oldest_first=oldest_first)
        if page.after is None:
            return after
        after = page.after
        left -= len(page.records)
    return after


def store_timings(store: Store, requests: int, depth: int) -> list[Timing]:
    """The store's queries behind the dashboard's pages, each on its own."""
    some = store.find(status=Status.DEAD, limit=1) or store.find(limit=1)
    key = some[0].idempotency_key if some else "missing"
    deep = deep_cursor(store, depth)
    deep_oldest = deep_cursor(store, depth, oldest_first=True)
    return [
        timed("counts()", store.counts, requests),
        timed("task_summaries()", store.task_summaries, requests),
        timed("find(limit=50)", lambda: store.page(limit=50), requests),
        timed(f"find(after=<{depth}th>)", lambda: store.page(after=deep, limit=50), requests),
        timed("find(oldest first)", lambda: store.page(limit=50, oldest_first=True), requests),
        timed(
            f"find(oldest first, after=<{depth}th>)",
            lambda: store.page(after=deep_oldest, limit=50, oldest_first=True),
            requests,
        ),
        timed("find(status=failed)", lambda: store.page(status=Status.FAILED, limit=50), requests),
        timed("find(status=dead)", lambda: store.page(status=Status.DEAD, limit=50), requests),
        timed("find(task=email.send)", lambda: store.page(task="email.send", limit=50), requests),
        timed(
            "find(task, status=failed)",
            lambda: store.page(task="email.send", status=Status.FAILED, limit=50),
            requests,
        ),
        timed("find(key=prefix)", lambda: store.page(key=key[:13], limit=50), requests),
        *count_timings(store, requests, key),
        timed("lookup(ref)", lambda: store.lookup(key), requests),
        timed("executions(key)", lambda: store.executions(key), requests),
        *letter_timings(store, requests, key),
    ]


def count_timings(store: Store, requests: int, key: str) -> list[Timing]:
    """``Store.count`` behind the jobs list's "N matching": every matching entry of an
    index is read, so the loosest filters cost the most."""
    failed, succeeded, dead = Status.FAILED, Status.SUCCEEDED, Status.DEAD
    return [
        timed("count()", store.count, requests),
        timed("count(status=succeeded)", lambda: store.count(status=succeeded), requests),
        timed("count(status=failed)", lambda: store.count(status=failed), requests),
        timed("count(task=email.send)", lambda: store.count(task="email.send"), requests),
        timed(
            "count(task, status=dead)",
            lambda: store.count(task="email.send", status=dead),
            requests,
        ),
        timed(
            "count(task, status=succeeded)",
            lambda: store.count(task="email.send", status=succeeded),
            requests,
        ),
        timed("count(key=prefix)", lambda: store.count(key=key[:13]), requests),
        timed("count(key=short prefix)", lambda: store.count(key=key[:4]), requests),
    ]


def letter_timings(store: Store, requests: int, key: str) -> list[Timing]:
    """The index of dead letters' queries behind /dead-letters and a dead job's page."""
    tasks = list(dict.fromkeys([*TASKS, *DEMO_TASKS]))
    deepest = max(0, sum(store.dead_letter_counts(tasks).values()) - 50)
    schema = DeadLetterFilter(reasons=frozenset({"schema"}))
    refused = DeadLetterFilter(error="refused")
    return [
        timed("dead_letters(limit=200)", lambda: store.dead_letters(tasks, limit=200), requests),
        timed(
            f"dead_letters(offset={deepest})",
            lambda: store.dead_letters(tasks, limit=50, offset=deepest),
            requests,
        ),
        timed("dead_letter_counts()", lambda: store.dead_letter_counts(tasks), requests),
        timed(
            "dead_letters(ref=key)",
            lambda: store.dead_letters(tasks, DeadLetterFilter(ref=key)),
            requests,
        ),
        timed(
            "dead_letters(reason=schema)",
            lambda: store.dead_letters(tasks, schema, limit=200),
            requests,
        ),
        timed(
            "dead_letter_counts(reason)", lambda: store.dead_letter_counts(tasks, schema), requests
        ),
        timed(
            "dead_letters(error=...)",
            lambda: store.dead_letters(tasks, refused, limit=200),
            requests,
        ),
        timed(
            "dead_letter_counts(error)", lambda: store.dead_letter_counts(tasks, refused), requests
        ),
    ]


def sqlite_plans(path: Path) -> dict[str, list[str]]:
    """``EXPLAIN QUERY PLAN`` of the SQLite store's queries behind the pages."""
    from broker_jobs.store import sqlite_statements as s  # noqa: PLC0415

    now = datetime.now(UTC)
    after = (now - timedelta(days=1), "0")
    cases: dict[str, Filters] = {
        "find()": Filters(),
        "find(after)": Filters(after=after),
        "find(oldest first)": Filters(oldest_first=True),
        "find(oldest first, after)": Filters(after=after, oldest_first=True),
        "find(status)": Filters(status=Status.FAILED),
        "find(status, after)": Filters(status=Status.FAILED, after=after),
        "find(task)": Filters(task="email.send"),
        "find(task, status)": Filters(task="email.send", status=Status.FAILED),
        "find(key)": Filters(key="0190"),
        "find(since)": Filters(since=now - timedelta(hours=1)),
    }
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    plans = {}
    try:
        for name, filters in cases.items():
            where, params = filters.sql(s._DIALECT)
            order = filters.order_sql(s._DIALECT)
            query = f"SELECT {s._COLUMNS} FROM broker_jobs_records {where} {order} LIMIT :limit"
            plans[name] = explain(conn, query, {**params, "limit": 51})
        counted: dict[str, Filters] = {
            "count()": Filters(),
            "count(status)": Filters(status=Status.SUCCEEDED),
            "count(task)": Filters(task="email.send"),
            "count(task, status)": Filters(task="email.send", status=Status.DEAD),
            "count(key)": Filters(key="0190"),
        }
        for name, filters in counted.items():
            where, params = filters.sql(s._DIALECT)
            query = f"SELECT count(*) FROM broker_jobs_records {where}"
            plans[name] = explain(conn, query, params)
        window = {
            "now": sqlite_text(now),
            "minute": sqlite_text(now - timedelta(minutes=1)),
            "hour": sqlite_text(now - timedelta(hours=1)),
            "cap": 1000,
        }
        plans["task_summaries: counts"] = explain(conn, s._COUNTS, window)
        plans["task_summaries: finished"] = explain(conn, s._FINISHED_COUNTS, window)
        plans["task_summaries: durations"] = explain(conn, s._DURATIONS, window)
        plans["counts()"] = explain(
            conn, "SELECT status, count(*) FROM broker_jobs_records GROUP BY status", {}
        )
    finally:
        conn.close()
    return plans


def explain(conn: sqlite3.Connection, query: str, params: dict[str, Any]) -> list[str]:
    return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", params)]


def print_plans(plans: dict[str, list[str]]) -> None:
    print("\nSQLite query plans (EXPLAIN QUERY PLAN)")
    for name, steps in plans.items():
        scans = any(step.startswith("SCAN") for step in steps)
        print(f"  {name}{'  <- scans' if scans else ''}")
        for step in steps:
            print(f"      {step}")
