"""``python -m bench.delay``: the run (see :mod:`bench.delay`)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

from bench.common import Admin, measure_on_broker, print_config
from bench.delay.lateness import figures, medians, problems
from bench.delay.options import Options, parse_args
from bench.delay.report import describe_config, print_aims, print_round, print_table, summary
from bench.delay.rounds import run_round
from broker_jobs.testing.rabbit_node import RabbitNode


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    admin = Admin(url)
    try:
        config = describe_config(options, url, node, admin)
        print_config("Delayed delivery benchmark (broker_jobs)", config)
        rounds = []
        for index in range(options.rounds):
            result = run_round(options, url, admin, index)
            figure = figures(result)
            print_round(index + 1, options.rounds, result.namespace, figure)
            rounds.append(figure)
    finally:
        admin.close()
    middle = medians(rounds)
    found = problems(rounds)
    print_table(rounds, middle)
    print_aims(options, middle, found)
    return summary(config, rounds, middle, found)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    result = measure_on_broker(options.url, functools.partial(bench, options))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
