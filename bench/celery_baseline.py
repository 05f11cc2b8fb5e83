"""Celery's drain rate on this machine, measured like the drain phase of bench.throughput.

The worker benchmark's aim is "at least Celery's rate on the same machine". This measures
that rate side by side: a Celery 5 worker (``-P solo -c 1`` and, for a multi-process point
of comparison, ``-P prefork -c 2``), ``task_acks_late=True``, a no-op task, persistent
messages, no result backend, in a durable quorum queue on the same broker.

Each round and variant: a fresh queue (and exchange) is declared, N tasks are published
with ``apply_async`` (untimed, no publisher confirms) until the queue holds N, then a
``celery worker`` subprocess starts. jobs/s = N / (the worker's ``worker_ready`` signal,
sent right after its ``basic.consume``, to the N-th task's completion). The same figure
measured from the subprocess's spawn (imports, connection, declarations included) is
printed too. The queue and exchange, and the native-delayed-delivery queues and exchanges
that Celery >= 5.5 declares for quorum queues (unless they existed before), are deleted
at the end of every round.

    python -m bench.celery_baseline --url amqp://guest:guest@localhost:5672/ --jobs 5000

Celery is an optional bench dependency (``pip install "celery>=5.4"``): without it this
exits with status 2. From other benchmarks: ``drain_rate(url, jobs)``. The last line of the
output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from bench.publish import add_url_argument, broker
from broker_jobs import mask_url

if TYPE_CHECKING:
    from celery import Celery  # type: ignore[import-untyped]
    from celery.app.task import Task  # type: ignore[import-untyped]

TASK = "bench.celery_noop"
DEFAULT_JOBS, DEFAULT_ROUNDS = 5000, 3
DEFAULT_VARIANTS = ("solo:1", "prefork:2")
POOLS = ("solo", "prefork", "threads")
QUEUE_TYPES = ("quorum", "classic")
#: worker_prefetch_multiplier set for throughput, not Celery's default of 4: Celery's
#: optimizing guide raises it for many short tasks, and the other workers compared hold
#: ~80 deliveries. The prefetch count is the multiplier times the concurrency.
PREFETCH_MULTIPLIER = 100
CELERY_DEFAULT_PREFETCH_MULTIPLIER = 4
BROKER_POOL_LIMIT = 10
EXIT_NO_CELERY = 2
INSTALL_HINT = (
    'celery is not installed; it is an optional bench dependency: pip install "celery>=5.4"'
)
#: Seconds to wait for the queue to hold the N published tasks, for the worker to be
#: ready, for the drain, and for the worker to stop.
FILL_TIMEOUT, READY_TIMEOUT, DRAIN_TIMEOUT, STOP_TIMEOUT = 120.0, 60.0, 300.0, 30.0
POLL_S = 0.005
#: A gap between two consecutive completions longer than this is reported as a stall.
STALL_S = 1.0
#: What Celery >= 5.5 declares for native delayed delivery once it sees a quorum queue
#: (kombu.transport.native_delayed_delivery): 28 levels, each a queue and an exchange.
DELAYED_LEVELS = 28
DELAYED_DELIVERY_EXCHANGE = "celery_delayed_delivery"
WORKER_CHILD = "_worker"


class CeleryMissingError(RuntimeError):
    """Celery (an optional bench dependency) is not installed."""


def celery_versions() -> dict[str, str]:
    """Versions of celery and the libraries under it; CeleryMissingError without it."""
    try:
        return {name: version(name) for name in ("celery", "kombu", "amqp", "billiard")}
    except PackageNotFoundError as exc:
        raise CeleryMissingError(INSTALL_HINT) from exc


# -- the Celery app (publisher and worker alike) -----------------------------------------


def make_app(
    url: str,
    queue: str,
    queue_type: str = "quorum",
    prefetch_multiplier: int = PREFETCH_MULTIPLIER,
    *,
    exchange_type: str = "direct",
    confirm_publish: bool = False,
) -> Celery:
    """An app whose only queue is ``queue``: durable, quorum (by default), behind its own
    exchange (direct by default; topic lets a quorum queue's ``countdown`` take Celery's
    native delayed delivery). ``confirm_publish``: each publish waits for its confirm
    (``broker_transport_options={"confirm_publish": True}``)."""
    try:
        from celery import Celery  # noqa: PLC0415 - optional dependency, imported on use
        from kombu.entity import Exchange, Queue  # noqa: PLC0415 - idem
    except ModuleNotFoundError as exc:
        raise CeleryMissingError(INSTALL_HINT) from exc
    app = Celery("bench_celery_baseline", broker=url, set_as_current=False)
    app.conf.update(
        task_queues=(
            Queue(  # type: ignore[no-untyped-call]
                queue,
                Exchange(queue, type=exchange_type, durable=True),  # type: ignore[no-untyped-call]
                routing_key=queue,
                durable=True,
                queue_arguments={"x-queue-type": queue_type},
            ),
        ),
        task_default_queue=queue,
        task_default_exchange=queue,
        task_default_routing_key=queue,
        task_default_delivery_mode="persistent",
        task_acks_late=True,
        task_ignore_result=True,
        result_backend=None,
        worker_prefetch_multiplier=prefetch_multiplier,
        # The default, stated: with a quorum queue the worker uses per-consumer QoS
        # (global QoS is not supported by quorum queues).
        worker_detect_quorum_queues=True,
        # No pidbox queue and exchange per worker; idle during a drain either way.
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        broker_pool_limit=BROKER_POOL_LIMIT,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"confirm_publish": confirm_publish},
    )
    return app


def register_noop(app: Celery, on_run: Any = None) -> Task:
    """The no-op task; ``on_run`` (the worker's counter) is called by every run."""

    @app.task(name=TASK, acks_late=True, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def noop() -> None:
        if on_run is not None:
            on_run()

    return noop


# -- the worker subprocess -----------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    queue: str
    jobs: int
    pool: str
    concurrency: int
    status: str  # a file: "ready <monotonic>" and "done <monotonic>" lines are appended
    queue_type: str = "quorum"
    prefetch_multiplier: int = PREFETCH_MULTIPLIER

    def argv(self) -> list[str]:
        return [
            "worker",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-Q",
            self.queue,
            "-l",
            "warning",
            "-n",
            f"{self.queue}@%h",
        ]


def run_worker(spec: WorkerSpec) -> None:
    """In the subprocess: a Celery worker that writes the ready and done moments.

    The count lives in shared memory created before the prefork pool forks its children,
    so the N-th task to finish, in whichever process, writes the done moment.
    ``time.monotonic()`` is the system-wide CLOCK_MONOTONIC, comparable across processes.
    """
    from celery import signals  # noqa: PLC0415 - optional dependency, imported on use

    status = Path(spec.status)

    def report(what: str, value: float | None = None) -> None:
        with status.open("a") as stream:
            stream.write(f"{what} {time.monotonic() if value is None else value!r}\n")

    # Shared by the pool's children: tasks done, the last one's moment, the longest gap
    # between two consecutive completions (a stall shows there).
    context = multiprocessing.get_context("fork")
    counter = context.Value("q", 0)
    last, longest = context.RawValue("d", math.nan), context.RawValue("d", 0.0)
    jobs = spec.jobs

    def count() -> None:
        with counter.get_lock():
            now = time.monotonic()
            longest.value = max(longest.value, now - last.value) if counter.value else 0.0
            last.value = now
            counter.value += 1
            done = counter.value == jobs
        if done:
            report("gap", longest.value)
            report("done", now)

    def on_ready(**_: Any) -> None:
        report("ready")

    signals.worker_ready.connect(on_ready, weak=False)
    app = make_app(spec.url, spec.queue, spec.queue_type, spec.prefetch_multiplier)
    register_noop(app, count)
    app.worker_main(spec.argv())


# -- broker access (pika, AMQP only) --------------------------------------------------------


class Admin:
    """Counts, checks and deletes the queues and exchanges of the rounds."""

    def __init__(self, url: str) -> None:
        parameters = pika.URLParameters(url)
        parameters.heartbeat = 0  # idle while the worker drains; must not be dropped
        parameters.client_properties = {"connection_name": "bench celery admin"}
        self._connection = pika.BlockingConnection(parameters)
        self._channel = self._connection.channel()

    def _fresh(self) -> BlockingChannel:
        if not self._channel.is_open:
            self._channel = self._connection.channel()
        return self._channel

    def server_version(self) -> str:
        impl = getattr(self._connection, "_impl", None)
        found = (getattr(impl, "server_properties", None) or {}).get("version")
        return found.decode() if isinstance(found, bytes) else str(found or "unknown")

    def depth(self, queue: str) -> int | None:
        """Ready messages in ``queue`` (unacked ones are not counted); None if missing."""
        try:
            declared = self._fresh().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return None
        return declared.method.message_count or 0

    def exchange_exists(self, exchange: str) -> bool:
        try:
            self._fresh().exchange_declare(exchange, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return False
        return True

    def delete(self, queues: Sequence[str] = (), exchanges: Sequence[str] = ()) -> None:
        for queue in queues:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self._fresh().queue_delete(queue)
        for exchange in exchanges:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self._fresh().exchange_delete(exchange)

    def close(self) -> None:
        with contextlib.suppress(pika.exceptions.AMQPError):
            self._connection.close()


def delayed_delivery_objects() -> tuple[list[str], list[str]]:
    """The queues and exchanges of Celery's native delayed delivery (no prefix)."""
    levels = [f"celery_delayed_{level}" for level in range(DELAYED_LEVELS)]
    return levels, [*levels, DELAYED_DELIVERY_EXCHANGE]


# -- one drain --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CeleryDrain:
    """One drain of ``jobs`` tasks by one worker."""

    pool: str
    concurrency: int
    jobs: int
    rate: float  # jobs / (worker_ready to the N-th task done)
    rate_from_spawn: float  # jobs / (subprocess spawn to the N-th task done)
    startup_s: float  # subprocess spawn to worker_ready
    fill_s: float  # untimed: publishing the N tasks until the queue held them
    left: int  # ready messages left in the queue after the worker stopped
    longest_gap_s: float  # the longest time between two consecutive task completions
    prefetch: int  # the worker's prefetch count: multiplier x concurrency


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def fill(app: Celery, admin: Admin, queue: str, jobs: int) -> float:
    """Publish ``jobs`` no-op tasks (no confirms) and wait until the queue holds them."""
    noop = register_noop(app)
    start = time.perf_counter()
    with app.connection_for_write() as connection:
        app.amqp.queues[queue].bind(connection.default_channel).declare()
        with app.producer_or_acquire() as producer:
            for _ in range(jobs):
                noop.apply_async(producer=producer)
    deadline = time.monotonic() + FILL_TIMEOUT
    while (depth := admin.depth(queue)) != jobs:
        if depth is not None and depth > jobs:
            raise RuntimeError(f"{queue} holds {depth} messages, more than {jobs}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{queue} holds {depth} of {jobs} tasks after {FILL_TIMEOUT:g} s")
        time.sleep(0.02)
    return time.perf_counter() - start


def read_status(path: Path) -> dict[str, float]:
    moments: dict[str, float] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            what, _, moment = line.partition(" ")
            moments[what] = float(moment)
    return moments


@contextlib.contextmanager
def worker_process(spec: WorkerSpec, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The worker subprocess, warm-shut-down (SIGTERM) on exit, killed if it hangs."""
    root = str(repo_root())
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "bench.celery_baseline", WORKER_CHILD]
    command.append(json.dumps(asdict(spec)))
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            # Its own session: the group is the worker and its pool children only.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def log_tail(log: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


def wait_for(
    status: Path, what: str, process: subprocess.Popen[bytes], timeout: float, log: Path
) -> float:
    deadline = time.monotonic() + timeout
    while (moment := read_status(status).get(what)) is None:
        if process.poll() is not None:
            raise RuntimeError(
                f"the celery worker exited ({process.returncode}) before '{what}':\n"
                + log_tail(log)
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"no '{what}' from the celery worker after {timeout:g} s")
        time.sleep(POLL_S)
    return moment


def drain(
    url: str,
    jobs: int,
    *,
    concurrency: int = 1,
    pool: str = "solo",
    queue_type: str = "quorum",
    prefetch_multiplier: int = PREFETCH_MULTIPLIER,
) -> CeleryDrain:
    """One round: a fresh queue, N tasks published, a worker drains them, cleanup.

    ``queue_type="classic"`` is for diagnosis only: the comparison is on quorum queues.
    """
    celery_versions()
    if (
        min(jobs, concurrency, prefetch_multiplier) < 1
        or pool not in POOLS
        or queue_type not in QUEUE_TYPES
    ):
        raise ValueError(
            f"bad drain: jobs={jobs}, concurrency={concurrency}, pool={pool!r},"
            f" queue_type={queue_type!r}, prefetch_multiplier={prefetch_multiplier}"
        )
    queue = f"bench-celery-{secrets.token_hex(4)}"
    app = make_app(url, queue, queue_type, prefetch_multiplier)
    admin = Admin(url)
    delayed_queues, delayed_exchanges = delayed_delivery_objects()
    delayed_existed = admin.depth(delayed_queues[0]) is not None or admin.exchange_exists(
        DELAYED_DELIVERY_EXCHANGE
    )
    try:
        fill_s = fill(app, admin, queue, jobs)
        app.close()  # the publisher's connections: not open while the worker drains
        with tempfile.TemporaryDirectory(prefix="bcel") as directory:
            status, log = Path(directory) / "status", Path(directory) / "worker.log"
            spec = WorkerSpec(
                url, queue, jobs, pool, concurrency, str(status), queue_type, prefetch_multiplier
            )
            spawned = time.monotonic()
            with worker_process(spec, log) as process:
                ready = wait_for(status, "ready", process, READY_TIMEOUT, log)
                done = wait_for(status, "done", process, DRAIN_TIMEOUT, log)
                longest_gap = read_status(status).get("gap", math.nan)
        left = admin.depth(queue) or 0  # after the worker stopped: unacked ones are back
    finally:
        app.close()
        admin.delete([queue], [queue])
        if not delayed_existed:
            admin.delete(delayed_queues, delayed_exchanges)
        admin.close()
    return CeleryDrain(
        pool=pool,
        concurrency=concurrency,
        jobs=jobs,
        rate=jobs / (done - ready),
        rate_from_spawn=jobs / (done - spawned),
        startup_s=ready - spawned,
        fill_s=fill_s,
        left=left,
        longest_gap_s=longest_gap,
        prefetch=prefetch_multiplier * concurrency,
    )


def drain_rate(
    url: str,
    jobs: int,
    *,
    concurrency: int = 1,
    pool: str = "solo",
    prefetch_multiplier: int = PREFETCH_MULTIPLIER,
) -> float:
    """Celery's drain rate (jobs/s) on this machine: see the module's docstring.

    One drain (a fresh quorum queue, ``jobs`` tasks, one worker); call it once per round
    and take the median. Raises CeleryMissingError when celery is not installed.
    """
    return drain(
        url, jobs, concurrency=concurrency, pool=pool, prefetch_multiplier=prefetch_multiplier
    ).rate


# -- the command ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    pool: str
    concurrency: int

    @property
    def name(self) -> str:
        return f"{self.pool} c={self.concurrency}"

    @classmethod
    def parse(cls, text: str) -> Variant:
        pool, _, concurrency = text.partition(":")
        if pool not in POOLS or not concurrency.isdigit() or int(concurrency) < 1:
            raise argparse.ArgumentTypeError(f"expected POOL:CONCURRENCY, POOL in {POOLS}")
        return cls(pool, int(concurrency))


@dataclass(frozen=True)
class Options:
    url: str | None
    jobs: int
    rounds: int
    variants: tuple[Variant, ...]
    queue_type: str
    prefetch_multiplier: int


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.celery_baseline", description=__doc__.split("\n\n", 1)[0]
    )
    add_url_argument(parser)
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help=f"tasks per drain ({DEFAULT_JOBS})"
    )
    parser.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help=f"rounds ({DEFAULT_ROUNDS})"
    )
    parser.add_argument(
        "--variant",
        type=Variant.parse,
        action="append",
        metavar="POOL:CONCURRENCY",
        help=f"repeatable (default: {' '.join(DEFAULT_VARIANTS)})",
    )
    parser.add_argument(
        "--queue-type",
        choices=QUEUE_TYPES,
        default="quorum",
        help="quorum (default: the comparison); classic for diagnosis only",
    )
    parser.add_argument(
        "--prefetch-multiplier",
        type=int,
        default=PREFETCH_MULTIPLIER,
        help=f"worker_prefetch_multiplier ({PREFETCH_MULTIPLIER}, set for throughput;"
        f" Celery's default is {CELERY_DEFAULT_PREFETCH_MULTIPLIER})",
    )
    args = parser.parse_args(argv)
    if min(args.jobs, args.rounds, args.prefetch_multiplier) < 1:
        parser.error("--jobs, --rounds and --prefetch-multiplier must be positive")
    variants = args.variant or [Variant.parse(text) for text in DEFAULT_VARIANTS]
    variants = tuple(dict.fromkeys(variants))
    return Options(
        args.url or None,
        args.jobs,
        args.rounds,
        variants,
        args.queue_type,
        args.prefetch_multiplier,
    )


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def describe_config(options: Options, url: str, rabbitmq: str) -> dict[str, Any]:
    return {
        "broker": mask_url(url),
        "rabbitmq": rabbitmq,
        **celery_versions(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_start": load(),
        "jobs_per_round": options.jobs,
        "rounds": options.rounds,
        "variants": ", ".join(
            f"{v.name} (prefetch {options.prefetch_multiplier * v.concurrency})"
            for v in options.variants
        ),
        "prefetch_multiplier": f"{options.prefetch_multiplier} (worker_prefetch_multiplier;"
        f" Celery's default: {CELERY_DEFAULT_PREFETCH_MULTIPLIER})",
        "acks": "task_acks_late=True: each task acked after it ran, like the others",
        "qos": "per-consumer (worker_detect_quorum_queues: no global QoS on quorum queues)"
        if options.queue_type == "quorum"
        else "global (Celery's choice on RabbitMQ >= 3.3 without quorum queues)",
        "queue": f"durable {options.queue_type}, own direct exchange, persistent messages,"
        " published without confirms",
        "task": "no-op, acks_late=True, ignore_result=True, no result backend",
        "broker_pool_limit": BROKER_POOL_LIMIT,
        "worker": "--without-gossip --without-mingle --without-heartbeat, no remote control",
        "timed": "worker_ready (after basic.consume) to the N-th task done",
    }


@dataclass
class Results:
    drains: dict[str, list[CeleryDrain]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def median(self, variant: str, figure: str) -> float:
        return float(statistics.median(getattr(d, figure) for d in self.drains[variant]))


def run_rounds(options: Options, url: str) -> Results:
    results = Results({v.name: [] for v in options.variants})
    for index in range(options.rounds):
        order = list(options.variants)
        figures = []
        for variant in order[::-1] if index % 2 else order:
            drained = drain(
                url,
                options.jobs,
                concurrency=variant.concurrency,
                pool=variant.pool,
                queue_type=options.queue_type,
                prefetch_multiplier=options.prefetch_multiplier,
            )
            results.drains[variant.name].append(drained)
            if drained.left:
                results.warnings.append(
                    f"round {index + 1}, {variant.name}: {drained.left} tasks left in the queue"
                )
            if drained.longest_gap_s > STALL_S:
                results.warnings.append(
                    f"round {index + 1}, {variant.name}: a {drained.longest_gap_s:.2f} s stall"
                    " between two task completions"
                )
            figures.append(
                f"{variant.name} {drained.rate:,.0f}/s"
                f" (from spawn {drained.rate_from_spawn:,.0f}/s, startup {drained.startup_s:.2f} s,"
                f" longest gap {drained.longest_gap_s * 1000:.0f} ms)"
            )
        print(f"  round {index + 1}/{options.rounds}: " + "; ".join(figures), flush=True)
    return results


#: The figures of a drain in the JSON line, with their decimals.
FIGURES = {"rate": 1, "rate_from_spawn": 1, "startup_s": 3, "longest_gap_s": 4}


def print_table(results: Results) -> None:
    print()
    print(
        f"{'variant':<14} {'jobs/s':>9} {'min':>8} {'max':>8} {'from spawn':>11}"
        f" {'startup s':>10} {'gap ms':>7}"
    )
    for name, drains in results.drains.items():
        rates = [d.rate for d in drains]
        print(
            f"{name:<14} {results.median(name, 'rate'):>9,.0f} {min(rates):>8,.0f}"
            f" {max(rates):>8,.0f} {results.median(name, 'rate_from_spawn'):>11,.0f}"
            f" {results.median(name, 'startup_s'):>10.2f}"
            f" {results.median(name, 'longest_gap_s') * 1000:>7.0f}"
        )
    for warning in results.warnings:
        print(f"WARNING: {warning}")


def summary(config: dict[str, Any], results: Results) -> dict[str, Any]:
    return {
        "config": {**config, "load_avg_end": load()},
        "median": {
            name: {f: round(results.median(name, f), digits) for f, digits in FIGURES.items()}
            for name in results.drains
        },
        "rounds": {
            name: {f: [round(getattr(d, f), n) for d in drains] for f, n in FIGURES.items()}
            for name, drains in results.drains.items()
        },
        "warnings": results.warnings,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [WORKER_CHILD]:
        run_worker(WorkerSpec(**json.loads(argv[1])))
        return 0
    options = parse_args(argv)
    try:
        celery_versions()
    except CeleryMissingError as exc:
        print(exc, file=sys.stderr)
        return EXIT_NO_CELERY
    with broker(options.url) as (url, _node):
        admin = Admin(url)
        try:
            rabbitmq = admin.server_version()
        finally:
            admin.close()
        config = describe_config(options, url, rabbitmq)
        print("Celery drain baseline (what bench.throughput's drain phase is compared to)")
        for key, value in config.items():
            print(f"  {key:<20} {value}")
        print()
        results = run_rounds(options, url)
    print_table(results)
    print(json.dumps(summary(config, results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
