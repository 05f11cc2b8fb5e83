"""``python -m bench.throughput``: the run (see :mod:`bench.throughput`)."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Sequence
from typing import Any

from bench.common import Admin, measure_on_broker, print_config
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


class QuietNoTimeLimit(logging.Filter):
    """The no-op tasks have no time limit on purpose: drop the worker's warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "has no time limit" not in str(record.msg)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    # On the logger that logs it: a logger's filters skip records its children pass up.
    logging.getLogger("broker_jobs.worker.daemon").addFilter(QuietNoTimeLimit())
    measure_on_broker(options.url, functools.partial(bench, options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
