"""The beat's metrics and probes (docs/metrics.md, "Beat") against a real broker:
leadership of two beats and a failover, fires counted by kind and skipped by the
catch-up policy, /readyz while leading, following and cut off from the broker."""

from __future__ import annotations

import json
import re
import signal
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from broker_jobs.observe.beat_metrics import BeatMetrics
from broker_jobs.store import MemoryStore, SQLiteStore
from broker_jobs.testing.tcp_proxy import TcpProxy
from scheduler import Beat, BeatSettings, Cron, Interval, Schedule, load_schedules
from scheduler.beat import fire_key
from scheduler.schedules import CatchUp, count_fires
from tests import test_beat as _beat_tests
from tests.beat_app import TASK, build_app
from tests.support import Broker, wait_until
from tests.test_beat import CATCH_UP, EVERY_SECOND, SECOND, BeatProcesses, run_beat_until

# Beat subprocesses sharing one store (the fixture of tests/test_beat.py).
beats = _beat_tests.beats

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

# -- scraping (the exporter's tests use these too) -------------------------------------


def metrics_port(log: Callable[[], str]) -> int:
    """The port a daemon started with --metrics-port 0 serves on, from its log."""
    found = wait_until(
        lambda: re.search(r"/readyz on port (\d+)", log()), within=20, what="the metrics server"
    )
    return int(found.group(1))


def scrape(port: int) -> Samples:
    """Every sample of /metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """The status code and JSON body of /healthz or /readyz."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def is_leader(port: int, namespace: str) -> float | None:
    return sample(scrape(port), "broker_jobs_beat_is_leader", namespace=namespace)


# -- two beat processes ----------------------------------------------------------------


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beat processes started from now on serve metrics on a free port each."""
    monkeypatch.setenv("BROKER_JOBS_METRICS_PORT", "0")


@pytest.mark.usefixtures("served")
def test_the_leader_alone_reports_leading_and_a_failover_flips_it(
    namespace: str, beats: Callable[[str], BeatProcesses]
) -> None:
    group = beats(EVERY_SECOND)
    ports = {}
    for identity in ("beat-0", "beat-1"):
        group.start(identity, heartbeat=2)
        ports[identity] = metrics_port(lambda identity=identity: group.log(identity))
    for port in ports.values():
        wait_until(lambda port=port: probe(port, "/readyz")[0] == 200, within=30, what="ready")
    leader, follower = wait_until(
        lambda: next(
            (
                (one, other)
                for one, other in (("beat-0", "beat-1"), ("beat-1", "beat-0"))
                if is_leader(ports[one], namespace) == 1 and is_leader(ports[other], namespace) == 0
            ),
            None,
        ),
        within=30,
        what="one beat leading, the other following",
    )
    assert probe(ports[leader], "/readyz") == (200, {"ok": True, "status": "leading"})
    assert probe(ports[follower], "/readyz") == (200, {"ok": True, "status": "following"})
    assert probe(ports[follower], "/healthz") == (200, {"ok": True, "status": "alive"})
    fires = "broker_jobs_beat_fires_total"
    labels = {"namespace": namespace, "schedule": "every-second"}
    wait_until(
        lambda: (sample(scrape(ports[leader]), fires, **labels, kind="on_time") or 0) >= 2,
        within=10,
        what="the leader counting its fires",
    )
    followed = scrape(ports[follower])
    assert sample(followed, fires, **labels, kind="on_time") == 0
    assert sample(followed, fires, **labels, kind="caught_up") == 0
    assert sample(followed, "broker_jobs_broker_connected") == 1
    assert (sample(followed, "process_open_fds") or 0) > 0  # the process's own metrics

    group.running[leader].send_signal(signal.SIGKILL)
    wait_until(
        lambda: is_leader(ports[follower], namespace) == 1,
        within=15,
        what=f"{follower} leading after {leader} was killed",
    )
    assert probe(ports[follower], "/readyz") == (200, {"ok": True, "status": "leading"})
    wait_until(
        lambda: (sample(scrape(ports[follower]), fires, **labels, kind="on_time") or 0) >= 1,
        within=10,
        what="the new leader counting its fires",
    )
    group.stop_all()


@pytest.mark.usefixtures("served")
def test_readyz_fails_while_the_broker_is_cut_off_and_the_outage_is_counted(
    broker: Broker, namespace: str, beats: Callable[[str], BeatProcesses]
) -> None:
    with TcpProxy(broker.url) as partition:
        group = beats(EVERY_SECOND)
        group.broker = Broker(partition.url)
        group.start("cut", heartbeat=1)
        port = metrics_port(lambda: group.log("cut"))
        wait_until(lambda: probe(port, "/readyz")[0] == 200, within=30, what="ready")
        wait_until(lambda: is_leader(port, namespace) == 1, within=10, what="leading")

        partition.cut()
        _, body = wait_until(
            lambda: (answer := probe(port, "/readyz"))[0] == 503 and answer,
            within=15,
            what="/readyz failing after the cut",
        )
        assert body == {"ok": False, "status": "no session with the broker"}
        assert probe(port, "/healthz")[0] == 200, "the loop still turns"
        cut_off = scrape(port)
        assert sample(cut_off, "broker_jobs_broker_connected") == 0
        assert sample(cut_off, "broker_jobs_beat_is_leader", namespace=namespace) == 0

        partition.heal()
        wait_until(lambda: probe(port, "/readyz")[0] == 200, within=40, what="ready again")
        back = scrape(port)
        assert sample(back, "broker_jobs_broker_connected") == 1
        assert sample(back, "broker_jobs_broker_reconnects_total") == 1
        outage = sample(back, "broker_jobs_broker_disconnected_seconds_total")
        assert outage is not None
        assert outage > 0
        group.stop_all()


# -- fires by kind, and skipped ----------------------------------------------------------


def test_fires_are_counted_on_time_caught_up_and_skipped_by_policy(
    broker: Broker, namespace: str, tmp_path: Path, cleanup_topology: Callable[..., object]
) -> None:
    """The last fires in the store are ten fires old: each policy catches up its
    way (as in test_beat's catch-up test), and the counters say so."""
    app = build_app(namespace)
    cleanup_topology(app.topology())
    (tmp_path / "catch-up.toml").write_text(CATCH_UP)
    stopped = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    schedules = load_schedules(app, [tmp_path / "catch-up.toml"])
    store = SQLiteStore(tmp_path / "beat.db")
    for schedule in schedules:  # the outage's start, through the Store API
        store.record_fire(fire_key(namespace, schedule.name), stopped)
    registry = CollectorRegistry()
    metrics = BeatMetrics(registry, namespace, [schedule.name for schedule in schedules])
    now = stopped + 10.25 * SECOND
    beat = Beat(broker.url, app, schedules, store, metrics=metrics, clock=lambda: now)

    def counted(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"namespace": namespace, **labels})

    def caught_up_everywhere() -> bool:
        return all(
            store.last_fire(fire_key(namespace, s.name)) == stopped + 10 * SECOND for s in schedules
        )

    def leading() -> bool:
        return counted("broker_jobs_beat_is_leader") == 1

    assert counted("broker_jobs_beat_is_leader") == 0
    seen_leading: list[bool] = []
    run_beat_until(beat, lambda: seen_leading.append(leading()) or caught_up_everywhere())
    assert any(seen_leading), "is_leader was never 1 while the beat emitted"
    # Missed: stopped+1 .. stopped+8 (late by more than the 2 s grace); on time: +9, +10.
    expected = {  # schedule: (caught_up, on_time, skipped)
        "all": (8, 2, 0),
        "latest": (1, 2, 7),
        "skip": (0, 2, 8),
        "bounded": (2, 2, 0),  # lookback 4 s: fires older are not looked at, nor counted
    }
    for name, (caught_up, on_time, skipped) in expected.items():
        fires = "broker_jobs_beat_fires_total"
        assert counted(fires, schedule=name, kind="caught_up") == caught_up, name
        assert counted(fires, schedule=name, kind="on_time") == on_time, name
        assert counted("broker_jobs_beat_fires_skipped_total", schedule=name) == skipped, name
    assert counted("broker_jobs_beat_is_leader") == 0, "stopped: no longer leading"
    assert registry.get_sample_value("broker_jobs_broker_connected") == 0
    assert registry.get_sample_value("broker_jobs_broker_reconnects_total") == 0


