"""Where the suite's CPU goes, per test: ``./scripts/test -p tests.cpu_report``.

The suite's wall time on 2 cores is bound by its CPU (the brokers', the databases',
the tests' own), so a test's duration says little about what it costs the others.
For each test (setup, call and teardown together) this plugin adds up the CPU time of
the test process's whole tree: itself, its live descendants (the throwaway RabbitMQ
and PostgreSQL nodes, worker and beat subprocesses) read from ``/proc``, and the
children that exited meanwhile. Each process writes its lines to
``$BROKER_JOBS_TEST_CPU_REPORT`` (default ``cpu-report.tsv``): seconds, test id.
Sort them with ``sort -rn cpu-report.tsv | head -40``.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Generator
from pathlib import Path

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")


def _descendants_cpu(root: int) -> float:
    """CPU seconds of the live descendants of ``root`` (user + system)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it exited meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / _TICKS
    total, stack = 0.0, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total


def _tree_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    gone = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + gone.ru_utime + gone.ru_stime) + _descendants_cpu(
        os.getpid()
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    before = _tree_cpu()
    yield
    spent = _tree_cpu() - before
    report = Path(os.environ.get("BROKER_JOBS_TEST_CPU_REPORT", "cpu-report.tsv"))
    with report.open("a") as out:
        out.write(f"{spent:.2f}\t{item.nodeid}\n")
