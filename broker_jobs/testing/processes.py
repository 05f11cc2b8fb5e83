"""Process look-ups the throwaway nodes and the fault scenarios share (Linux /proc)."""

from __future__ import annotations

import contextlib
from pathlib import Path


def child_pids(ppid: int) -> set[int]:
    """The pids whose parent is ``ppid``; finds a server's processes before it wrote
    its pid file (beam under the rabbitmq-server script, postgres under the postmaster)."""
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == ppid:
                kids.add(int(stat.parent.name))
    return kids
