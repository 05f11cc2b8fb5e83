"""One change of the worker, side by side with the code before it: the same drain by
the worker of two source trees (this checkout, and ``--base REV`` exported from git),
in interleaved rounds on one broker.

Each round, for each side (their order alternates round by round): ``--jobs`` no-op
jobs are published (pipelined confirms, untimed) to a fresh namespace by that side's
own publisher (``bench/ab_publish.py`` run with the side's code: a change of what a job
carries on the wire shows in the worker's figures),
then one ``broker-jobs worker --burst`` process of that side drains them, started as a
user starts it: default log level (INFO, the success summary line), default prefetch,
``--concurrency 8``, ``--store`` as given. Measured per side and round:

- **jobs/s**: jobs / (the last handler's start - the first handler's start), read off
  the handlers themselves, so the worker's start-up and its burst checks are not in it;
- **worker CPU per job** (µs): the worker process's CPU (``getrusage`` of the child),
  start-up included (the same on both sides: ~0.5 s, 25 µs a job at 20,000 jobs);
- **broker CPU per job** (µs): the broker's Erlang VM (``/proc``) during the drain, when
  the broker is a throwaway node of this run (an ack with ``multiple`` saves it work).

- **latency p50** (ms): then the worker runs (not in burst mode) while the side's
  publisher publishes one confirmed job every 1/``--rate`` s for ``--seconds``: the
  median of the handler's start minus the publish call (``time.time()``, one machine;
  the side's own publish path is in it); and the **worker's CPU per job** meanwhile
  (µs, ``/proc``: a worker taking jobs one at a time, as most run, not in a burst);
- **live** (bench.compare's drain row): the worker runs while the side's publisher
  publishes ``--jobs`` jobs one by one as fast as each is confirmed: the
  **publisher's rate** meanwhile (/s), and the **worker's and the broker's CPU per
  job** from the first publish until the queue is empty (µs). On 2 cores the
  publisher, the broker and the worker share the CPUs, so a worker that costs less
  per job taken one at a time leaves the publisher more;
- **single publish** (/s, and µs of the publisher's CPU each): then, no worker
  running, the side's publisher publishes ``--publishes`` jobs one by one, each
  waiting for its confirm.

The report gives each side's medians, and the median over rounds of each round's
ratio this / base (jobs/s: above 1 is faster; CPU: below 1 is cheaper).

    python -m bench.ab --base HEAD~1
    python -m bench.ab --base main --store sqlite --queue-type quorum --rounds 7
    python -m bench.ab --base HEAD~1 --only single --rounds 16   # a publisher change
    python -m bench.ab --base HEAD~1 --store sqlite --only drain --returns

``--only`` runs some of the phases (drain, steady, live, single): a change of the publisher
alone needs many rounds of the single-publish phase to be told from the noise (about
3% from run to run on a 2-core machine), not the worker's phases. ``--returns`` makes the
handler return a small result, which the ledger keeps with the success (the path of a
task whose result is read later).

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.ab_publish import TASK, Noop
from bench.common import (
    REPO,
    Admin,
    add_number,
    bench_parser,
    describe_broker,
    from_args,
    print_config,
    run_bench,
)
from bench.costs import process_cpu
from broker_jobs import App, QueueOptions
from broker_jobs.testing.rabbit_node import RabbitNode
from topology.model import QueueType

THIS, BASE = "this", "base"
#: Run as a script with a side's code first on the path (not imported from here).
PUBLISH_SCRIPT = Path(__file__).with_name("ab_publish.py")
#: The phases of a round, in order (``--only`` picks some).
PHASES = ("drain", "steady", "live", "single")
FIGURES = (
    ("jobs_per_s", "jobs/s"),
    ("worker_us", "µs/job"),
    ("broker_us", "µs/job"),
    ("latency_p50_ms", "ms"),
    ("steady_worker_us", "µs/job"),
    ("live_publish_per_s", "/s"),
    ("live_worker_us", "µs/job"),
    ("live_broker_us", "µs/job"),
    ("publish_per_s", "/s"),
    ("publish_cpu_us", "µs"),
)

APP_SOURCE = textwrap.dedent(
    """\
    import atexit, json, time
    from pydantic import BaseModel
    from broker_jobs import App, QueueOptions

    class Noop(BaseModel):
        n: int
        sent: float = 0.0

    app = App(namespace={namespace!r})
    starts, waits = [], []

    @app.task({task!r}, queue=QueueOptions(queue_type={queue_type!r}), time_limit=60)
    def noop(payload: Noop) -> dict[str, int] | None:
        starts.append(time.monotonic())
        waits.append(time.time() - payload.sent)
        return {{"n": payload.n}} if {returns!r} else None  # a result to keep, or none

    @atexit.register
    def _report() -> None:
        with open({report!r}, "w") as out:
            json.dump({{"starts": starts, "waits": waits}}, out)
    """
)


@dataclass(frozen=True)
class Options:
    url: str | None
    base: str
    jobs: int
    rounds: int
    rate: float
    seconds: float
    publishes: int
    store: str
    queue_type: str
    #: Worker options for this checkout's side only (``--this-args "--prefetch 160"``):
    #: a setting measured against the same code with ``--base HEAD``.
    this_args: str = ""
    #: The phases to run (``--only``): all of :data:`PHASES` by default.
    only: str = ",".join(PHASES)
    #: Whether the handler returns a result, which the ledger keeps (``--returns``).
    returns: bool = False

    def runs(self, phase: str) -> bool:
        return phase in self.only.split(",")


@dataclass(frozen=True)
class Figures:
    """One side's figures of one round (None: its phase was not run)."""

    jobs_per_s: float | None = None
    worker_us: float | None = None
    broker_us: float | None = None
    latency_p50_ms: float | None = None
    #: The worker's CPU per job (µs) while jobs come one at a time (the steady phase).
    steady_worker_us: float | None = None
    #: The live phase: the publisher's rate while the worker runs, and the worker's
    #: and the broker's CPU per job meanwhile (µs).
    live_publish_per_s: float | None = None
    live_worker_us: float | None = None
    live_broker_us: float | None = None
    #: Confirmed publishes one by one, no worker running: a second, and the
    #: publisher's CPU per publish (µs).
    publish_per_s: float | None = None
    publish_cpu_us: float | None = None


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


