"""The app of ``bench.failover``: one task, one interval schedule, and the election's
queue and exchange (declared by each beat, deleted at the end)."""

from __future__ import annotations

from pydantic import BaseModel

from broker_jobs import App
from topology import Topology
from topology.model import ExchangeSpec, QueueSpec
from topology.names import Names
from topology.permissions import beat_leader_queue

TASK = "bench.tick"
SCHEDULE = "tick"


class Tick(BaseModel):
    """The benchmark task's payload model."""

    label: str = "tick"


def build_app(namespace: str, interval: float) -> App:
    app = App(namespace=namespace)
    app.declare(TASK, Tick)
    app.schedule(SCHEDULE, TASK, every=interval)
    return app


def leader_topology(names: Names) -> Topology:
    """The election's queue and its fanout exchange (declared by each beat)."""
    leader = beat_leader_queue(names)
    return Topology(exchanges=(ExchangeSpec(leader, "fanout"),), queues=(QueueSpec(leader),))
