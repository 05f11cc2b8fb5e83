"""Worker processes: drain rate of ``broker-jobs worker --processes N`` per store.

For each store (memory, SQLite, PostgreSQL) and each process count (1, 2, 4; and 8 for
PostgreSQL: 8 workers sharing one PostgreSQL ledger), ``--jobs`` no-op jobs are
published first (untimed, confirmed) to the task queue of a fresh namespace, then one
``broker-jobs worker --processes N --burst`` command drains them with a fresh ledger.

What is timed: each handler call appends ``time.time()`` to a file of its process; the
drain rate is (jobs - 1) / (last handler start - first handler start), so process
start-up and the burst mode's final emptiness check are not counted. Rounds interleave
the configurations (rotated order, reversed every other round); the report gives
medians, the speed-up over one process and the jobs/s each added process brings.

Also measured, as diagnosis: for PostgreSQL, pg_stat_activity sampled every 50 ms
during each drain (what the active backends wait on), and commits and WAL syncs per
job (pg_stat_database, pg_stat_wal); with a throwaway PostgreSQL, one extra
configuration with ``synchronous_commit=off`` at 4 processes (a diagnosis of fsync
cost, never a default). "Claim latency" is not observable from outside the worker:
the ledger's execution ``started_at`` is the claim's time, and the handler start is
recorded, so the median claim-to-handler-start is reported for SQLite and PostgreSQL.

    python -m bench.scale                      # 20,000 jobs, 3 rounds (~15 min on 2 cores)
    python -m bench.scale --jobs 5000 --rounds 3 --stores sqlite,postgres
    python -m bench.scale --postgres postgresql://postgres@127.0.0.1:5432/postgres

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.common import (
    REPO,
    Admin,
    bench_parser,
    broker,
    describe_broker,
    from_args,
    throwaway_postgres,
)
from bench.figures import round_order
from bench.workers import WORKER_COMMAND
from broker_jobs import App, JobRequest, Publisher
from broker_jobs.store.urls import open_store
from broker_jobs.urls import mask_url

TASK = "bench.noop"
APP_MODULE = "scale_app"
DEFAULT_JOBS, DEFAULT_ROUNDS, DEFAULT_CONCURRENCY = 20_000, 3, 8
STORES = ("memory", "sqlite", "postgres")
PROCESSES = {"memory": (1, 2, 4), "sqlite": (1, 2, 4), "postgres": (1, 2, 4, 8)}
#: The diagnosis configuration: PostgreSQL at 4 processes without waiting for fsyncs.
ASYNC_COMMIT = "postgres sync_commit=off"
DRAIN_TIMEOUT = 600.0
SAMPLE_EVERY = 0.05
PUBLISH_BATCH = 2000
#: Executions read back per configuration for the claim-to-start figure.
LATENCY_SAMPLE = 500

APP_SOURCE = """
    import os, struct, time
    from pydantic import BaseModel
    from broker_jobs import App

    class Noop(BaseModel):
        seq: int

    app = App(namespace=os.environ["BENCH_SCALE_NAMESPACE"])
    _out = None

    @app.task("bench.noop")
    def noop(payload: Noop) -> None:
        # One 12-byte append per job (start time, seq): ~2 us, next to ~0.5 ms a job.
        global _out
        if _out is None:
            path = os.path.join(os.environ["BENCH_SCALE_DIR"], f"starts.{os.getpid()}")
            _out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(_out, struct.pack("<di", time.time(), payload.seq))
