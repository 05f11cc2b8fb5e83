"""The worker's memory over a long run: its RSS after 100,000 ... 1,000,000 jobs with
each store.

For each store (memory, SQLite, PostgreSQL), one ``broker-jobs worker`` process
(``--concurrency 8``, no-op handler) runs while this process publishes ``--jobs``
jobs in chunks of ``--chunk`` (``publish_many``), waiting for each chunk to be run
before the next, so the broker never holds more than one chunk. The handler writes
how many jobs its process ran to a file every 1,000 jobs; after each checkpoint the
worker's RSS (``VmRSS`` of ``/proc/<pid>/status``) is read. A store that grew with
every job would show here; a bounded one levels off.

    python -m bench.memory                     # 1,000,000 jobs per store
    python -m bench.memory --jobs 200000 --stores memory,sqlite

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from bench.common import Admin, broker, describe_broker, throwaway_postgres
from bench.costs import STORES
from broker_jobs import App, JobRequest, Publisher

TASK = "bench.memory"
#: Seconds a chunk may take to be run before the bench gives up.
CHUNK_TIMEOUT = 600.0

APP_SOURCE = textwrap.dedent(
    """
    import os
    from pathlib import Path
    from pydantic import BaseModel
    from broker_jobs import App

    class Noop(BaseModel):
        n: int

    app = App(namespace={namespace!r})
    _count = 0
    _progress = Path({progress!r})

    @app.task({task!r}, time_limit=60)
    def noop(payload: Noop) -> None:
        global _count
        _count += 1  # handler threads race here: at worst a count of 999 shows 1,000 late
        if _count % 1000 == 0:
            _progress.write_text(str(_count))
    """
)


class Noop(BaseModel):
    n: int


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def ran(progress: Path) -> int:
    try:
        return int(progress.read_text() or 0)
    except (OSError, ValueError):
        return 0


def run_store(
    url: str, store: str, dsn: str, options: argparse.Namespace
) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as workdir:
        return _run_in(Path(workdir), url, store, dsn, options)


def _run_in(
    workdir: Path, url: str, store: str, dsn: str, options: argparse.Namespace
) -> list[dict[str, float]]:
    namespace = f"benchmem{secrets.token_hex(4)}"
    progress = workdir / "progress"
    (workdir / "memory_app.py").write_text(
        APP_SOURCE.format(namespace=namespace, task=TASK, progress=str(progress))
    )
    store_url = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{workdir / 'ledger.db'}",
        "postgres": dsn + f"?schema=m{secrets.token_hex(4)}",
    }[store]
    app = App(namespace=namespace)
    app.declare(TASK, Noop)
    command = [
        sys.executable, "-m", "broker_jobs", "worker", "--url", url, "--store", store_url,
        "--concurrency", "8", "--log-level", "warning", "memory_app:app",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    samples: list[dict[str, float]] = []
    with Publisher(url, app) as publisher:
        worker = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.DEVNULL)
        try:
            published = 0
            while published < options.jobs:
                size = min(options.chunk, options.jobs - published)
                publisher.publish_many(
                    [JobRequest(TASK, {"n": published + n}) for n in range(size)]
                )
                published += size
                wait_for(progress, published, worker)
                samples.append({"jobs": published, "rss_mb": rss_mb(worker.pid)})
                print(f"  {store}: {published:,} jobs, RSS {samples[-1]['rss_mb']:.1f} MB")
        finally:
            worker.terminate()
            worker.wait(60)
    admin = Admin(url)
    admin.delete(app.topology())
    admin.close()
    return samples


def wait_for(progress: Path, count: int, worker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + CHUNK_TIMEOUT
    while ran(progress) < count:
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited with {worker.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker ran {ran(progress)} of {count} jobs in time")
        time.sleep(0.2)  # polling another process's file: nothing to await


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs per store (1,000,000)")
    parser.add_argument("--chunk", type=int, default=50_000, help="jobs per chunk (50,000)")
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated")
    options = parser.parse_args(argv)
    if options.jobs % 1000 or options.chunk % 1000:
        parser.error("--jobs and --chunk must be multiples of 1,000 (the handler's step)")
    options.stores = [store for store in options.stores.split(",") if store]
    if unknown := set(options.stores) - set(STORES):
        parser.error(f"unknown store {sorted(unknown)[0]!r}: use {', '.join(STORES)}")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    with broker(None) as (url, node), throwaway_postgres() as pg:
        admin = Admin(url)
        config = {**describe_broker(url, node, admin), "jobs": options.jobs,
                  "chunk": options.chunk, "worker": "CLI, --concurrency 8"}
        admin.close()
        print("Configuration:")
        for key, value in config.items():
            print(f"  {key}: {value}")
        results = {store: run_store(url, store, pg.dsn, options) for store in options.stores}
    print("\nRSS (MB) after:")
    for store, samples in results.items():
        marks = [s for s in samples if s["jobs"] in {100_000, 500_000, options.jobs}]
        print(f"  {store}: " + ", ".join(f"{s['jobs']:,} jobs {s['rss_mb']:.1f}" for s in marks))
    print(json.dumps({"bench": "memory", "config": config, "rss": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