class Side:
    """One side's worker on a fresh namespace: its app module written to a directory
    of its own, the handlers' starts and waits read back when the worker has exited."""

    def __init__(self, options: Options, url: str, tree: Path, args: Sequence[str] = ()) -> None:
        self.options, self.url, self.tree, self.args = options, url, tree, tuple(args)
        namespace = f"benchab{secrets.token_hex(4)}"
        self.app = App(namespace=namespace)
        self.app.declare(TASK, Noop, queue=QueueOptions(queue_type=QueueType(options.queue_type)))
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-ab-"))
        self.report = self.workdir / "starts.json"
        source = APP_SOURCE.format(
            namespace=namespace,
            task=TASK,
            queue_type=options.queue_type,
            report=str(self.report),
            returns=options.returns,
        )
        (self.workdir / "ab_app.py").write_text(source)

    def command(self, *extra: str) -> list[str]:
        store = self.options.store
        if store not in ("memory", "sqlite"):
            raise SystemExit(f"--store: memory or sqlite, not {store!r}")
        store_url = "memory://" if store == "memory" else f"sqlite:///{self.workdir / 'ledger.db'}"
        return [
            sys.executable, "-m", "broker_jobs", "worker", "--url", self.url,
            "--store", store_url, "--concurrency", "8", *self.args, *extra, "ab_app:app",
        ]  # fmt: skip

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.workdir), str(self.tree)])}

    def publisher(self, mode: str, *figures: float) -> list[str]:
        """The command of this side's publisher (``bench/ab_publish.py``): ``burst``
        (jobs) or ``steady`` (rate, seconds)."""
        return [
            sys.executable, str(PUBLISH_SCRIPT), mode, self.url, self.app.namespace,
            self.options.queue_type, *(f"{figure:g}" for figure in figures),
        ]  # fmt: skip

    def recorded(self, returncode: int, stderr: str) -> dict[str, list[float]]:
        """What the handlers recorded, once the worker exited (``returncode``)."""
        if returncode != 0 or not self.report.exists():
            raise SystemExit(f"the worker of {self.tree} failed ({returncode}):\n{stderr[-3000:]}")
        found: dict[str, list[float]] = json.loads(self.report.read_text())
        self.report.unlink()
        return found

    def declare(self) -> None:
        """The side's topology, before any phase: the worker of the steady phase
        starts before anything is published (``--only steady``: no drain declared it)."""
        with Admin(self.url) as admin:
            admin.declare(self.app.topology())

    def delete(self) -> None:
        """Delete the side's queues and exchanges, and its directory (its app and
        SQLite ledger: a run of 16 rounds left 32 behind)."""
        try:
            with Admin(self.url) as admin:
                admin.delete(self.app.topology())
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


