"""Priorities: a queue per level, and the order a worker starts a backlog of mixed
levels in (strict, or weighted without starving low), nothing lost or run twice."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

import pika
import pytest
from pydantic import BaseModel

from broker_jobs import App, JobRequest, Publisher
from broker_jobs.errors import ConfigurationError, JobError
from broker_jobs.ops.status import FoundLanes, collect
from broker_jobs.retry import RetryPolicy
from broker_jobs.store.base import Status
from broker_jobs.store.memory import MemoryStore
from broker_jobs.worker import Worker, WorkerSettings
from broker_jobs.worker.levels import LevelCalls, LevelPicker
from tests.support import Broker, wait_until
from tests.test_worker_recovery import WorkerThread
from topology.file import TopologyFileError, parse
from topology.lanes import Lane, lane_of_routing_key
from topology.priority import (
    InvalidPriorityError,
    Priority,
    PriorityPolicy,
)

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW


class Step(BaseModel):
    key: str
    level: str


# -- levels and policies, without a broker ---------------------------------------------------


@pytest.mark.parametrize(
    ("value", "level"),
    [
        ("high", HIGH),
        ("LOW", LOW),
        (None, NORMAL),
        (9, HIGH),
        (7, HIGH),
        (6, NORMAL),
        (3, NORMAL),
        (2, LOW),
        (0, LOW),
        ("8", HIGH),
        (NORMAL, NORMAL),
    ],
)
def test_priorities_are_levels_or_numbers_0_to_9(value: object, level: Priority) -> None:
    assert Priority.of(value) is level  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["urgent", 10, -1, True, 1.5])
def test_other_priorities_are_refused_with_the_choices(value: object) -> None:
    with pytest.raises(InvalidPriorityError, match="'high', 'normal', 'low'"):
        Priority.of(value)  # type: ignore[arg-type]


def test_policies_parse_strict_and_weights_and_refuse_zero_weights() -> None:
    assert PriorityPolicy.parse("strict").strict
    assert PriorityPolicy.parse(" 5 : 2 : 1 ").weights == (5, 2, 1)
    for bad in ("6:3:0", "6:3", "fast"):
        with pytest.raises(InvalidPriorityError):
            PriorityPolicy.parse(bad)


def test_the_routing_key_names_the_level_in_every_path() -> None:
    assert lane_of_routing_key("image.resize@high") == Lane(HIGH)
    assert lane_of_routing_key("0.1.1.image.resize@low:3") == Lane(LOW, 3)  # from the ladder
    assert lane_of_routing_key("jobs.task.image.resize@high") == Lane(HIGH)  # default exchange
    assert lane_of_routing_key("image.resize:12") == Lane(NORMAL, 12)
    assert lane_of_routing_key("image.resize") == Lane()
    assert lane_of_routing_key(None) == Lane()


def _waiting(*counts: int, at: float = 0.0) -> list[deque[tuple[float, int]]]:
    return [deque((at, index) for index in range(count)) for count in counts]


def test_weights_pick_in_their_proportion_interleaved() -> None:
    picker = LevelPicker(PriorityPolicy(weights=(6, 3, 1)), max_wait=900)
    waiting = _waiting(1000, 1000, 1000, at=time.monotonic())
    picks = [picker.pick(waiting) for _ in range(100)]
    assert Counter(picks) == {0: 60, 1: 30, 2: 10}
    assert max(len(run) for run in "".join(map(str, picks)).split("2")) <= 10  # no bursts


def test_weights_give_an_idle_levels_share_to_the_others() -> None:
    picker = LevelPicker(PriorityPolicy(weights=(6, 3, 1)), max_wait=900)
    waiting = _waiting(0, 10, 10, at=time.monotonic())
    assert Counter(picker.pick(waiting) for _ in range(40)) == {1: 30, 2: 10}


def test_strict_picks_the_highest_unless_a_job_waited_past_the_bound() -> None:
    now = time.monotonic()
    picker = LevelPicker(PriorityPolicy(strict=True), max_wait=60)
    waiting = [deque([(now, "h")]), deque([(now - 30, "n")]), deque([(now - 61, "l")])]
    assert picker.pick(waiting) == 2  # waited 61 s > 60: it goes first
    waiting[2].clear()
    assert picker.pick(waiting) == 0


def test_handler_threads_take_calls_by_level_and_end_marks_last() -> None:
    calls = LevelCalls(LevelPicker(PriorityPolicy(strict=True), max_wait=900))
    for name, level in [("l", LOW), ("n", NORMAL), ("h", HIGH)]:
        calls.put(lambda name=name: name, level)  # type: ignore[misc]
    calls.end()
    taken = []
    while (call := calls.get()) is not None:
        taken.append(call())
    assert taken == ["h", "n", "l"]


# -- declaring and publishing ------------------------------------------------------------------


def test_a_task_with_priorities_has_a_queue_per_level_one_dead_letter_queue(
    make_app: Callable[[], App],
) -> None:
    app = make_app()
    app.declare("report.build", Step, priorities="strict")
    queues = [queue.name for queue in app.topology(ladder=False).queues]
    ns = app.namespace
    assert {
        f"{ns}.task.report.build@high",
        f"{ns}.task.report.build",
        f"{ns}.task.report.build@low",
        f"{ns}.dead.report.build",
    } <= set(queues)


def test_a_priority_for_a_task_without_priorities_is_refused(
    make_app: Callable[[], App], broker: Broker
) -> None:
    app = make_app()
    app.declare("plain.task", Step)
    with Publisher(broker.url, app) as publisher, pytest.raises(JobError, match="no priorities"):
        publisher.publish("plain.task", {"key": "k", "level": "high"}, priority="high")
    with pytest.raises(ConfigurationError, match="priority policy"):
        App().declare("bad.task", Step, priorities="fast")


def test_tasks_of_different_policies_need_workers_of_their_own(
    make_app: Callable[[], App], broker: Broker
) -> None:
    app = make_app()

    @app.task("one.task", priorities="strict")
    def one(payload: Step) -> None: ...

    @app.task("two.task", priorities="6:3:1")
    def two(payload: Step) -> None: ...

    with pytest.raises(ConfigurationError, match="different priority policies"):
        Worker(broker.url, app, MemoryStore(), WorkerSettings(burst=True))
    Worker(broker.url, app, MemoryStore(), WorkerSettings(burst=True, tasks=("one.task",)))


# -- a backlog of mixed levels, drained --------------------------------------------------------


class Starts:
    """The order jobs started in (thread-safe: sync handlers run in threads). The
    handlers wait at ``gate`` until the whole backlog is in the worker's hands, so the
    order after the first starts is the picker's alone, however busy the machine."""

    def __init__(self) -> None:
        self.levels: list[str] = []
        self.keys: Counter[str] = Counter()
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def record(self, payload: Step) -> None:
        with self._lock:
            self.levels.append(payload.level)
            self.keys[payload.key] += 1


