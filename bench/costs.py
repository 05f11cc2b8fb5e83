"""CPU per job on each side: the publisher, RabbitMQ, the worker with each store, and
PostgreSQL behind it. The figures docs/scaling.md sizes a 10,000 jobs/s deployment by.

Each round, for each queue type (quorum, classic) and each store (memory, SQLite,
PostgreSQL): ``--jobs`` no-op jobs are published in this process with
``publish_many`` (pipelined confirms), then drained by one ``broker-jobs worker
--burst --concurrency 8`` process. CPU is read, not wall time, so the figures hold on
a shared machine: this process's CPU while it publishes (``time.process_time``), the
broker's Erlang VM (``/proc/<pid>/stat``, a throwaway node of this run) while the
jobs are published and while they are consumed, the worker process's own CPU
(``getrusage`` of the child), and the PostgreSQL server's (postmaster and every
backend, reaped ones included) during the drain. The worker's figure includes its
start-up and the burst mode's final checks, spread over the jobs: a few µs per job
at 20,000 jobs.

    python -m bench.costs                      # 20,000 jobs, 3 rounds
    python -m bench.costs --jobs 5000 --rounds 1

The last line of the output is one JSON object with every figure (µs of CPU per job).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.common import Admin, broker, describe_broker, throwaway_postgres
from broker_jobs import App, JobRequest, Publisher, QueueOptions
from broker_jobs.testing.postgres_node import PostgresNode
from topology.model import QueueType

TASK = "bench.cost"
STORES = ("memory", "sqlite", "postgres")
QUEUE_TYPES = (QueueType.QUORUM, QueueType.CLASSIC)
_TICKS = os.sysconf("SC_CLK_TCK")


class Noop(BaseModel):
    n: int


def process_cpu(pid: int, *, children: bool = False) -> float:
    """CPU seconds of ``pid`` (user + system), and of its reaped children if asked."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    used = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        used += int(fields[13]) + int(fields[14])  # cutime, cstime
    return used / _TICKS


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return found


class PostgresCpu:
    """The server's CPU: the postmaster with its reaped children, plus live backends."""

    def __init__(self, node: PostgresNode) -> None:
        self._postmaster = int((node.data_dir / "postmaster.pid").read_text().split()[0])

    def read(self) -> float:
        live = sum(_safe_cpu(pid) for pid in children_of(self._postmaster))
        return process_cpu(self._postmaster, children=True) + live


def _safe_cpu(pid: int) -> float:
    try:
        return process_cpu(pid)
    except OSError:  # exited meanwhile: counted in the postmaster's cutime
        return 0.0


APP_SOURCE = textwrap.dedent(
    """
    from pydantic import BaseModel
    from broker_jobs import App, QueueOptions

    class Noop(BaseModel):
        n: int

    app = App(namespace={namespace!r})

    @app.task({task!r}, queue=QueueOptions(queue_type={queue_type!r}), time_limit=60)
    def noop(payload: Noop) -> None:
        pass
    """
)


