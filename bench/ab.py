"""One change of the worker, side by side with the code before it: the same drain by
the worker of two source trees (this checkout, and ``--base REV`` exported from git),
in interleaved rounds on one broker.

Each round, for each side (their order alternates round by round): ``--jobs`` no-op
jobs are published (pipelined confirms, this process, untimed) to a fresh namespace,
then one ``broker-jobs worker --burst`` process of that side drains them, started as a
user starts it: default log level (INFO, the success summary line), default prefetch,
``--concurrency 8``, ``--store`` as given. Measured per side and round:

- **jobs/s**: jobs / (the last handler's start - the first handler's start), read off
  the handlers themselves, so the worker's start-up and its burst checks are not in it;
- **worker CPU per job** (µs): the worker process's CPU (``getrusage`` of the child),
  start-up included (the same on both sides: ~0.5 s, 25 µs a job at 20,000 jobs);
- **broker CPU per job** (µs): the broker's Erlang VM (``/proc``) during the drain, when
  the broker is a throwaway node of this run (an ack with ``multiple`` saves it work).

The report gives each side's medians, and the median over rounds of each round's
ratio this / base (jobs/s: above 1 is faster; CPU: below 1 is cheaper).

    python -m bench.ab --base HEAD~1
    python -m bench.ab --base main --store sqlite --queue-type quorum --rounds 7

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.common import (
    REPO,
    Admin,
    add_number,
    bench_parser,
    describe_broker,
    from_args,
    measure_on_broker,
    print_config,
)
from bench.costs import process_cpu
from broker_jobs import App, JobRequest, Publisher, QueueOptions
from broker_jobs.testing.rabbit_node import RabbitNode
from topology.model import QueueType

TASK = "bench.ab"
THIS, BASE = "this", "base"
FIGURES = (("jobs_per_s", "jobs/s"), ("worker_us", "µs/job"), ("broker_us", "µs/job"))

APP_SOURCE = textwrap.dedent(
    """\
    import atexit, json, time
    from pydantic import BaseModel
    from broker_jobs import App, QueueOptions

    class Noop(BaseModel):
        n: int

    app = App(namespace={namespace!r})
    starts = []

    @app.task({task!r}, queue=QueueOptions(queue_type={queue_type!r}), time_limit=60)
    def noop(payload: Noop) -> None:
        starts.append(time.monotonic())

    @atexit.register
    def _report() -> None:
        with open({report!r}, "w") as out:
            json.dump({{"jobs": len(starts), "first": min(starts), "last": max(starts)}}, out)
    """
)


class Noop(BaseModel):
    n: int


@dataclass(frozen=True)
class Options:
    url: str | None
    base: str
    jobs: int
    rounds: int
    store: str
    queue_type: str


@dataclass(frozen=True)
class Drain:
    jobs_per_s: float
    worker_us: float
    broker_us: float | None


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (``git archive``) in ``into``: the base side's code."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    # Compiled once up front, as this checkout's modules are: not in a round's CPU.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(into)], check=True)
    return into


def store_url(store: str, workdir: Path) -> str:
    if store == "memory":
        return "memory://"
    if store == "sqlite":
        return f"sqlite:///{workdir / 'ledger.db'}"
    raise SystemExit(f"--store: memory or sqlite, not {store!r}")


def drain(options: Options, url: str, node: RabbitNode | None, tree: Path) -> Drain:
    """Publish ``options.jobs`` jobs, then drain them with one burst worker of ``tree``."""
    namespace = f"benchab{secrets.token_hex(4)}"
    queue = QueueOptions(queue_type=QueueType(options.queue_type))
    app = App(namespace=namespace)
    app.declare(TASK, Noop, queue=queue)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    report = workdir / "starts.json"
    (workdir / "ab_app.py").write_text(
        APP_SOURCE.format(
            namespace=namespace, task=TASK, queue_type=options.queue_type, report=str(report)
        )
    )
    with Publisher(url, app) as publisher:
        publisher.publish_many([JobRequest(TASK, {"n": n}) for n in range(options.jobs)])
    beam = node.beam_pid() if node is not None else None
    broker_before = process_cpu(beam) if beam else 0.0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [
        sys.executable, "-m", "broker_jobs", "worker", "--url", url,
        "--store", store_url(options.store, workdir), "--burst", "--concurrency", "8",
        "ab_app:app",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir), str(tree)])}
    done = subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, check=False
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    broker_cpu = process_cpu(beam) - broker_before if beam else None
    with Admin(url) as admin:
        admin.delete(app.topology())
    if done.returncode != 0 or not report.exists():
        raise SystemExit(f"the worker of {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    starts = json.loads(report.read_text())
    if starts["jobs"] != options.jobs:
        raise SystemExit(f"the worker of {tree} ran {starts['jobs']} of {options.jobs} jobs")
    worker_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Drain(
        jobs_per_s=(options.jobs - 1) / (starts["last"] - starts["first"]),
        worker_us=worker_cpu * 1e6 / options.jobs,
        broker_us=None if broker_cpu is None else broker_cpu * 1e6 / options.jobs,
    )


def ratios(rounds: list[dict[str, Drain]], figure: str) -> list[float] | None:
    found = [(getattr(r[THIS], figure), getattr(r[BASE], figure)) for r in rounds]
    if any(this is None or base is None for this, base in found):
        return None
    return [this / base for this, base in found]


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    with Admin(url) as admin:
        config = describe_broker(url, node, admin)
    config.update(
        this=str(REPO),
        base=options.base,
        jobs=options.jobs,
        rounds=options.rounds,
        store=options.store,
        queue_type=options.queue_type,
        worker="broker-jobs worker --burst --concurrency 8 (default log level and prefetch)",
    )
    print_config("The worker, this checkout against --base, side by side", config, 12)
    with tempfile.TemporaryDirectory(prefix="bench-ab-base-") as base_dir:
        trees = {THIS: REPO, BASE: export(options.base, Path(base_dir))}
        rounds: list[dict[str, Drain]] = []
        for number in range(options.rounds):
            order = (THIS, BASE) if number % 2 == 0 else (BASE, THIS)
            found = {side: drain(options, url, node, trees[side]) for side in order}
            rounds.append(found)
            print(f"round {number + 1}: " + "; ".join(_line(side, found[side]) for side in order))
    return summary(config, rounds)


def _line(side: str, found: Drain) -> str:
    broker = "" if found.broker_us is None else f", broker {found.broker_us:.0f} µs/job"
    return f"{side} {found.jobs_per_s:,.0f} jobs/s, worker {found.worker_us:.0f} µs/job{broker}"


def summary(config: dict[str, Any], rounds: list[dict[str, Drain]]) -> dict[str, Any]:
    figures: dict[str, Any] = {"config": config}
    print()
    for figure, unit in FIGURES:
        per_side = {side: [getattr(r[side], figure) for r in rounds] for side in (THIS, BASE)}
        if any(value is None for values in per_side.values() for value in values):
            continue
        found = ratios(rounds, figure) or []
        medians = {side: statistics.median(values) for side, values in per_side.items()}
        figures[figure] = {
            "this": medians[THIS],
            "base": medians[BASE],
            "ratio": statistics.median(found),
            "round_ratios": [round(r, 3) for r in found],
        }
        print(
            f"{figure:<11} this {medians[THIS]:,.1f} {unit}, base {medians[BASE]:,.1f} {unit}:"
            f" this/base {statistics.median(found):.3f}"
            f" (rounds {', '.join(f'{r:.3f}' for r in found)})"
        )
    return figures


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("ab", __doc__)
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    add_number(parser, "--jobs", int, 20_000, "jobs per drain")
    add_number(parser, "--rounds", int, 6, "rounds (each side once per round)")
    parser.add_argument("--store", default="memory", choices=("memory", "sqlite"))
    parser.add_argument(
        "--queue-type", default="classic", choices=[kind.value for kind in QueueType]
    )
    return from_args(Options, parser.parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    measure_on_broker(options.url, lambda url, node: bench(options, url, node))
    return 0


if __name__ == "__main__":
    sys.exit(main())