def drain(side: Side, node: RabbitNode | None) -> tuple[float, float, float | None]:
    """Publish the jobs, then drain them with one burst worker: jobs/s, worker and
    broker CPU per job (µs; the broker's None on a broker of someone else's)."""
    jobs = side.options.jobs
    subprocess.run(side.publisher("burst", jobs), env=side.env, check=True)
    beam = node.beam_pid() if node is not None else None
    broker_before = process_cpu(beam) if beam else 0.0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        side.command("--burst"),
        cwd=side.workdir,
        env=side.env,
        capture_output=True,
        text=True,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    broker_cpu = process_cpu(beam) - broker_before if beam else None
    starts = side.recorded(done.returncode, done.stderr)["starts"]
    if len(starts) != jobs:
        raise SystemExit(f"the worker of {side.tree} ran {len(starts)} of {jobs} jobs")
    worker_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return (
        (jobs - 1) / (max(starts) - min(starts)),
        worker_cpu * 1e6 / jobs,
        None if broker_cpu is None else broker_cpu * 1e6 / jobs,
    )


class RunningWorker:
    """One side's worker (not in burst mode), started at once; :meth:`stop` ends it."""

    def __init__(self, side: Side) -> None:
        self.side = side
        self.queue = side.app.names.task_queue(TASK)
        self.process = subprocess.Popen(
            side.command(), cwd=side.workdir, env=side.env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def wait_consuming(self, admin: Admin) -> None:
        """Until it consumes (the phase may begin), it exited, or a minute passed (its
        exit code and output say why, in :meth:`waits`)."""
        deadline = time.monotonic() + 60
        while admin.consumers(self.queue) == 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def done(self, admin: Admin) -> bool:
        """Its queue is empty (every job taken), or it exited."""
        return self.process.poll() is not None or admin.depth(self.queue) == 0

    def cpu(self) -> float:
        """Its CPU seconds so far; 0 once it exited (no /proc entry left: its exit
        code and output say why, in :meth:`waits`)."""
        return process_cpu(self.process.pid) if self.process.poll() is None else 0.0

    def stop(self) -> str:
        """SIGTERM (the jobs it holds and has not started: left), SIGKILL if it is
        not gone within a minute (its exit code then says so); its output."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.communicate()[1]

    def waits(self, stderr: str) -> list[float]:
        """Once stopped: its handlers' publish-to-start times (s)."""
        return self.side.recorded(self.process.returncode, stderr)["waits"]


def steady(side: Side) -> tuple[float, float]:
    """The worker running, one confirmed publish every 1/rate s for the phase: the
    median of publish call to handler start (ms), and the worker's CPU per job (µs)
    from the phase's first publish until its queue is empty."""
    options = side.options
    worker = RunningWorker(side)
    try:
        with Admin(side.url) as admin:
            worker.wait_consuming(admin)
            cpu_before = worker.cpu()
            subprocess.run(
                side.publisher("steady", options.rate, options.seconds), env=side.env, check=True
            )
            while not worker.done(admin):
                time.sleep(0.05)
            cpu = worker.cpu() - cpu_before
    finally:
        stderr = worker.stop()
    waits = worker.waits(stderr)
    return statistics.median(waits) * 1000, cpu * 1e6 / len(waits)


def live(side: Side, node: RabbitNode | None) -> tuple[float, float, float | None]:
    """The worker running while the side's publisher publishes ``--jobs`` jobs one by
    one, each waiting for its confirm (bench.compare's drain row): the publisher's
    rate meanwhile, and the worker's and the broker's CPU per job from the first
    publish until the queue is empty (the broker's None on someone else's broker)."""
    jobs = side.options.jobs
    worker = RunningWorker(side)
    beam = node.beam_pid() if node is not None else None
    try:
        with Admin(side.url) as admin:
            worker.wait_consuming(admin)
            cpu_before = worker.cpu()
            broker_before = process_cpu(beam) if beam else 0.0
            published = _published(side, jobs)
            while not worker.done(admin):
                time.sleep(0.05)
            cpu = worker.cpu() - cpu_before
            broker_cpu = process_cpu(beam) - broker_before if beam else None
    finally:
        stderr = worker.stop()
    worker.waits(stderr)  # the worker ended well
    return (
        published["per_s"],
        cpu * 1e6 / jobs,
        None if broker_cpu is None else broker_cpu * 1e6 / jobs,
    )


def single_publish(side: Side) -> dict[str, float]:
    """No worker running: the side's publisher publishes ``--publishes`` jobs one by
    one, each waiting for its confirm (its rate, and its CPU per publish)."""
    return _published(side, side.options.publishes)


def _published(side: Side, jobs: int) -> dict[str, float]:
    """The side's publisher's ``single`` mode: ``jobs`` confirmed publishes one by one."""
    done = subprocess.run(
        side.publisher("single", jobs), env=side.env, check=True, capture_output=True, text=True
    )
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def measure(
    options: Options, url: str, node: RabbitNode | None, tree: Path, args: Sequence[str] = ()
) -> Figures:
    side = Side(options, url, tree, args)
    found: dict[str, float | None] = {}
    try:
        side.declare()
        if options.runs("drain"):
            jobs_per_s, worker_us, broker_us = drain(side, node)
            found.update(jobs_per_s=jobs_per_s, worker_us=worker_us, broker_us=broker_us)
        if options.runs("steady"):
            latency, steady_worker_us = steady(side)
            found.update(latency_p50_ms=latency, steady_worker_us=steady_worker_us)
        if options.runs("live"):
            rate, live_worker_us, live_broker_us = live(side, node)
            found.update(
                live_publish_per_s=rate,
                live_worker_us=live_worker_us,
                live_broker_us=live_broker_us,
            )
        if options.runs("single"):
            published = single_publish(side)
            found.update(publish_per_s=published["per_s"], publish_cpu_us=published["cpu_us"])
    finally:
        side.delete()
    return Figures(**found)


def ratios(rounds: list[dict[str, Figures]], figure: str) -> list[float] | None:
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
        steady=f"{options.rate:g} jobs/s for {options.seconds:g} s, one confirmed publish each",
        live=f"{options.jobs} confirmed publishes one by one, the worker running",
        single=f"{options.publishes} confirmed publishes one by one, no worker running",
        worker="broker-jobs worker --concurrency 8 (default log level and prefetch)",
        this_args=options.this_args or "none",
        phases=options.only,
        handler="returns a result" if options.returns else "returns nothing",
    )
    print_config("The worker, this checkout against --base, side by side", config, 12)
    with tempfile.TemporaryDirectory(prefix="bench-ab-base-") as base_dir:
        trees = {THIS: REPO, BASE: export(options.base, Path(base_dir))}
        args = {THIS: shlex.split(options.this_args), BASE: []}
        rounds: list[dict[str, Figures]] = []
        for number in range(options.rounds):
            order = (THIS, BASE) if number % 2 == 0 else (BASE, THIS)
            found = {side: measure(options, url, node, trees[side], args[side]) for side in order}
            rounds.append(found)
            print(f"round {number + 1}: " + "; ".join(_line(side, found[side]) for side in order))
    return summary(config, rounds)


