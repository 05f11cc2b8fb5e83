"""Beats that disagree: the leader records its schedules' digests, a follower with
another set says which schedules differ (once per change, a WARNING naming them) and
counts them in ``broker_jobs_beat_schedules_mismatched``. The digests and the
comparison without a broker; two beats on a real one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from broker_jobs.observe.beat_metrics import BeatMetrics
from broker_jobs.store import MemoryStore
from broker_jobs.store.records import LeaderRecord
from scheduler import Beat, BeatSettings, Cron, Interval, Schedule
from scheduler.agreement import ScheduleAgreement
from scheduler.digests import Mismatch, schedule_digest, schedule_digests
from scheduler.schedules import CatchUp
from tests.beat_app import TASK, build_app
from tests.support import Broker

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
MISMATCHED = "broker_jobs_beat_schedules_mismatched"


def nightly(**changes: Any) -> Schedule:
    fields: dict[str, Any] = {
        "name": "nightly",
        "task": TASK,
        "payload": {"label": "n"},
        "timing": Cron("0 3 * * *", "Europe/Paris"),
    }
    return Schedule(**{**fields, **changes})


# -- digests -------------------------------------------------------------------------


def test_a_digest_follows_every_part_of_the_definition_but_the_name() -> None:
    digest = schedule_digest(nightly())
    assert digest == schedule_digest(nightly())  # the same definition, another object
    assert digest == schedule_digest(nightly(name="renamed"))  # the name is the key
    assert len(digest) == 12
    changed = [
        nightly(task="other.task"),
        nightly(payload={"label": "m"}),
        nightly(timing=Cron("0 4 * * *", "Europe/Paris")),
        nightly(timing=Cron("0 3 * * *", "UTC")),
        nightly(catch_up=CatchUp.SKIP),
        nightly(lookback=timedelta(hours=2)),
        nightly(jitter=timedelta(seconds=5)),
        nightly(grace=timedelta(seconds=3)),
        nightly(timing=Interval(timedelta(days=1))),
        nightly(timing=Interval(timedelta(days=1), anchor=NOW)),
    ]
    digests = [schedule_digest(schedule) for schedule in changed]
    assert digest not in digests
    assert len(set(digests)) == len(digests)


def test_a_mismatch_names_each_kind_of_difference() -> None:
    here = {"a": "1", "b": "2", "c": "3"}
    leader = {"b": "2", "c": "9", "d": "4"}
    mismatch = Mismatch.between(here, leader)
    assert (mismatch.only_here, mismatch.only_on_leader, mismatch.defined_differently) == (
        ("a",),
        ("d",),
        ("c",),
    )
    assert mismatch.names == ("a", "c", "d")
    assert mismatch.describe() == "only here: a; only on the leader: d; defined differently: c"
    assert not Mismatch.between(here, dict(here))
    assert Mismatch.between({}, {}).describe() == "none"


# -- a follower's comparison ------------------------------------------------------------


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def agreement(registry: CollectorRegistry, **digests: str) -> ScheduleAgreement:
    metrics = BeatMetrics(registry, "shop")
    return ScheduleAgreement("beat-b", digests, metrics, stale_after=15)


def mismatched(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value(MISMATCHED, {"namespace": "shop"})


def leader(seen_at: datetime = NOW, identity: str = "beat-a", **digests: str) -> LeaderRecord:
    return LeaderRecord("shop", identity, NOW - timedelta(hours=1), seen_at, digests)


def test_a_follower_warns_once_per_change_and_counts_the_schedules(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="scheduler.beat")
    follower = agreement(registry, nightly="1", hourly="2", new="3")
    assert mismatched(registry) == 0

    found = follower.check(leader(nightly="1", hourly="9"), NOW)
    assert found is not None
    assert found.names == ("hourly", "new")
    assert mismatched(registry) == 2
    follower.check(leader(nightly="1", hourly="9"), NOW + timedelta(seconds=5))  # no news
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "beat beat-b runs other schedules than the leader beat-a (only here: new; defined"
        " differently: hourly): only the leader's fire; deploy the same schedules to every beat"
    ]

    caplog.clear()
    follower.check(leader(nightly="1", hourly="2"), NOW)  # another difference: said again
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "only here: new;" not in caplog.records[0].getMessage()
    assert mismatched(registry) == 1

    caplog.clear()
    agreed = follower.check(leader(nightly="1", hourly="2", new="3"), NOW)
    assert agreed is not None
    assert not agreed
    assert mismatched(registry) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "beat beat-b runs the same schedules as the leader beat-a again"
    ]


def test_a_follower_compares_only_with_a_live_leader_that_listed_its_schedules(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    follower = agreement(registry, nightly="1")
    no_list = LeaderRecord("shop", "beat-a", NOW, NOW)  # a beat of an older version
    assert follower.check(None, NOW) is None
    assert follower.check(no_list, NOW) is None
    assert follower.check(leader(identity="beat-b"), NOW) is None  # itself
    assert follower.check(leader(NOW - timedelta(seconds=16), other="1"), NOW) is None  # stale
    assert mismatched(registry) == 0
    assert not caplog.records

    assert follower.check(leader(other="1"), NOW)
    assert mismatched(registry) == 2
    follower.leading()  # its own schedules are the ones that fire now
    assert mismatched(registry) == 0


# -- two beats on a real broker ------------------------------------------------------------


def test_a_follower_with_other_schedules_says_which_against_the_leaders(
    broker: Broker,
    namespace: str,
    cleanup_topology: Callable[..., object],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = build_app(namespace)
    cleanup_topology(app.topology())
    store = MemoryStore()
    steady = Schedule("steady", TASK, {}, Interval(timedelta(hours=1)))
    registries = {"leader": CollectorRegistry(), "follower": CollectorRegistry()}
    leading = Beat(
        broker.url,
        app,
        [steady, nightly()],
        store,
        BeatSettings(identity="beat-a", heartbeat=5, announce_every=0.2),
        metrics=BeatMetrics(registries["leader"], namespace),
    )
    following = Beat(
        broker.url,
        app,
        [steady, nightly(payload={"label": "changed"}), nightly(name="added")],
        store,
        BeatSettings(identity="beat-b", heartbeat=5, announce_every=0.2),
        metrics=BeatMetrics(registries["follower"], namespace),
    )
    caplog.set_level(logging.WARNING, logger="scheduler.beat")

    def warned() -> bool:
        return any("runs other schedules" in r.getMessage() for r in caplog.records)

    async def main() -> None:
        first = asyncio.create_task(leading.run())
        while leading.readiness() != (True, "leading") or store.leader(namespace) is None:
            await asyncio.sleep(0.02)  # polling the beat's own flag: no event to await
        second = asyncio.create_task(following.run())
        while not warned() and not second.done():
            await asyncio.sleep(0.02)
        following.stop()
        leading.stop()
        await asyncio.gather(first, second)

    asyncio.run(asyncio.wait_for(main(), 60))
    (message,) = [
        r.getMessage() for r in caplog.records if "runs other schedules" in r.getMessage()
    ]
    assert message == (
        "beat beat-b runs other schedules than the leader beat-a (only here: added; defined"
        " differently: nightly): only the leader's fire; deploy the same schedules to every beat"
    )
    assert registries["follower"].get_sample_value(MISMATCHED, {"namespace": namespace}) == 2
    assert registries["leader"].get_sample_value(MISMATCHED, {"namespace": namespace}) == 0
    record = store.leader(namespace)
    assert record is not None
    assert record.schedules == schedule_digests([steady, nightly()])
