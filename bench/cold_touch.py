"""``python -m bench.cold_touch``: what a step costs on a CPU that just woke up.

An idle worker meets each job after a sleep, and so does a publisher called now and
then. This measures, in one process and without a broker, the same small step run
twice in a row after a sleep of each length (the first call meets the caches as the
sleep left them, the second finds them warm), and once more after a busy spin of
2 ms between the sleep and the step: if the first call is slow only because the CPU
is slow to wake (its clock, the host scheduling the vCPU), the spin hides it; if it
is slow because what the step touches was evicted while it slept, the spin does not.

Steps: ``stdlib`` (``datetime.now(UTC)``, ``json.dumps`` of a small dict) and
``decode`` (:func:`broker_jobs.envelope.decode` of a job's wire message, as a
worker's fast path decodes each delivery).

    python -m bench.cold_touch                  # 300 samples per row
    python -m bench.cold_touch --samples 50     # a smoke run

The last line of the output is one JSON object with every figure (medians, µs).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from bench.common import add_number, bench_parser, print_config
from broker_jobs.clock import utc_now
from broker_jobs.envelope import decode, encode_new, new_job_id

#: Sleep lengths (s) before the step: a trickle's gap between jobs, down to none.
SLEEPS = (0.005, 0.0005, 0.00005, 0.0)
#: The busy spin (s) between the sleep and the step in the last row.
SPIN = 0.002


def stdlib_step() -> None:
    datetime.now(UTC)
    json.dumps({"seq": 1})


def decode_step() -> Callable[[], None]:
    message = encode_new(new_job_id(), "bench.cold", {"seq": 1}, utc_now())

    def step() -> None:
        decode(message)

    return step


def timed(step: Callable[[], None]) -> float:
    began = time.perf_counter()
    step()
    return (time.perf_counter() - began) * 1e6


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(
    step: Callable[[], None], sleep: float, samples: int, *, spun: bool
) -> tuple[float, float]:
    """Medians (µs) of the first and the second call after each sleep."""
    first, second = [], []
    for _ in range(samples):
        if sleep:
            time.sleep(sleep)
        if spun:
            spin(SPIN)
        first.append(timed(step))
        second.append(timed(step))
    return statistics.median(first), statistics.median(second)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("cold_touch", __doc__, url=False)
    add_number(parser, "--samples", int, 300, "samples per row")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    print_config(
        "A step's cost after a sleep (first call, then a second at once)",
        {
            "python": sys.version.split()[0],
            "samples": args.samples,
            "sleeps": ", ".join(f"{s * 1e3:g} ms" for s in SLEEPS),
            "spin": f"{SPIN * 1e3:g} ms busy between the sleep and the step (last row)",
        },
    )
    steps = {"stdlib": stdlib_step, "decode": decode_step()}
    figures: dict[str, Any] = {}
    rows = [(f"sleep {s * 1e3:g} ms", s, False) for s in SLEEPS]
    rows.append((f"sleep {SLEEPS[0] * 1e3:g} ms, spin {SPIN * 1e3:g} ms", SLEEPS[0], True))
    print(f"  {'':<26} " + "  ".join(f"{name + ' 1st':>11} {name + ' 2nd':>11}" for name in steps))
    for label, sleep, spun in rows:
        cells = []
        for name, step in steps.items():
            first, second = measure(step, sleep, args.samples, spun=spun)
            figures.setdefault(label, {})[name] = {
                "first": round(first, 1),
                "second": round(second, 1),
            }
            cells.append(f"{first:11.1f} {second:11.1f}")
        print(f"  {label:<26} " + "  ".join(cells))
    print(json.dumps({"samples": args.samples, "median_us": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