"""


class Noop(BaseModel):
    seq: int


@dataclass(frozen=True)
class Options:
    url: str | None
    postgres: str | None
    jobs: int
    rounds: int
    concurrency: int
    stores: tuple[str, ...]
    diagnose: bool


@dataclass(frozen=True)
class Config:
    store: str  # memory, sqlite, postgres, or ASYNC_COMMIT
    processes: int

    @property
    def label(self) -> str:
        return f"{self.store} x{self.processes}"


@dataclass
class Drain:
    rate: float
    wall_s: float
    exit_code: int
    by_process: dict[int, int]
    waits: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    commits_per_job: float | None = None
    wal_syncs_per_job: float | None = None
    claim_to_start_ms: float | None = None


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("scale", __doc__)
    parser.add_argument("--postgres", help="a PostgreSQL DSN (default: a throwaway node)")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--stores", default=",".join(STORES), help="memory,sqlite,postgres")
    parser.add_argument(
        "--no-diagnose", action="store_true", help="skip the synchronous_commit=off run"
    )
    args = parser.parse_args(argv)
    stores = tuple(s.strip() for s in args.stores.split(",") if s.strip())
    if unknown := set(stores) - set(STORES):
        parser.error(f"unknown stores {sorted(unknown)}: use {', '.join(STORES)}")
    return from_args(Options, args, stores=stores, diagnose=not args.no_diagnose)


def configs(options: Options, *, throwaway_pg: bool) -> list[Config]:
    found = [Config(store, n) for store in options.stores for n in PROCESSES[store]]
    if "postgres" in options.stores and options.diagnose and throwaway_pg:
        found.append(Config(ASYNC_COMMIT, 4))
    return found


# -- PostgreSQL ---------------------------------------------------------------------------


@contextlib.contextmanager
def postgres(options: Options) -> Iterator[tuple[str | None, bool]]:
    """The DSN and whether it is a throwaway node of ours (which may be reconfigured)."""
    if "postgres" not in options.stores:
        yield None, False
        return
    if options.postgres:
        yield options.postgres, False
        return
    from broker_jobs.testing.postgres_node import PostgresNode  # noqa: PLC0415

    if not PostgresNode.available():
        raise SystemExit("no --postgres and no local PostgreSQL: use --stores memory,sqlite")
    with throwaway_postgres() as node:
        yield node.dsn, True


def pg_execute(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg  # noqa: PLC0415

    with psycopg.connect(dsn, autocommit=True) as db:
        cursor = db.execute(sql)  # type: ignore[arg-type,unused-ignore]
        return cursor.fetchall() if cursor.description else []


def pg_counters(dsn: str) -> tuple[int, int | None]:
    """(commits of this database, WAL syncs of the server; None before PostgreSQL 14)."""
    commits = pg_execute(
        dsn, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    )[0][0]
    import psycopg  # noqa: PLC0415

    try:
        syncs = pg_execute(dsn, "SELECT wal_sync FROM pg_stat_wal")[0][0]
    except psycopg.Error:  # an older server: no pg_stat_wal
        syncs = None
    return int(commits), None if syncs is None else int(syncs)


class WaitSampler:
    """pg_stat_activity every 50 ms: what the active backends (ours, not the sampler)
    wait on; "CPU" when they wait on nothing."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._stop = threading.Event()
        self.waits: Counter[str] = Counter()
        self.samples = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        import psycopg  # noqa: PLC0415

        query = (
            "SELECT wait_event_type, wait_event FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND state = 'active' AND backend_type = 'client backend'"
        )
        with psycopg.connect(self._dsn, autocommit=True) as db:
            while not self._stop.wait(SAMPLE_EVERY):
                rows = db.execute(query).fetchall()
                self.samples += 1
                for kind, event in rows:
                    self.waits["CPU" if kind is None else f"{kind}:{event}"] += 1


# -- one drain ----------------------------------------------------------------------------


def store_url(config: Config, workdir: Path, dsn: str | None) -> str:
    if config.store == "memory":
        return "memory://"
    if config.store == "sqlite":
        return f"sqlite:///{workdir / 'ledger.db'}"
    # postgres, or ASYNC_COMMIT (the database's synchronous_commit is switched off)
    assert dsn is not None
    separator = "&" if "?" in dsn else "?"
    return f"{dsn}{separator}schema=bsc_{secrets.token_hex(4)}"


