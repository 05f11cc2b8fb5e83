"""Next steps survive kill -9 of their worker at each step (docs/worker.md, "Next
steps, exactly once"): after the handler, after the success and its follow-ups are
recorded, between two follow-up publishes, before the ack; on SQLite and PostgreSQL.
A restarted worker publishes what was recorded (same job ids and keys) and each
follow-up runs once.

The worker is a real process (``broker-jobs worker --burst``) loading an app module
that, for the test only, kills its own process with SIGKILL at the step named by
``KILL_AT``, once (a marker file says it happened).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_jobs import Publisher
from broker_jobs.store.base import Status
from broker_jobs.store.urls import open_store
from tests.support import Broker
from topology import Topology

STEPS = ["after-handler", "after-record", "between-publishes", "before-ack"]

APP = """
    import os, signal
    from pathlib import Path
    from pydantic import BaseModel
    from broker_jobs import App, JobContext
    from broker_jobs.worker.follow_ups import FollowUps
    from broker_jobs.worker.settling import Settling

    class Item(BaseModel):
        n: int

    app = App(namespace={namespace!r})
    RAN = Path({ran!r})
    MARK = Path({mark!r})
    KILL_AT = os.environ["KILL_AT"]

    def kill_at(step):
        if step == KILL_AT and not MARK.exists():
            MARK.write_text(step)
            os.kill(os.getpid(), signal.SIGKILL)

    @app.task("step.parent")
    def parent(payload: Item, job: JobContext) -> None:
        with RAN.open("a") as ran:
            ran.write(f"{{job.idempotency_key}}\\n")
        job.then("step.child", Item(n=1))
        job.then("step.child", Item(n=2))

    @app.task("step.child")
    def child(payload: Item, job: JobContext) -> None:
        with RAN.open("a") as ran:
            ran.write(f"{{job.idempotency_key}}\\n")

    record, send, publish, ack = (
        Settling.record_successes, FollowUps.send, FollowUps._publish, Settling.ack
    )

    async def recording(self, finished):
        if any(done.output is not None for done in finished):
            kill_at("after-handler")  # the handler returned; nothing recorded
        return await record(self, finished)

    async def sending(self, parent, jobs):
        kill_at("after-record")  # committed; nothing published
        return await send(self, parent, jobs)

    async def publishing(self, parent, job):
        if job.idempotency_key.endswith(">2"):
            kill_at("between-publishes")  # the first follow-up confirmed
        return await publish(self, parent, job)

    async def acking(self, acks, settled):
        if any(entry.task == "step.parent" and entry.outcome == "succeeded" for entry in settled):
            kill_at("before-ack")  # both confirmed and marked sent
        return await ack(self, acks, settled)

    Settling.record_successes, FollowUps.send, FollowUps._publish, Settling.ack = (
        recording, sending, publishing, acking
    )
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("step", STEPS)
def test_a_worker_killed_at_each_step_loses_no_follow_up_and_runs_none_twice(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
    request: pytest.FixtureRequest,
    kind: str,
    step: str,
) -> None:
    if kind == "sqlite":
        store_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        store_url = f"{dsn}?schema=t_{uuid.uuid4().hex[:10]}"
    ran, mark = tmp_path / "ran.txt", tmp_path / "killed.txt"
    module = f"steps_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(APP.format(namespace=namespace, ran=str(ran), mark=str(mark)))
    )
    sys.path.insert(0, str(tmp_path))
    try:
        os.environ["KILL_AT"] = step
        app = __import__(module).app
    finally:
        sys.path.remove(str(tmp_path))
        del os.environ["KILL_AT"]
    cleanup_topology(app.topology())
    with Publisher(broker.url, app) as publisher:
        publisher.publish("step.parent", {"n": 0}, idempotency_key="p")
    command = [
        sys.executable, "-c", "from broker_jobs.cli import main; main()",
        "worker", "--url", broker.url, f"{module}:app", "--burst", "--lease", "1",
        "--store", store_url,
    ]  # fmt: skip
    environment = {**os.environ, "KILL_AT": step}

    # The first worker runs the parent only: a child it ran before its death could
    # run again for the handler's own reason (killed before its record), not ours.
    killed = subprocess.run(
        [*command, "--task", "step.parent"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert mark.read_text() == step
    rerun = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, timeout=120, check=False
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    runs = Counter(ran.read_text().split())
    # Killed before its success was recorded, the parent runs again (at least once
    # is the handler's promise); recorded, never again.
    assert runs["p"] == (2 if step == "after-handler" else 1), runs
    assert (runs["p>1"], runs["p>2"]) == (1, 1), runs
    with open_store(store_url) as store:
        output = store.output("p")
        assert output is not None
        assert output.sent_at is not None
        for recorded in output.follow_ups:  # run under the ids recorded with the success
            record = store.get(recorded.idempotency_key)
            assert record is not None
            assert (record.status, record.job_id) == (Status.SUCCEEDED, recorded.id)
