"""The overview's small chart: the last hour's successes and failures of a task as
two horizontal bars of an inline SVG (no script, no library)."""

from __future__ import annotations

from dataclasses import dataclass

WIDTH = 160  # pixels of the longest bar


@dataclass(frozen=True)
class Bar:
    label: str
    value: int
    width: int  # pixels
    y: int
    kind: str  # the CSS class: ok or failed


def bars(succeeded: int, failed: int, scale: int = 0) -> list[Bar]:
    """Two bars scaled to ``scale`` (the largest value of the page, so tasks compare;
    their own largest when 0). A value above 0 gets at least a visible pixel."""
    top = max(scale, succeeded, failed, 1)
    made = []
    for row, (label, value, kind) in enumerate(
        (("ok", succeeded, "ok"), ("failed", failed, "failed"))
    ):
        width = round(WIDTH * value / top)
        made.append(Bar(label, value, max(width, 1) if value else 0, row * 14, kind))
    return made
