"""The fault suite's quick form (``python -m bench.faults --quick``) for the faults
this suite does not inject elsewhere: the ledger's PostgreSQL server killed (``-9``)
and restarted under two workers, an SQLite ledger on a full disk, and a sync handler
overrunning its time limit across two workers.

Each scenario starts real worker processes against its own throwaway RabbitMQ and
(durable) PostgreSQL nodes, never the session's shared ones, since it kills them; it
passes when every must-be-0 figure is 0: confirmed jobs lost, transactional effects
doubled, healthy jobs dead-lettered, records left running, and (time limits)
overlapping executions of one key. docs/reliability.md has the full form.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from bench.faults.harness import Env, Settings, environment
from bench.faults.scenarios import run_case

# Not ``fault``: it kills only servers of its own, never the process's shared ones.
# One process runs the three (under xdist): they share one boot of those servers
# (the module's ``env``), not one each.
pytestmark = [pytest.mark.broker, pytest.mark.long, pytest.mark.xdist_group("fault-suite")]


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with environment() as env:  # in a temporary directory, removed at the end
        yield env


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("scenario", "store"),
    [
        ("postgres-kill", "postgres"),
        ("sqlite-full-disk", "sqlite"),
        ("time-limit-overrun", "sqlite"),
    ],
)
def test_the_quick_fault_scenario_loses_doubles_and_dead_letters_nothing(
    env: Env, scenario: str, store: str
) -> None:
    summary = run_case(env, scenario, store, Settings(quick=True))
    if summary["ok"] is None:
        pytest.skip(summary["skipped"])
    report = json.dumps(summary, indent=1, default=str)
    assert summary["ok"] is True, report
    assert summary["lost"] == 0, report
    assert summary.get("healthy_dead_lettered") in (0, None), report
    assert summary["running_left"] == 0, report
