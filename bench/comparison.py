"""What a ``bench.compare`` run is: its options, peers, figures and results.

Shared by the run (:mod:`bench.compare`) and its report (:mod:`bench.peers.report`),
which import this module and never each other.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench.peers.common import Family, Variant

WORKLOADS = ("publish", "consume", "latency", "delay", "drain", "rss")
QUEUE_TYPES = ("classic", "quorum")
#: An even number of rounds: two peers run in each order equally often (round_order).
DEFAULT_JOBS, DEFAULT_ROUNDS, DEFAULT_RSS_JOBS = 10_000, 6, 100_000

#: The reference rows of the ratios: per worker, and per publisher.
RAW_WORKER, RAW_PUBLISHER = "raw aio-pika", "raw pika"

#: Each figure: its unit, whether more is better, and its row kind.
FIGURES: dict[str, tuple[str, bool, str]] = {
    "publish single": ("jobs/s", True, "publisher"),
    "publish batched": ("jobs/s", True, "publisher"),
    "consume": ("jobs/s", True, "worker"),
    "latency p50": ("ms", False, "worker"),
    "latency p99": ("ms", False, "worker"),
    "delay lateness p50": ("ms", False, "worker"),
    "delay lateness p99": ("ms", False, "worker"),
    "drain total": ("s", False, "worker"),
    "drain: publisher with worker": ("jobs/s", True, "worker"),
    "rss": ("MB", False, "worker"),
}


@dataclass(frozen=True)
class Options:
    url: str | None
    jobs: int
    rounds: int
    queue_types: tuple[str, ...]
    only: tuple[str, ...]
    rss_jobs: int
    rate: float
    seconds: float
    output: Path
    quick: bool
    command: str
    #: The families to run (raw is always among them: the ratios' reference).
    peers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Peer:
    family: Family
    variants: tuple[Variant, ...]
    publisher_row: str


@dataclass
class Results:
    """figure -> queue type -> row -> round -> value; n/a rows keep their reason."""

    values: dict[str, dict[str, dict[str, dict[int, float]]]] = field(default_factory=dict)
    na: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def add(self, figure: str, queue_type: str, row: str, index: int, value: float) -> None:
        rows = self.values.setdefault(figure, {}).setdefault(queue_type, {})
        rows.setdefault(row, {})[index] = value

    def not_applicable(self, figure: str, queue_type: str, row: str, why: str) -> None:
        self.na.setdefault(figure, {}).setdefault(queue_type, {})[row] = why

    def rounds(self, figure: str, queue_type: str, row: str) -> dict[int, float]:
        return self.values.get(figure, {}).get(queue_type, {}).get(row, {})

    def median(self, figure: str, queue_type: str, row: str) -> float:
        found = list(self.rounds(figure, queue_type, row).values())
        return statistics.median(found) if found else math.nan

    def round_ratios(self, figure: str, queue_type: str, row: str, reference: str) -> list[float]:
        """``row / reference`` within each round both ran: the noise shows here."""
        mine, theirs = (self.rounds(figure, queue_type, r) for r in (row, reference))
        return [mine[i] / theirs[i] for i in sorted(mine) if theirs.get(i)]

    def ratio(self, figure: str, queue_type: str, row: str, reference: str) -> float:
        found = self.round_ratios(figure, queue_type, row, reference)
        return statistics.median(found) if found else math.nan

    def round_differences(
        self, figure: str, queue_type: str, row: str, reference: str
    ) -> list[float]:
        mine, theirs = (self.rounds(figure, queue_type, r) for r in (row, reference))
        return [mine[i] - theirs[i] for i in sorted(mine) if i in theirs]

    def rows(self, figure: str, queue_type: str) -> list[str]:
        return [
            *self.values.get(figure, {}).get(queue_type, {}),
            *self.na.get(figure, {}).get(queue_type, {}),
        ]


def reference_row(figure: str) -> str:
    return RAW_PUBLISHER if FIGURES[figure][2] == "publisher" else RAW_WORKER
