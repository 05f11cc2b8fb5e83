"""``python -m bench.throughput``: the run (see :mod:`bench.throughput`)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

from bench.common import Admin, measure_workers_on_broker, print_config
from bench.throughput.options import Options, parse_args
from bench.throughput.report import (
    describe_config,
    print_aims,
    print_observe_cost,
    print_table,
    summary,
)
from bench.throughput.rounds import run_rounds
from broker_jobs.testing.rabbit_node import RabbitNode


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    admin = Admin(url)
    try:
        config = describe_config(options, url, node, admin)
        print_config("Worker throughput benchmark (broker_jobs)", config, 14)
        results = run_rounds(options, url, admin)
    finally:
        admin.close()
    print_table(results)
    print_aims(results)
    print_observe_cost(results)
    return summary(config, results)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    return measure_workers_on_broker(options.url, functools.partial(bench, options))


if __name__ == "__main__":
    sys.exit(main())
