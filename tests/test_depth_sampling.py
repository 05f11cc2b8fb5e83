"""The exporter's samples of queue depths (broker_jobs.ops.depth_sampling): a report's
ready jobs per task go into the ledger, unknown depths are left out (a gap, not a
zero), and a ledger that refuses them is said once per streak without failing."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from broker_jobs.ops.depth_sampling import DepthSampler
from broker_jobs.ops.status import StatusReport, ledger_only
from broker_jobs.store import MemoryStore, StoreError
from broker_jobs.store.depths import MINUTE
from topology.names import Names

T0 = datetime(2026, 12, 4, 10, 30, tzinfo=UTC)


def report_of(store: MemoryStore, depths: dict[str, int | None]) -> StatusReport:
    report = ledger_only(Names("jobs"), list(depths), store, "a test", now=T0)
    tasks = tuple(replace(t, queue=replace(t.queue, messages=depths[t.task])) for t in report.tasks)
    return replace(report, tasks=tasks)


class RefusingStore(MemoryStore):
    refuse = True

    def record_depths(self, *args: object, **kwargs: object) -> None:
        if self.refuse:
            raise StoreError("disk full")
        super().record_depths(*args, **kwargs)  # type: ignore[arg-type]


def test_ready_jobs_are_sampled_and_unknown_ones_left_out() -> None:
    store = MemoryStore()
    assert DepthSampler().sample(store, report_of(store, {"a": 4, "b": None}))
    assert store.depth_history("jobs", step=MINUTE, since=T0 - timedelta(hours=1)) == {
        "a": [(T0, 4)]
    }


def test_a_ledger_that_refuses_samples_is_said_once_and_again_when_it_takes_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RefusingStore()
    sampler = DepthSampler()
    report = report_of(store, {"a": 1})
    with caplog.at_level(logging.INFO, logger="broker_jobs.ops.depth_sampling"):
        assert not sampler.sample(store, report)
        assert not sampler.sample(store, report)
        store.refuse = False
        assert sampler.sample(store, report)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "does not take the queue depths (disk full)" in said[0]
    assert "takes the queue depths again" in said[1]
