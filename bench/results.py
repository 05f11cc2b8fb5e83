"""``python -m bench.results``: what keeping a handler's result costs per job.

One worker drains ``--jobs`` jobs of one task, on an SQLite and a PostgreSQL ledger,
for three handlers side by side in interleaved rounds: ``none`` returns None (the
fast path's batched successes: the code path of a handler that uses none of this,
as before results existed), ``result`` returns a small dict (kept with its success:
a record call of its own, the result in the same transaction), ``opted-out`` returns
the same dict from a task declared ``keep_result=False``. Figures: jobs/s (median of
the rounds, with their spread) and each variant's ratio to ``none`` on the same
ledger; microseconds per job more than ``none``.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.common import (
    Admin,
    add_number,
    bench_parser,
    from_args,
    print_config,
    run_bench,
    throwaway_postgres,
)
from bench.figures import round_order, spread
from broker_jobs import App, JobRequest, Publisher
from broker_jobs.store import PostgresStore, SQLiteStore, Store
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.worker import Worker, WorkerSettings

VARIANTS = ("none", "result", "opted-out")
LEDGERS = ("sqlite", "postgres")


class Item(BaseModel):
    n: int


@dataclass(frozen=True)
class Options:
    url: str | None
    jobs: int
    rounds: int
    concurrency: int


def make_app(namespace: str) -> App:
    app = App(namespace=namespace)

    @app.task("bench.none", time_limit=60)
    def none(payload: Item) -> None:
        return None

    @app.task("bench.result", time_limit=60)
    def result(payload: Item) -> dict[str, Any]:
        return {"n": payload.n, "status": "done"}

    @app.task("bench.opted-out", keep_result=False, time_limit=60)
    def opted_out(payload: Item) -> dict[str, Any]:
        return {"n": payload.n, "status": "done"}

    return app


@contextlib.contextmanager
def ledger(kind: str, workdir: Path, dsn: str) -> Iterator[Store]:
    """A fresh ledger of ``kind`` for one round (a new file, a new schema)."""
    if kind == "sqlite":
        with SQLiteStore(workdir / f"{uuid.uuid4().hex}.db") as store:
            yield store
        return
    with PostgresStore(dsn, schema=f"b_{uuid.uuid4().hex[:10]}") as store:
        yield store


def drain(options: Options, url: str, app: App, variant: str, store: Store) -> float:
    """Publish ``options.jobs`` jobs of the variant's task, then time one burst worker
    draining them: jobs/s."""
    task = f"bench.{variant}"
    with Publisher(url, app) as publisher:
        publisher.publish_many([JobRequest(task, Item(n=n)) for n in range(options.jobs)])
    settings = WorkerSettings(burst=True, concurrency=options.concurrency, tasks=(task,))
    started = time.perf_counter()
    outcomes = asyncio.run(Worker(url, app, store, settings).run())
    elapsed = time.perf_counter() - started
    if outcomes["succeeded"] != options.jobs:
        raise SystemExit(f"{variant}: {dict(outcomes)} of {options.jobs} jobs")
    return options.jobs / elapsed


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    namespace = f"bench-results-{uuid.uuid4().hex[:6]}"
    app = make_app(namespace)
    admin = Admin(url)
    config = {
        "jobs per round": options.jobs,
        "rounds": f"{options.rounds} (variants interleaved, each rotation forward then backward)",
        "worker": f"in-process, --burst, --concurrency {options.concurrency}",
        "ledgers": "SQLite (a new file per round), PostgreSQL (a new schema per round)",
        "broker": "a throwaway node" if node else "given",
    }
    print_config("What keeping a handler's result costs (bench.results)", config, 16)
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        admin.declare(app.topology())
        with throwaway_postgres() as postgres, tempfile.TemporaryDirectory() as tmp:
            for index in range(options.rounds):
                for kind in LEDGERS:
                    for variant in round_order(VARIANTS, index):
                        with ledger(kind, Path(tmp), postgres.dsn) as store:
                            rate = drain(options, url, app, variant, store)
                        rates.setdefault((kind, variant), []).append(rate)
                        print(f"round {index + 1} {kind:<8} {variant:<9} {rate:8.0f} jobs/s")
    finally:
        admin.delete(app.topology())
        admin.close()
    return report(rates)


def report(rates: dict[tuple[str, str], list[float]]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    print()
    print(f"{'ledger':<9} {'handler':<10} {'jobs/s':>8} {'rounds':>13} {'ratio':>6} {'us/job':>7}")
    for kind in LEDGERS:
        base = statistics.median(rates[kind, "none"])
        for variant in VARIANTS:
            found = rates[kind, variant]
            median = statistics.median(found)
            ratio = median / base
            extra = (1 / median - 1 / base) * 1e6
            print(
                f"{kind:<9} {variant:<10} {median:8.0f} {min(found):6.0f}-{max(found):<6.0f}"
                f" {ratio:6.2f} {extra:+7.0f}"
            )
            figures[f"{kind}.{variant}"] = {
                "jobs_per_s": spread(found, digits=0),
                "ratio_to_none": round(ratio, 3),
                "extra_us_per_job": round(extra),
            }
    return figures


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("results", __doc__)
    add_number(parser, "--jobs", int, 2000, "jobs per round and variant")
    add_number(parser, "--rounds", int, 3, "rounds")
    add_number(parser, "--concurrency", int, 8, "handler threads")
    return from_args(Options, parser.parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    return run_bench(parse_args(argv), bench)


if __name__ == "__main__":
    sys.exit(main())