def run_once(
    url: str, beam: int, *, store: str, queue_type: QueueType, jobs: int, pg: PostgresNode
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-costs-") as workdir:
        return _run_in(
            Path(workdir), url, beam, store=store, queue_type=queue_type, jobs=jobs, pg=pg
        )


def _run_in(
    workdir: Path,
    url: str,
    beam: int,
    *,
    store: str,
    queue_type: QueueType,
    jobs: int,
    pg: PostgresNode,
) -> dict[str, float]:
    namespace = f"benchcost{secrets.token_hex(4)}"
    app = App(namespace=namespace)
    app.declare(TASK, Noop, queue=QueueOptions(queue_type=queue_type))
    (workdir / "cost_app.py").write_text(
        APP_SOURCE.format(namespace=namespace, task=TASK, queue_type=queue_type.value)
    )
    requests = [JobRequest(TASK, {"n": n}) for n in range(jobs)]
    with Publisher(url, app) as publisher:
        publisher.publish_many(requests[:10])  # connect and declare outside the count
        broker_before, own_before = process_cpu(beam), time.process_time()
        publisher.publish_many(requests[10:])
        own, broker_publish = time.process_time() - own_before, process_cpu(beam) - broker_before
    store_url = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{workdir / 'ledger.db'}",
        "postgres": pg.dsn + f"?schema=s{secrets.token_hex(4)}",
    }[store]
    pg_cpu = PostgresCpu(pg)
    broker_before, pg_before = process_cpu(beam), pg_cpu.read()
    worker = worker_cpu(url, store_url, workdir, jobs)
    broker_consume, pg_used = process_cpu(beam) - broker_before, pg_cpu.read() - pg_before
    admin = Admin(url)
    admin.delete(app.topology())
    admin.close()
    per_job = 1e6 / (jobs - 10)
    figures = {
        "publisher_us": own * per_job,
        "broker_publish_us": broker_publish * per_job,
        "broker_consume_us": broker_consume * 1e6 / jobs,
        "worker_us": worker * 1e6 / jobs,
    }
    if store == "postgres":
        figures["postgres_us"] = pg_used * 1e6 / jobs
    return figures


def worker_cpu(url: str, store_url: str, workdir: Path, jobs: int) -> float:
    """CPU seconds of one burst worker draining the queue."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [
        sys.executable, "-m", "broker_jobs", "worker", "--url", url, "--store", store_url,
        "--burst", "--concurrency", "8", "--log-level", "warning", "cost_app:app",
    ]
    env = {**os.environ, "PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        command, cwd=workdir, env=env, check=True, capture_output=True, text=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "no output"
    if f"succeeded: {jobs}" not in summary:  # a figure of a worker that ran nothing is no figure
        raise SystemExit(
            f"the worker did not run the {jobs} jobs: {summary}\n{done.stderr[-3000:]}"
        )
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (20,000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument(
        "--stores", default=",".join(STORES), help=f"comma-separated ({','.join(STORES)})"
    )
    options = parser.parse_args(argv)
    options.stores = [store for store in options.stores.split(",") if store]
    unknown = set(options.stores) - set(STORES)
    if unknown:
        parser.error(f"unknown store {sorted(unknown)[0]!r}: use {', '.join(STORES)}")
    return options


def bench(options: argparse.Namespace) -> dict[str, Any]:
    # A throwaway node of our own: its Erlang VM's CPU is this run's alone.
    with broker(None) as (url, node), throwaway_postgres() as pg:
        assert node is not None
        beam = node.beam_pid()
        assert beam is not None, "the throwaway node has no pid"
        admin = Admin(url)
        config = {**describe_broker(url, node, admin), "jobs": options.jobs,
                  "rounds": options.rounds, "worker": "CLI, --concurrency 8, --burst",
                  "publisher": "publish_many, in process"}
        admin.close()
        print("Configuration:")
        for key, value in config.items():
            print(f"  {key}: {value}")
        runs: dict[str, list[dict[str, float]]] = {}
        for index in range(options.rounds):
            for queue_type in QUEUE_TYPES:
                for store in options.stores:
                    label = f"{queue_type.value}, {store}"
                    found = run_once(
                        url, beam, store=store, queue_type=queue_type, jobs=options.jobs, pg=pg
                    )
                    runs.setdefault(label, []).append(found)
                    print(f"round {index + 1}: {label}: {describe(found)}")
    medians = {
        label: {key: statistics.median(run[key] for run in found) for key in found[0]}
        for label, found in runs.items()
    }
    print("\nMedians (µs of CPU per job):")
    for label, figures in medians.items():
        print(f"  {label}: {describe(figures)}")
    return {"bench": "costs", "config": config, "medians": medians, "runs": runs}


def describe(figures: dict[str, float]) -> str:
    return ", ".join(f"{key.removesuffix('_us')} {value:.0f} µs" for key, value in figures.items())


def main(argv: Sequence[str] | None = None) -> int:
    result = bench(parse_args(argv))
    print(json.dumps(result, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
