"""Counts in words for log lines and command output: ``1 job``, ``3 jobs``."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun``, the noun with an ``s`` (or ``many``, for a noun such
    as ``success``) unless the count is one."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {many or noun + 's'}"