def _backlog_app(make_app: Callable[[], App], policy: str, starts: Starts) -> App:
    app = make_app()

    @app.task("mixed.work", priorities=policy, time_limit=60)
    def work(payload: Step) -> None:
        starts.record(payload)
        assert starts.gate.wait(60), "the backlog never reached the worker"
        # A job of some length, which lets the GIL go: a thread that took the next job
        # records its start soon, instead of after the other thread's run of no-ops.
        time.sleep(0.001)

    return app


def _publish_backlog(broker: Broker, app: App, per_level: int) -> list[str]:
    """Low first, then normal, then high: a FIFO worker would run them in that order."""
    requests = [
        JobRequest(
            "mixed.work", {"key": f"{level.value}-{n}", "level": level.value}, priority=level
        )
        for level in (LOW, NORMAL, HIGH)
        for n in range(per_level)
    ]
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many(requests)
    return [str(request.payload["key"]) for request in requests]  # type: ignore[index]


def _drain(broker: Broker, app: App, starts: Starts, jobs: int) -> Counter[str]:
    """A burst worker with a prefetch that holds the whole backlog; the gate opens once
    every job is claimed (the fast path hands a job to the handler threads right
    after its claim), so all of them wait for the two threads together. The moments
    between refills from the broker are bench/priorities.py's to measure."""
    store = MemoryStore()
    settings = WorkerSettings(burst=True, concurrency=2, prefetch=jobs // 3 + 10)
    worker = Worker(broker.url, app, store, settings)
    outcomes: list[Counter[str]] = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: outcomes.append(loop.run_until_complete(worker.run())))
    thread.start()
    try:
        wait_until(lambda: store.counts()[Status.RUNNING] == jobs, within=60, what="all claimed")
        # The loop hands claimed jobs to the threads in the callback that claimed them:
        # once it has run one more, the last claimed are in the threads' queue too.
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30)
    finally:
        starts.gate.set()
        thread.join(120)
        loop.close()
    assert outcomes, "the worker did not finish"
    return outcomes[0]


