"""Times, durations and errors as people read them: the command line's tables and
the dashboard's pages write them alike."""

from __future__ import annotations

from datetime import datetime, timedelta


def when(moment: datetime | None) -> str:
    """A time as ISO 8601 UTC to the second, ``Z`` for the zone; ``-`` for None."""
    if moment is None:
        return "-"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def span(duration: timedelta | None) -> str:
    """A duration in one word: ``350ms``, ``4.2s``, ``2m05s``, ``3h07m``, ``2d04h``."""
    if duration is None:
        return "-"
    seconds = max(duration.total_seconds(), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def first_line(text: str | None, limit: int = 60) -> str:
    """The first line of an error, cut to ``limit`` characters with ``…``."""
    if not text:
        return "-"
    line = text.strip().splitlines()[0] if text.strip() else "-"
    return line if len(line) <= limit else line[: limit - 1] + "…"
