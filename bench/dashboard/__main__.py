"""``python -m bench.dashboard``: the run (see :mod:`bench.dashboard`)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import bench.dashboard
from bench.common import bench_parser, broker, from_args, throwaway_postgres
from bench.dashboard.claims import claim_cost
from bench.dashboard.fill import fill_postgres, fill_sqlite
from bench.dashboard.letters import fill_dead_letters
from bench.dashboard.pages import dashboard_settings, declare_topology, page_timings, serving
from bench.dashboard.rows import DEMO_TASKS, TASKS, ledger_rows
from bench.dashboard.timing import print_plans, print_timings, sqlite_plans, store_timings
from broker_jobs import mask_url
from broker_jobs.store import SQLiteStore, Store

DEFAULT_RECORDS = 1_000_000
DEFAULT_DEMO_RECORDS = 30
DEFAULT_REQUESTS = 20
DEFAULT_DEAD_LETTERS = 100_000
#: The aims of the issue: p50 of every page, in ms.
DEMO_AIM_MS = 100.0
BIG_AIM_MS = 300.0


@dataclass(frozen=True)
class Options:
    url: str | None
    store: str
    records: int
    demo_records: int
    requests: int
    depth: int
    days: float
    claims: int
    dead_letters: int
    keep: Path | None


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("dashboard", bench.dashboard.__doc__)
    parser.add_argument(
        "--store",
        default="sqlite",
        help="sqlite (a temporary file), postgres (a throwaway node) or a postgresql:// DSN",
    )
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--demo-records", type=int, default=DEFAULT_DEMO_RECORDS)
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="per page")
    parser.add_argument(
        "--depth", type=int, default=20_000, help="records down /jobs for the deep page"
    )
    parser.add_argument("--days", type=float, default=7.0, help="the span of the ledger")
    parser.add_argument(
        "--claims",
        type=int,
        default=500,
        help="rounds of the claim-cost comparison (SQLite; 0: skip it)",
    )
    parser.add_argument(
        "--dead-letters",
        type=int,
        default=DEFAULT_DEAD_LETTERS,
        help="dead letters indexed in the big ledger (its dead jobs' and made-up ones)",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="a directory to keep the SQLite files in"
    )
    args = parser.parse_args(argv)
    return from_args(Options, args)


@contextlib.contextmanager
def postgres(store: str) -> Iterator[str | None]:
    """The DSN of ``--store``: None for SQLite, a throwaway node for ``postgres``."""
    if store == "sqlite":
        yield None
        return
    if store != "postgres":
        yield store
        return
    with throwaway_postgres() as node:
        yield node.dsn


def one_case(
    options: Options,
    label: str,
    *,
    records: int,
    tasks: dict[str, int],
    dead_letters: int,
    url: str,
    dsn: str | None,
    work: Path,
) -> dict[str, Any]:
    """Fill a store with ``records``, time its queries and the pages over HTTP."""
    from broker_jobs.dashboard.app import create_app  # noqa: PLC0415
    from broker_jobs.store.postgres import PostgresStore  # noqa: PLC0415

    now = datetime.now(UTC)
    rows = ledger_rows(records, now, days=options.days, tasks=tasks)
    started = time.perf_counter()
    store: Store
    if dsn is None:
        path = work / f"{label}.db"
        for old in work.glob(f"{label}.db*"):
            old.unlink()
        written = fill_sqlite(path, rows)
        store = SQLiteStore(path)
    else:
        schema = f"bench_{label}_{uuid.uuid4().hex[:6]}"
        written = fill_postgres(dsn, schema, rows)
        store = PostgresStore(dsn, schema=schema)
    fill = time.perf_counter() - started
    print(f"\n== {label}: {written:,} records written in {fill:.1f} s", flush=True)
    started = time.perf_counter()
    letters = fill_dead_letters(store, dead_letters, list(tasks), now)
    print(f"  {letters:,} dead letters indexed in {time.perf_counter() - started:.1f} s")
    figures: dict[str, Any] = {"records": written, "fill_s": round(fill, 1)}
    figures["dead_letters"] = letters
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    delete = declare_topology(url, namespace, list(tasks))
    try:
        counts = store.counts()
        print("  " + ", ".join(f"{s.value} {n:,}" for s, n in counts.items()))
        depth = min(options.depth, max(1, written // 2))
        aim = DEMO_AIM_MS if records <= 10_000 else BIG_AIM_MS
        queries = store_timings(store, options.requests, depth)
        print_timings(f"{label}: the store's queries (ms)", queries)
        settings = dashboard_settings(store, url, namespace, list(tasks))
        with serving(create_app(settings)) as base:
            pages = page_timings(base, store, options.requests, depth)
        print_timings(f"{label}: the pages over HTTP (ms; aim: p50 < {aim:g} ms)", pages, aim)
        figures["aim_ms"] = aim
        figures["store"] = {t.name: t.figures() for t in queries}
        figures["pages"] = {t.name: t.figures() for t in pages}
        figures["slowest_page_p50_ms"] = round(max(t.p50 for t in pages), 2)
        figures["aim_met"] = all(t.p50 < aim for t in pages)
        if dsn is None:
            plans = sqlite_plans(work / f"{label}.db")
            print_plans(plans)
            figures["plans"] = plans
    finally:
        store.close()
        delete()
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    print("Dashboard pages: p50/p95 of each page over HTTP (uvicorn in-process)")
    config = {
        "store": "sqlite" if options.store == "sqlite" else "postgresql",
        "records": options.records,
        "demo_records": options.demo_records,
        "requests": options.requests,
        "depth": options.depth,
        "days": options.days,
        "dead_letters": options.dead_letters,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "starlette": version("starlette"),
        "uvicorn": version("uvicorn"),
        "cpus": os.cpu_count(),
    }
    results: dict[str, Any] = {"config": config}
    with contextlib.ExitStack() as stack:
        url, _node = stack.enter_context(broker(options.url))
        dsn = stack.enter_context(postgres(options.store))
        config["broker"] = mask_url(url)
        if options.keep:
            options.keep.mkdir(parents=True, exist_ok=True)
            work = options.keep
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-dash-")))
        for key, value in config.items():
            print(f"  {key}: {value}")
        results["demo"] = one_case(
            options,
            "demo",
            records=options.demo_records,
            tasks=DEMO_TASKS,
            dead_letters=0,
            url=url,
            dsn=dsn,
            work=work,
        )
        if options.records:
            results["big"] = one_case(
                options,
                "big",
                records=options.records,
                tasks=TASKS,
                dead_letters=options.dead_letters,
                url=url,
                dsn=dsn,
                work=work,
            )
        if options.claims and dsn is None:
            cost = claim_cost(work, 50_000, options.claims)
            print(
                f"\nClaim path (SQLite, {cost['records']:,} records, claims of"
                f" {cost['batch']} new jobs, median of {cost['rounds']} each):"
                f" claim_many {cost['claim_with_us']} us with the dashboard's indexes,"
                f" {cost['claim_without_us']} us without (x{cost['claim_ratio']});"
                f" succeed_many {cost['succeed_with_us']} us vs"
                f" {cost['succeed_without_us']} us (x{cost['succeed_ratio']})"
            )
            results["claim_cost"] = cost
    met = all(results[case]["aim_met"] for case in ("demo", "big") if case in results)
    print(f"\nAims (p50 < {DEMO_AIM_MS:g} ms demo, < {BIG_AIM_MS:g} ms big): "
          + ("met" if met else "NOT met"))  # fmt: skip
    results["aims_met"] = met
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
