"""``python -m bench.ab_paired --base REV``: publish-to-start of two workers at once.

bench.ab's steady phase measures each side in a window of its own, and the machine
drifts between windows: on a 2-core machine its rounds' ratios spread from 0.7 to 1.3,
too wide to tell a change of a few tens of µs. Here both sides run in the same window:
each round starts both workers (this checkout's and ``--base REV``'s, exported as
bench.ab exports it, each on a namespace of its own, as users start them), then both
sides' publishers (``bench/ab_publish.py steady`` with the side's code) take turns, one
confirmed publish every 1/``--rate`` s in all, each side every other one. Per side and
round: the median of publish call to handler start (the handler's own clock). Which
side is set up first, and which publishes first, alternate round by round.

The report gives each side's median over rounds and the median of the rounds'
differences this - base (ms; below 0: this side starts jobs sooner).

    python -m bench.ab_paired --base HEAD~1 --queue-type quorum
    python -m bench.ab_paired --base HEAD --rounds 4     # A/A: what the noise gives
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.ab import BASE, THIS, Options, RunningWorker, Side, export
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
from broker_jobs.testing.rabbit_node import RabbitNode
from topology.model import QueueType

#: Seconds from launching the publishers to their first publish: both connected.
START_AFTER = 2.0


@dataclass(frozen=True)
class PairedOptions:
    url: str | None
    base: str
    rounds: int
    rate: float
    seconds: float
    queue_type: str

    def side_options(self) -> Options:
        """bench.ab's options for a :class:`~bench.ab.Side` (a drain's unused)."""
        return Options(
            url=self.url, base=self.base, jobs=0, rounds=self.rounds, rate=self.rate,
            seconds=self.seconds, publishes=0, store="memory", queue_type=self.queue_type,
        )  # fmt: skip


def one_round(
    options: PairedOptions, url: str, trees: dict[str, Path], index: int
) -> dict[str, float]:
    """Both sides at once: each side's median publish-to-start (ms)."""
    sides = {name: Side(options.side_options(), url, tree) for name, tree in trees.items()}
    first_up = (THIS, BASE) if index % 2 == 0 else (BASE, THIS)
    first_out = (THIS, BASE) if (index // 2) % 2 == 0 else (BASE, THIS)
    running: dict[str, RunningWorker] = {}
    try:
        for name in first_up:
            sides[name].declare()
            running[name] = RunningWorker(sides[name])
        with Admin(url) as admin:
            for name in first_up:
                running[name].wait_consuming(admin)
            publish_taking_turns([sides[name] for name in first_out], options)
            while not all(worker.done(admin) for worker in running.values()):
                time.sleep(0.05)
    finally:
        outputs = {name: worker.stop() for name, worker in running.items()}
        for side in sides.values():
            side.delete()
    waits = {name: worker.waits(outputs[name]) for name, worker in running.items()}
    return {name: statistics.median(found) * 1000 for name, found in waits.items()}


def publish_taking_turns(sides: Sequence[Side], options: PairedOptions) -> None:
    """Each side's own publisher at ``rate / len(sides)``, their schedules offset so
    that together they publish every 1/``rate`` s, in the order of ``sides``."""
    start = time.time() + START_AFTER
    each = options.rate / len(sides)
    publishers = []
    for turn, side in enumerate(sides):
        first = f"{start + turn / options.rate:.6f}"  # time.time(): full precision
        command = [*side.publisher("steady", each, options.seconds), first]
        publishers.append(subprocess.Popen(command, env=side.env))
    for publisher in publishers:
        if publisher.wait() != 0:
            raise SystemExit(f"a publisher failed (exit code {publisher.returncode})")


def bench(options: PairedOptions, url: str, node: RabbitNode | None) -> dict[str, Any]:
    with Admin(url) as admin:
        config = describe_broker(url, node, admin)
    config.update(
        this=str(REPO), base=options.base, rounds=options.rounds,
        queue_type=options.queue_type,
        steady=f"{options.rate:g} jobs/s in all for {options.seconds:g} s, the sides taking"
        " turns, one confirmed publish each",
        worker="broker-jobs worker --concurrency 8 --store memory:// (default log level and"
        " prefetch), both sides at once",
    )  # fmt: skip
    print_config("Publish-to-start, this checkout and --base at once", config, 10)
    found: dict[str, list[float]] = {THIS: [], BASE: []}
    with tempfile.TemporaryDirectory(prefix="bench-ab-base-") as base_dir:
        trees = {THIS: REPO, BASE: export(options.base, Path(base_dir))}
        for index in range(options.rounds):
            row = one_round(options, url, trees, index)
            for name, value in row.items():
                found[name].append(value)
            print(
                f"round {index + 1}: this {row[THIS]:.3f} ms, base {row[BASE]:.3f} ms,"
                f" this - base {row[THIS] - row[BASE]:+.3f} ms"
            )
    differences = [this - base for this, base in zip(found[THIS], found[BASE], strict=True)]
    medians = {name: statistics.median(values) for name, values in found.items()}
    difference = statistics.median(differences)
    print(
        f"\nlatency p50: this {medians[THIS]:.3f} ms, base {medians[BASE]:.3f} ms;"
        f" this - base {difference:+.3f} ms"
        f" (rounds {', '.join(f'{value:+.3f}' for value in differences)})"
    )
    return {
        "config": config,
        "latency_p50_ms": {
            "this": medians[THIS],
            "base": medians[BASE],
            "difference": difference,
            "round_differences": [round(value, 4) for value in differences],
        },
    }


def parse_args(argv: Sequence[str] | None) -> PairedOptions:
    parser = bench_parser("ab_paired", __doc__)
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    add_number(parser, "--rounds", int, 8, "rounds (both sides in each)")
    add_number(parser, "--rate", float, 200, "jobs/s, both sides together")
    add_number(parser, "--seconds", float, 5, "each round's publishing")
    parser.add_argument(
        "--queue-type", default="classic", choices=[kind.value for kind in QueueType]
    )
    options = from_args(PairedOptions, parser.parse_args(argv))
    if options.rounds < 1 or options.rate <= 0 or options.seconds <= 0:
        parser.error("--rounds must be at least 1, --rate and --seconds positive")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    return run_bench(parse_args(argv), bench)


if __name__ == "__main__":
    sys.exit(main())
