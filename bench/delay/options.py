"""The command line of ``python -m bench.delay``."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import bench.delay
from bench.common import add_number, bench_parser
from topology.delay import MAX_DELAY

DEFAULT_SECONDS, DEFAULT_RATE, DEFAULT_MAX_DELAY, DEFAULT_ROUNDS = 20.0, 200.0, 30.0, 3
QUICK_SECONDS, QUICK_RATE, QUICK_MAX_DELAY, QUICK_ROUNDS = 5.0, 50.0, 5.0, 2
MIN_DELAY = 0.1


@dataclass(frozen=True)
class Options:
    url: str | None
    seconds: float
    rate: float
    max_delay: float
    rounds: int
    seed: int
    quick: bool

    @property
    def jobs(self) -> int:
        """Jobs published per round."""
        return max(1, round(self.rate * self.seconds))


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("delay", bench.delay.__doc__)
    add_number(parser, "--seconds", float, DEFAULT_SECONDS, "publishing time per round", later=True)
    add_number(parser, "--rate", float, DEFAULT_RATE, "jobs/s", later=True)
    delays = f"delays are uniform in [{MIN_DELAY}, this] s"
    add_number(parser, "--max-delay", float, DEFAULT_MAX_DELAY, delays, later=True)
    add_number(parser, "--rounds", int, DEFAULT_ROUNDS, "rounds", later=True)
    parser.add_argument("--seed", type=int, default=None, help="RNG seed (default: random)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK_SECONDS:g} s at {QUICK_RATE:g} jobs/s, delays up to"
        f" {QUICK_MAX_DELAY:g} s, {QUICK_ROUNDS} rounds",
    )
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    options = Options(
        url=args.url or None,
        seconds=_pick(args.seconds, QUICK_SECONDS if quick else DEFAULT_SECONDS),
        rate=_pick(args.rate, QUICK_RATE if quick else DEFAULT_RATE),
        max_delay=_pick(args.max_delay, QUICK_MAX_DELAY if quick else DEFAULT_MAX_DELAY),
        rounds=int(_pick(args.rounds, QUICK_ROUNDS if quick else DEFAULT_ROUNDS)),
        seed=args.seed if args.seed is not None else secrets.randbits(32),
        quick=quick,
    )
    if options.seconds <= 0 or options.rate <= 0 or options.rounds < 1:
        parser.error("--seconds, --rate and --rounds must be positive")
    if not MIN_DELAY <= options.max_delay <= MAX_DELAY:
        parser.error(f"--max-delay must be between {MIN_DELAY} and {MAX_DELAY:.0f} s")
    return options


def _pick(given: float | None, default: float) -> float:
    return default if given is None else given