def test_a_beat_without_metrics_still_runs(
    broker: Broker, namespace: str, cleanup_topology: Callable[..., object]
) -> None:
    app = build_app(namespace)
    app.schedule("steady", TASK, every=0.2)
    cleanup_topology(app.topology())
    emitted: list[datetime] = []
    beat = Beat(
        broker.url,
        app,
        load_schedules(app),
        MemoryStore(),
        BeatSettings(heartbeat=2),
        on_emitted=lambda schedule, fire, job: emitted.append(fire),
    )
    assert beat.readiness() == (False, "no session with the broker")
    run_beat_until(beat, lambda: len(emitted) >= 2)
    assert len(emitted) >= 2


# -- counting skipped fires (no broker) ------------------------------------------------

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def schedule(timing: Any, catch_up: CatchUp, lookback: timedelta = timedelta(hours=1)) -> Schedule:
    return Schedule("s", TASK, {}, timing, catch_up=catch_up, lookback=lookback)


@pytest.mark.parametrize(
    ("catch_up", "caught_up", "skipped"),
    [(CatchUp.ALL, 9, 0), (CatchUp.LATEST, 1, 8), (CatchUp.SKIP, 0, 9)],
)
def test_due_fires_split_by_kind_with_the_skipped_count(
    catch_up: CatchUp, caught_up: int, skipped: int
) -> None:
    every_minute = schedule(Interval(timedelta(minutes=1)), catch_up)
    due = every_minute.due(NOW - timedelta(minutes=10), NOW + SECOND)
    assert (len(due.caught_up), due.on_time, due.skipped) == (caught_up, (NOW,), skipped)
    assert list(due.fires) == every_minute.due_fires(NOW - timedelta(minutes=10), NOW + SECOND)
    assert [kind.value for _, kind in due.with_kinds()] == ["caught_up"] * caught_up + ["on_time"]


def test_a_long_outage_skips_what_the_lookback_holds_and_counts_fast() -> None:
    every_second = schedule(Interval(timedelta(seconds=1)), CatchUp.LATEST)
    due = every_second.due(NOW - timedelta(days=3), NOW)
    # The lookback's 3600 fires, less the on-time ones (+2 s grace) and the latest kept.
    assert due.skipped == 3600 - 3 - 1
    interval = Interval(timedelta(seconds=7), anchor=NOW)
    start, until = NOW - timedelta(minutes=3), NOW + timedelta(minutes=5, seconds=1)
    walked = sum(1 for _ in interval.fires(start, until))
    assert count_fires(interval, start, until) == walked == 69
    assert count_fires(Cron("*/10 * * * *"), NOW, NOW + timedelta(hours=1)) == 6
    assert count_fires(interval, until, start) == 0
