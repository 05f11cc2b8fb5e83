"""Counts in words for log lines and command output: ``1 job``, ``3 jobs``."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, the noun with an ``s`` unless the count is one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
