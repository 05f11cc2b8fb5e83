"""``python -m bench.faults``: fault scenarios against throwaway nodes.

    python -m bench.faults                          # every scenario, full size (minutes)
    python -m bench.faults --quick                  # small counts, for CI (~3-4 min)
    python -m bench.faults --scenario postgres-kill --scenario sqlite-full-disk --quick
    python -m bench.faults --scenario worker-kill --store postgres --jobs 8000

Each scenario prints one JSON line (its summary) as it ends; then a table of all of
them and a last JSON line with every summary (``| tail -1 | jq``). The exit status is
1 when a scenario is not ok (a must-be-0 figure is not 0, or it failed to run), 0
otherwise (a skipped scenario says why and does not fail the run).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from bench.faults.harness import STORES, Settings, dumps, environment
from bench.faults.scenarios import SCENARIOS, cases, run_case

#: The table's columns: header, summary key.
COLUMNS = (
    ("scenario", "scenario"),
    ("store", "store"),
    ("published", "published"),
    ("lost", "lost"),
    ("doubled", "effects_doubled"),
    ("plain re-runs", "plain_reruns"),
    ("dead-lettered", "healthy_dead_lettered"),
    ("running left", "running_left"),
    ("recovery s", "recovery_s"),
    ("ok", "ok"),
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults",
        description=__doc__.split("\n\n", 1)[0].split(": ", 1)[1],
        epilog="Scenarios: " + ", ".join(SCENARIOS) + ". docs/reliability.md explains them.",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        metavar="NAME",
        help="a scenario to run (repeatable; default: all): " + ", ".join(SCENARIOS),
    )
    parser.add_argument("--quick", action="store_true", help="small counts, short faults (CI)")
    parser.add_argument(
        "--jobs", type=int, help="jobs per handler kind in each scenario (default: its own)"
    )
    parser.add_argument(
        "--store",
        choices=STORES,
        help="the ledger, for the scenarios that support both (default: their own)",
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def print_table(summaries: Sequence[dict[str, Any]]) -> None:
    rows = [[cell(s.get(key)) for _, key in COLUMNS] for s in summaries]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, (h, _) in enumerate(COLUMNS)]
    print()
    print("  ".join(h.ljust(w) for (h, _), w in zip(COLUMNS, widths, strict=True)))
    for row, summary in zip(rows, summaries, strict=True):
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        if summary.get("skipped"):
            line += f"  skipped: {summary['skipped']}"
        print(line.rstrip())
    for summary in summaries:
        for problem in summary.get("problems") or []:
            print(f"NOT OK {summary['scenario']} [{summary['store']}]: {problem}")
    print(
        "lost, doubled (transactional effects), dead-lettered (healthy jobs) and running"
        " left must be 0; plain re-runs are at-least-once, counted; recovery: the fault's"
        " end to the first job completed after it"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings(quick=args.quick, jobs=args.jobs)
    chosen = cases(args.scenario or list(SCENARIOS), args.store)
    began = time.time()
    print(
        f"bench.faults: {len(chosen)} scenario runs"
        f" ({'quick' if args.quick else 'full'}; {os.cpu_count()} CPUs)",
        flush=True,
    )
    summaries = []
    with environment() as env:
        for name, store in chosen:
            print(f"- {name} [{store}]", flush=True)
            summary = run_case(env, name, store, settings)
            summaries.append(summary)
            print(dumps(summary), flush=True)
    print_table(summaries)
    ok = all(s["ok"] is not False for s in summaries)
    print(
        dumps(
            {
                "command": "python -m bench.faults " + " ".join(argv or sys.argv[1:]),
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                "python": platform.python_version(),
                "seconds": round(time.time() - began, 1),
                "ok": ok,
                "scenarios": summaries,
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
