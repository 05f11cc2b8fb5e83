"""The numbers the benchmarks report, and the order their variants run in each round."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolated between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(
    values: Sequence[float],
    *,
    unit: str = "",
    scale: float = 1.0,
    digits: int = 3,
    quantiles: Sequence[int] = (50,),
) -> dict[str, float | int | None]:
    """``count``, then the ``quantiles`` (``p50``...), ``max`` and ``min`` of ``values``
    times ``scale``, rounded to ``digits``, their keys ending in ``unit`` (``_s``,
    ``_ms``); None for a figure of no values."""

    def rounded(value: float) -> float | None:
        return None if math.isnan(value) else round(value * scale, digits)

    found: dict[str, float | int | None] = {"count": len(values)}
    for q in quantiles:
        found[f"p{q}{unit}"] = rounded(percentile(values, q))
    found[f"max{unit}"] = rounded(max(values, default=math.nan))
    found[f"min{unit}"] = rounded(min(values, default=math.nan))
    return found


def round_order(items: Sequence[T], round_index: int) -> list[T]:
    """Each rotation of ``items`` run forward in one round, then backward in the next.

    Backward after forward puts every two items in each order equally often over an
    even number of rounds: one that runs after another on a shared machine (behind a
    neighbour whose backlog the broker may still be writing, on CPUs it left idle or
    busy) is not always the later one. Rotation, every two rounds, moves each item
    through every place of a round, first to last. (Rotated each round and reversed
    every other, the order before, put ``items[0]`` before ``items[1]`` in 4 of 5
    rounds.)"""
    shift = (round_index // 2) % len(items) if items else 0
    order = [*items[shift:], *items[:shift]]
    return order[::-1] if round_index % 2 else order