def _line(side: str, found: Figures) -> str:
    parts = []
    if found.jobs_per_s is not None:
        broker = "" if found.broker_us is None else f", broker {found.broker_us:.0f} µs/job"
        parts.append(f"{found.jobs_per_s:,.0f} jobs/s, worker {found.worker_us:.0f} µs/job{broker}")
    if found.latency_p50_ms is not None:
        parts.append(
            f"latency p50 {found.latency_p50_ms:.2f} ms"
            f" (worker {found.steady_worker_us:.0f} µs/job)"
        )
    if found.live_publish_per_s is not None:
        broker = "" if found.live_broker_us is None else f", broker {found.live_broker_us:.0f}"
        parts.append(
            f"live publisher {found.live_publish_per_s:,.0f}/s"
            f" (worker {found.live_worker_us:.0f}{broker} µs/job)"
        )
    if found.publish_per_s is not None:
        parts.append(
            f"single publish {found.publish_per_s:,.0f}/s ({found.publish_cpu_us:.0f} µs CPU each)"
        )
    return f"{side} " + ", ".join(parts)


def summary(config: dict[str, Any], rounds: list[dict[str, Figures]]) -> dict[str, Any]:
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
    add_number(parser, "--publishes", int, 2_000, "single confirmed publishes per round")
    add_number(parser, "--rounds", int, 6, "rounds (each side once per round)")
    add_number(parser, "--rate", float, 200, "jobs/s of the steady phase")
    add_number(parser, "--seconds", float, 5, "the steady phase's length")
    parser.add_argument("--store", default="memory", choices=("memory", "sqlite"))
    parser.add_argument(
        "--queue-type", default="classic", choices=[kind.value for kind in QueueType]
    )
    parser.add_argument(
        "--this-args",
        default="",
        help='worker options for this checkout\'s side only, e.g. "--prefetch 160" with'
        " --base HEAD: a setting side by side with the default",
    )
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help="phases, comma-separated (default: all): drain, steady, live, single; e.g. --only"
        " single --rounds 16 for a change of the publisher alone",
    )
    parser.add_argument(
        "--returns",
        action="store_true",
        help="the handler returns a small result, which the ledger keeps with the success",
    )
    options = from_args(Options, parser.parse_args(argv))
    unknown = set(options.only.split(",")) - set(PHASES)
    if unknown:
        parser.error(f"--only: unknown phases {sorted(unknown)}; pick from {', '.join(PHASES)}")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    return run_bench(parse_args(argv), bench)


if __name__ == "__main__":
    sys.exit(main())
