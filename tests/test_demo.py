"""The end-to-end demo (examples/demo, ``./scripts/demo``) against the session's broker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import Broker
from topology import Names, QueueOptions, Topology, namespace_topology

ROOT = Path(__file__).resolve().parents[1]
DEMO_TASKS = ("email.send", "image.resize")


@pytest.mark.broker
def test_demo_runs_end_to_end(
    broker: Broker, cleanup_topology: Callable[[Topology], Topology]
) -> None:
    namespace = f"demo{uuid.uuid4().hex[:10]}"
    # Every object of the demo's namespace, the delay ladder included, is deleted after.
    cleanup_topology(
        namespace_topology(Names(namespace), [(task, QueueOptions()) for task in DEMO_TASKS])
    )
    env = {**os.environ, "BROKER_JOBS_URL": broker.url, "DEMO_NAMESPACE": namespace}
    result = subprocess.run(
        [sys.executable, "-m", "examples.demo.run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"namespace {namespace!r}" in output
    assert "topology apply: ok" in output
    assert "published 9 jobs" in output
    assert "published 2 poison messages" in output
    # Poison messages may have ledger records too (dead), depending on the worker.
    assert re.search(
        r"ledger totals: queued 0, scheduled 0, running 0, succeeded 7, retrying 0, failed 0,"
        r" dead [24], cancelled 0\n",
        output,
    ), output
    assert f"{namespace}.dead.email.send: 2 message(s) (exhausted: 1, json: 1)" in output
    assert f"{namespace}.dead.image.resize: 2 message(s) (permanent: 1, schema: 1)" in output
    assert "[FAIL]" not in output
    assert output.count("[ok]") == 19, output
    assert "PASSED" in output