def publish(url: str, app: App, jobs: int) -> dict[str, int]:
    """Publish ``jobs`` confirmed jobs; their seq by job id."""
    seqs: dict[str, int] = {}
    with Publisher(url, app) as publisher:
        for start in range(0, jobs, PUBLISH_BATCH):
            batch = [
                JobRequest(TASK, Noop(seq=seq))
                for seq in range(start, min(jobs, start + PUBLISH_BATCH))
            ]
            for seq, job in enumerate(publisher.publish_many(batch), start):
                seqs[job.id] = seq
    return seqs


def read_starts(workdir: Path) -> dict[int, list[tuple[float, int]]]:
    """Per worker pid: (handler start, seq) of every job it ran."""
    found: dict[int, list[tuple[float, int]]] = {}
    for path in workdir.glob("starts.*"):
        data = path.read_bytes()
        found[int(path.suffix[1:])] = [
            struct.unpack_from("<di", data, offset) for offset in range(0, len(data), 12)
        ]
    return found


def claim_to_start_ms(
    store: str, starts: dict[int, list[tuple[float, int]]], seqs: dict[str, int]
) -> float | None:
    """Median of handler start minus the execution's ``started_at`` (the claim's time)
    over a sample of jobs read back from the ledger."""
    started = {seq: at for runs in starts.values() for at, seq in runs}
    gaps = []
    with open_store(store) as ledger:
        for record in ledger.find(task=TASK, limit=LATENCY_SAMPLE):
            executions = ledger.executions(record.idempotency_key)
            seq = seqs.get(record.job_id)
            if executions and seq in started:
                gaps.append((started[seq] - executions[0].started_at.timestamp()) * 1000)
    return statistics.median(gaps) if gaps else None