def _queue_depth(connection: pika.BlockingConnection, queue: str) -> int:
    return connection.channel().queue_declare(queue, passive=True).method.message_count


def test_a_strict_backlog_runs_high_then_normal_then_low_each_once(
    make_app: Callable[[], App], broker: Broker, connection: pika.BlockingConnection
) -> None:
    starts = Starts()
    app = _backlog_app(make_app, "strict", starts)
    keys = _publish_backlog(broker, app, per_level=150)
    for level in Priority:
        assert _queue_depth(connection, app.names.task_queue("mixed.work", level)) == 150
    outcomes = _drain(broker, app, starts, len(keys))
    assert outcomes["succeeded"] == len(keys)
    assert starts.keys == Counter(dict.fromkeys(keys, 1)), "a job lost or run twice"
    # The first two started before the rest arrived; after them the order is strict,
    # but for a thread that took its job and waited for the GIL before its handler's
    # first line: a start recorded a place or two late (never more than the threads).
    settled = starts.levels[2:]
    assert _early_starts(settled) <= 2, f"out of order: {_runs(settled)}"


def test_a_weighted_backlog_runs_in_proportion_and_never_starves_low(
    make_app: Callable[[], App], broker: Broker
) -> None:
    starts = Starts()
    app = _backlog_app(make_app, "6:3:1", starts)
    keys = _publish_backlog(broker, app, per_level=300)
    outcomes = _drain(broker, app, starts, len(keys))
    assert outcomes["succeeded"] == len(keys)
    assert starts.keys == Counter(dict.fromkeys(keys, 1)), "a job lost or run twice"
    # While every level still waits (high runs out first, after ~300 / 0.6 starts),
    # the smooth weighted round robin gives 6:3:1 in every ten picks.
    window = Counter(starts.levels[2:402])
    expected = {"high": 240, "normal": 120, "low": 40}
    assert all(abs(window[level] - count) <= 2 for level, count in expected.items()), window


def _early_starts(levels: list[str]) -> int:
    """Starts of a level before the last start of a higher one (0: strict order)."""
    last = {level: index for index, level in enumerate(levels)}
    rank = {level: Priority(level).rank for level in last}
    return sum(
        1
        for index, level in enumerate(levels)
        if any(rank[other] < rank[level] and last[other] > index for other in last)
    )


def _runs(levels: list[str]) -> list[tuple[str, int]]:
    """``[("high", 140), ("normal", 2), ...]``: a failure's order at a glance."""
    runs: list[tuple[str, int]] = []
    for level in levels:
        if runs and runs[-1][0] == level:
            runs[-1] = (level, runs[-1][1] + 1)
        else:
            runs.append((level, 1))
    return runs


