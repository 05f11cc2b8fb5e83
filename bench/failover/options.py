"""The command line of ``python -m bench.failover`` (the beats' ``--child`` too)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import bench.failover
from bench.common import add_number, bench_parser, from_args

DEFAULT_KILLS, DEFAULT_PAUSES, DEFAULT_BEATS = 20, 3, 3
DEFAULT_HEARTBEAT, DEFAULT_INTERVAL = 2, 0.05


@dataclass(frozen=True)
class Options:
    url: str | None
    kills: int
    pauses: int
    beats: int
    heartbeat: int
    interval: float


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser("failover", bench.failover.__doc__)
    add_number(parser, "--kills", int, DEFAULT_KILLS, "kill -9 rounds")
    add_number(parser, "--pauses", int, DEFAULT_PAUSES, "SIGSTOP rounds")
    add_number(parser, "--beats", int, DEFAULT_BEATS, "beat processes")
    add_number(
        parser, "--heartbeat", int, DEFAULT_HEARTBEAT, "the beats' AMQP heartbeat, whole seconds"
    )
    add_number(
        parser, "--interval", float, DEFAULT_INTERVAL, "the schedule's interval in seconds"
    )
    # The child process: one beat (internal).
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--identity", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kills < 0 or args.pauses < 0 or args.kills + args.pauses < 1:
        parser.error("--kills and --pauses must not be negative, and not both 0")
    if args.beats < 2:
        parser.error("--beats must be at least 2")
    if args.heartbeat < 1:
        parser.error("--heartbeat must be at least 1 second")
    if not 0.001 <= args.interval <= 1.0:
        parser.error("--interval must be between 0.001 and 1 s")
    if args.child and not (args.url and args.namespace and args.identity and args.store):
        parser.error("--child needs --url, --namespace, --identity and --store")
    return args


def options_from(args: argparse.Namespace) -> Options:
    return from_args(Options, args, url=args.url or None)