def drain(url: str, config: Config, options: Options, dsn: str | None) -> Drain:
    """Publish the jobs to a fresh namespace, drain them with one CLI command."""
    namespace = f"bsc{secrets.token_hex(4)}"
    app = App(namespace=namespace)
    app.declare(TASK, Noop)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        workdir = Path(tmp)
        (workdir / f"{APP_MODULE}.py").write_text(textwrap.dedent(APP_SOURCE))
        ledger = store_url(config, workdir, dsn)
        if config.store != "memory":
            open_store(ledger).close()  # the schema first, not raced by the processes
        with Admin(url) as admin:
            try:
                admin.declare(app.topology())
                seqs = publish(url, app, options.jobs)
                run = Run(url, namespace, workdir, ledger, seqs)
                result = _run_worker(run, config, options, dsn)
            finally:
                admin.delete(app.topology())
        if dsn is not None and config.store != "memory" and "schema=" in ledger:
            schema = ledger.rsplit("schema=", 1)[1]
            pg_execute(dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return result


@dataclass(frozen=True)
class Run:
    url: str
    namespace: str
    workdir: Path
    ledger: str
    seqs: dict[str, int]


def _run_worker(run: Run, config: Config, options: Options, dsn: str | None) -> Drain:
    url, workdir, ledger = run.url, run.workdir, run.ledger
    command = [
        *WORKER_COMMAND, "--url", url, f"{APP_MODULE}:app", "--store", ledger, "--burst",
        "--processes", str(config.processes), "--concurrency", str(options.concurrency),
        "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "BENCH_SCALE_NAMESPACE": run.namespace, "BENCH_SCALE_DIR": str(workdir)}
    sampling = dsn is not None and config.store in {"postgres", ASYNC_COMMIT}
    before = pg_counters(dsn) if sampling and dsn else None
    sampler = WaitSampler(dsn) if sampling and dsn else contextlib.nullcontext()
    started = time.monotonic()
    with sampler:
        process = subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, text=True, timeout=DRAIN_TIMEOUT,
            check=False,
        )  # fmt: skip
    wall = time.monotonic() - started
    starts = read_starts(workdir)
    moments = sorted(at for runs in starts.values() for at, _seq in runs)
    ran = len(moments)
    if process.returncode != 0 or ran != options.jobs:
        print(f"  {config.label}: exit {process.returncode}, {ran} of {options.jobs} jobs run")
        print(textwrap.indent(process.stderr[-2000:], "    "))
    rate = (ran - 1) / (moments[-1] - moments[0]) if ran > 1 else 0.0
    result = Drain(rate, wall, process.returncode, {pid: len(r) for pid, r in starts.items()})
    if isinstance(sampler, WaitSampler) and before is not None and dsn is not None:
        after = pg_counters(dsn)
        result.waits, result.samples = sampler.waits, sampler.samples
        result.commits_per_job = (after[0] - before[0]) / max(ran, 1)
        if after[1] is not None and before[1] is not None:
            result.wal_syncs_per_job = (after[1] - before[1]) / max(ran, 1)
    if config.store != "memory":
        result.claim_to_start_ms = claim_to_start_ms(ledger, starts, run.seqs)
    return result


@contextlib.contextmanager
def async_commit(dsn: str) -> Iterator[None]:
    """The throwaway database without waiting for WAL fsyncs at commit (new connections
    take it): a diagnosis of what the fsyncs cost, reset afterwards."""
    pg_execute(dsn, "ALTER DATABASE postgres SET synchronous_commit = off")
    try:
        yield
    finally:
        pg_execute(dsn, "ALTER DATABASE postgres RESET synchronous_commit")


def drain_config(url: str, config: Config, options: Options, dsn: str | None) -> Drain:
    if config.store != ASYNC_COMMIT:
        return drain(url, config, options, dsn)
    assert dsn is not None
    with async_commit(dsn):
        return drain(url, config, options, dsn)


# -- rounds and the report ----------------------------------------------------------------


def run_rounds(
    url: str, options: Options, dsn: str | None, all_configs: list[Config]
) -> dict[str, list[Drain]]:
    results: dict[str, list[Drain]] = {c.label: [] for c in all_configs}
    for number in range(options.rounds):
        figures = []
        for config in round_order(all_configs, number):
            result = drain_config(url, config, options, dsn)
            results[config.label].append(result)
            figures.append(f"{config.label} {result.rate:,.0f}")
        print(f"round {number + 1}: " + ", ".join(figures))
    return results


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(all_configs: list[Config], results: dict[str, list[Drain]]) -> dict[str, Any]:
    """Per configuration: the median rate, the speed-up over the same store with one
    process, and the jobs/s each added process brought."""
    rates = {label: median([d.rate for d in drains]) or 0.0 for label, drains in results.items()}
    summary: dict[str, Any] = {}
    for config in all_configs:
        drains = results[config.label]
        base_store = "postgres" if config.store == ASYNC_COMMIT else config.store
        base = rates.get(Config(base_store, 1).label) or 0.0
        rate = rates[config.label]
        waits: Counter[str] = Counter()
        samples = 0
        for d in drains:
            waits.update(d.waits)
            samples += d.samples
        summary[config.label] = {
            "store": config.store,
            "processes": config.processes,
            "jobs_per_s": round(rate, 1),
            "min": round(min(d.rate for d in drains), 1),
            "max": round(max(d.rate for d in drains), 1),
            "speedup": round(rate / base, 2) if base else None,
            "per_added_process": (
                round((rate - base) / (config.processes - 1), 1)
                if config.processes > 1 and base
                else None
            ),
            "claim_to_start_ms_p50": _rounded(median([d.claim_to_start_ms for d in drains])),
            "commits_per_job": _rounded(median([d.commits_per_job for d in drains])),
            "wal_syncs_per_job": _rounded(median([d.wal_syncs_per_job for d in drains])),
            "pg_waits_per_sample": {
                event: round(count / samples, 2) for event, count in waits.most_common(6)
            }
            if samples
            else None,
            "exit_codes": sorted({d.exit_code for d in drains}),
            "jobs_by_process_last_round": sorted(drains[-1].by_process.values()),
        }
    return summary


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def print_summary(summary: dict[str, Any]) -> None:
    print()
    print(
        f"{'configuration':<28}{'jobs/s':>9}{'min':>8}{'max':>8}{'x1':>7}"
        f"{'+/proc':>9}{'claim->start ms':>17}{'commits/job':>13}{'wal syncs/job':>15}"
    )
    for label, row in summary.items():
        print(
            f"{label:<28}{row['jobs_per_s']:>9,.0f}{row['min']:>8,.0f}{row['max']:>8,.0f}"
            f"{_cell(row['speedup'], '.2f'):>7}{_cell(row['per_added_process'], ',.0f'):>9}"
            f"{_cell(row['claim_to_start_ms_p50'], '.2f'):>17}"
            f"{_cell(row['commits_per_job'], '.2f'):>13}"
            f"{_cell(row['wal_syncs_per_job'], '.2f'):>15}"
        )
    print()
    for label, row in summary.items():
        if row["pg_waits_per_sample"]:
            waits = ", ".join(f"{e} {n:g}" for e, n in row["pg_waits_per_sample"].items())
            print(f"pg_stat_activity, active backends per sample, {label}: {waits}")


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def bench(options: Options) -> dict[str, Any]:
    with broker(options.url) as (url, node), postgres(options) as (dsn, throwaway_pg):
        with Admin(url) as admin:
            described = describe_broker(url, node, admin)
        all_configs = configs(options, throwaway_pg=throwaway_pg)
        config = {
            **described,
            "postgres": None if dsn is None else mask_url(dsn),
            "jobs": options.jobs,
            "rounds": options.rounds,
            "worker": f"broker-jobs worker --processes N --burst --concurrency"
            f" {options.concurrency} --log-level warning",
            "handler": "sync no-op (appends its start time to a file)",
            "measure": "(jobs - 1) / (last handler start - first handler start)",
            "configurations": [c.label for c in all_configs],
        }
        for key, value in config.items():
            print(f"{key}: {value}")
        results = run_rounds(url, options, dsn, all_configs)
    summary = summarise(all_configs, results)
    print_summary(summary)
    return {
        "config": config,
        "summary": summary,
        "rounds": {label: [round(d.rate, 1) for d in drains] for label, drains in results.items()},
    }


#: Where the plot of jobs/s against processes per store goes (docs/scaling.md shows it).
PLOT = REPO / "docs" / "images" / "scaling-processes.png"


def plot(summary: dict[str, Any], config: dict[str, Any], path: Path = PLOT) -> Path | None:
    """Jobs/s against processes, a line per store (matplotlib from the ``bench`` extra;
    without it, no plot and a line saying so)."""
    try:
        import matplotlib  # noqa: PLC0415 - optional: only the plot needs it

        matplotlib.use("Agg")
        from matplotlib import pyplot  # noqa: PLC0415
    except ImportError:
        print("no plot: matplotlib is missing (pip install -e '.[bench]')")
        return None
    figure, axes = pyplot.subplots(figsize=(6.4, 4.0))
    for store in dict.fromkeys(row["store"] for row in summary.values()):
        rows = sorted((r for r in summary.values() if r["store"] == store), key=_processes)
        axes.plot(
            [r["processes"] for r in rows], [r["jobs_per_s"] for r in rows], "o-", label=store
        )
    axes.set_xlabel("worker processes (--processes)")
    axes.set_ylabel("drain, jobs/s (median)")
    axes.set_title(
        f"broker-jobs worker, {config['jobs']:,} no-op jobs, {config['cpus']} CPUs,"
        f" RabbitMQ {config['rabbitmq']}",
        fontsize=9,
    )
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    pyplot.close(figure)
    print(f"plot: {path}")
    return path


def _processes(row: dict[str, Any]) -> int:
    return int(row["processes"])


def main(argv: Sequence[str] | None = None) -> int:
    result = bench(parse_args(argv))
    plot(result["summary"], result["config"])
    print(json.dumps(result))
    failed = [label for label, row in result["summary"].items() if row["exit_codes"] != [0]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