def test_a_delayed_job_leaves_the_ladder_into_its_levels_queue_and_status_adds_levels(
    make_app: Callable[[], App], broker: Broker, connection: pika.BlockingConnection
) -> None:
    app = make_app()
    app.declare("later.work", Step, priorities="6:3:1")
    with Publisher(broker.url, app) as publisher:
        publisher.publish("later.work", {"key": "d", "level": "high"}, priority="high", delay=1.5)
        publisher.publish("later.work", {"key": "n", "level": "normal"})
        publisher.publish("later.work", {"key": "l", "level": "low"}, priority=1)
    high = app.names.task_queue("later.work", HIGH)
    wait_until(lambda: _queue_depth(connection, high) == 1, within=10, what="out of the ladder")
    assert _queue_depth(connection, app.names.task_queue("later.work", LOW)) == 1
    report = collect(
        broker.url, app.names, ["later.work"], MemoryStore(), lanes=app.lanes_by_task()
    )
    assert report.tasks[0].queue.messages == 3
    assert report.tasks[0].queue.consumers == 0
    # Without the app (--namespace and --task), the levels' queues are found on the
    # broker; a dashboard or an exporter keeps them (FoundLanes), but looks again for
    # a task that had no queue yet.
    kept = FoundLanes()
    found = collect(broker.url, app.names, ["later.work", "later.more"], MemoryStore(), lanes=kept)
    assert found.tasks[0].queue.messages == 3
    assert not found.tasks[1].queue.exists
    app.declare("later.more", Step, priorities="strict")
    with Publisher(broker.url, app) as publisher:
        publisher.publish("later.more", {"key": "m", "level": "low"}, priority="low")
    wait_until(
        lambda: _queue_depth(connection, app.names.task_queue("later.more", LOW)) == 1,
        within=10,
        what="the low job queued",
    )
    again = collect(broker.url, app.names, ["later.work", "later.more"], MemoryStore(), lanes=kept)
    assert [task.queue.messages for task in again.tasks] == [3, 1]


def test_a_topology_file_declares_priorities_and_refuses_bad_ones() -> None:
    spec = parse({"tasks": {"report.build": {"priorities": "strict"}, "mail.send": {}}})
    queues = {queue.name for queue in spec.topology().queues}
    assert {"jobs.task.report.build@high", "jobs.task.report.build@low"} <= queues
    assert "jobs.task.mail.send@high" not in queues
    with pytest.raises(TopologyFileError, match="'strict' or weights"):
        parse({"tasks": {"report.build": {"priorities": "fastest"}}})
    with pytest.raises(TopologyFileError, match="must be a string"):
        parse({"tasks": {"report.build": {"priorities": 3}}})


def test_a_retry_goes_back_to_the_queue_of_its_level(
    make_app: Callable[[], App], broker: Broker, connection: pika.BlockingConnection
) -> None:
    app = make_app()
    failed = threading.Event()

    @app.task("flaky.work", priorities="strict", retry=RetryPolicy(schedule=[2]), time_limit=30)
    def flaky(payload: Step) -> None:
        failed.set()
        raise ConnectionError("the first attempt fails")

    with Publisher(broker.url, app) as publisher:
        publisher.publish(
            "flaky.work", {"key": "r", "level": "high"}, priority="high", idempotency_key="r"
        )
    store = MemoryStore()
    worker = WorkerThread(Worker(broker.url, app, store, WorkerSettings()))
    assert failed.wait(30), "the job never ran"
    # Recorded as retrying once the retry's publish was confirmed (and the delivery
    # acked): stopped then, the worker holds nothing the broker would give back.
    wait_until(lambda: _status(store, "r") is Status.RETRYING, within=15, what="retrying")
    worker.stop()  # the retry waits 2 s in the ladder, then lands in its level's queue
    high = app.names.task_queue("flaky.work", HIGH)
    wait_until(lambda: _queue_depth(connection, high) == 1, within=15, what="the retry at high")
    assert _queue_depth(connection, app.names.task_queue("flaky.work", NORMAL)) == 0


def _status(store: MemoryStore, key: str) -> Status | None:
    record = store.get(key)
    return None if record is None else record.status
