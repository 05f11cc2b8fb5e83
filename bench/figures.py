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
    """Rotated each round and reversed every other round: rotation alone keeps every
    variant behind the same neighbour, whose backlog the broker may still be writing;
    so a slow neighbour, or a noisy moment of a shared machine, moves around."""
    shift = round_index % len(items) if items else 0
    order = [*items[shift:], *items[:shift]]
    return order[::-1] if round_index % 2 else order
