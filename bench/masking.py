"""``python -m bench.masking``: what masking passwords costs on long lines.

Every log line and error is masked (``broker_jobs.urls.mask_text``, ``mask_url``,
``broker_jobs.store.values.mask_dsn``), text from messages included: an idempotency
key, a handler's error. For each shape of line an attacker can send, at two lengths,
the median of ``--rounds`` calls in ms, and the growth from the short line to the
long one (4x longer: about 4 when linear, 16 when quadratic).

    python -m bench.masking
    python -m bench.masking --rounds 3 --short 5000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from broker_jobs.store.values import mask_dsn
from broker_jobs.urls import mask_text, mask_url

#: A line of ``n`` characters of each shape.
SHAPES: dict[str, Callable[[int], str]] = {
    "letters": lambda n: "a" * n,
    "user:pass runs": lambda n: "a:" * (n // 2),
    "@ then runs": lambda n: "@" + "a:" * (n // 2),
    "schemes": lambda n: "amqp://" * (n // 7),
    "amqp://u: runs": lambda n: "amqp://u:" * (n // 9),
    "x://a: runs": lambda n: "x://a:" * (n // 6),
}
MASKS: dict[str, Callable[[str], str]] = {
    "mask_text": mask_text,
    "mask_url": mask_url,
    "mask_dsn": mask_dsn,
}


def median_ms(mask: Callable[[str], str], line: str, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        mask(line)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--short", type=int, default=10_000, help="characters (long: 4x)")
    options = parser.parse_args()
    short, long = options.short, options.short * 4
    print(f"config: rounds={options.rounds} short={short:,} long={long:,} chars; medians, ms")
    print(f"{'shape':16} {'mask':10} {'short':>9} {'long':>9} {'growth':>7}")
    figures = []
    for shape, make in SHAPES.items():
        for name, mask in MASKS.items():
            fast = median_ms(mask, make(short), options.rounds)
            slow = median_ms(mask, make(long), options.rounds)
            growth = slow / fast if fast else float("nan")
            print(f"{shape:16} {name:10} {fast:9.2f} {slow:9.2f} {growth:7.1f}")
            figures.append({"shape": shape, "mask": name, "short_ms": fast, "long_ms": slow})
    print(json.dumps({"bench": "masking", "short": short, "long": long, "figures": figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
