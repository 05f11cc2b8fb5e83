"""The prefetch that follows the pace (worker.prefetch_boost): each queue consumed a
second time while jobs run short, once again when they slow down or run out; the
consumers of a session change one step at a time, and what a cancelled second
consumer delivered stays in hand and is acked like the rest."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator

import aio_pika
import pika
import pytest

from broker_jobs import App, JobRequest, Publisher, Worker, WorkerSettings
from broker_jobs.store import MemoryStore, Status
from broker_jobs.worker import prefetch_boost
from broker_jobs.worker.acks import ChannelAcks
from broker_jobs.worker.prefetch_boost import BoostRule, PrefetchBoost
from broker_jobs.worker.session import Session
from tests.support import Broker, run_burst_worker, wait_until
from tests.test_worker import Add

PREFETCH = 10
DEADLINE = 30.0


def test_the_rule_boosts_at_the_pace_that_runs_through_the_deep_buffer_within_a_second() -> None:
    assert BoostRule(prefetch=80).deep(queues=1) == 320  # the default: a second consumer of 240
    rule = BoostRule(prefetch=80, tick=0.25, window=4, depth=1)
    assert rule.deep(queues=1) == 160
    assert rule.deep(queues=3) == 480
    assert rule.decide(False, 39, queues=1) is False  # 156 a second: not quite
    assert rule.decide(False, 40, queues=1) is True  # 160 a second
    assert rule.decide(False, 40, queues=2) is False  # two queues: 320 a second needed


def test_the_rule_ends_a_boost_below_half_the_pace_over_a_second() -> None:
    rule = BoostRule(prefetch=80, tick=0.25, window=4, depth=1)
    assert rule.decide(False, 100, queues=1) is True
    # Boosted: one slow tick in a fast second keeps it (80 a second is half of 160)...
    assert rule.decide(True, 0, queues=1) is True
    assert rule.decide(True, 0, queues=1) is True
    assert rule.decide(True, 0, queues=1) is True  # 100 in the last second: still >= 80
    # ...a second below half ends it.
    assert rule.decide(True, 19, queues=1) is False  # 19 in the last second
    rule.forget()
    assert rule.decide(True, 19, queues=1) is False  # 76 a second
    assert rule.decide(False, 5, queues=0) is False  # nothing consumed: nothing to boost


@pytest.fixture
def queues(broker: Broker, namespace: str) -> Iterator[dict[str, str]]:
    """Two queues of their own (queue -> task), deleted afterwards."""
    names = {f"{namespace}.a": "a", f"{namespace}.b": "b"}
    with contextlib.closing(broker.connection("test queues")) as connection:
        channel = connection.channel()
        for queue in names:
            channel.queue_declare(queue)
        yield names
        for queue in names:
            channel.queue_delete(queue)


def consumers(broker: Broker, queue: str) -> int:
    with contextlib.closing(broker.connection("test consumers")) as connection:
        method = connection.channel().queue_declare(queue, passive=True).method
        return int(method.consumer_count)


def publish(broker: Broker, queue: str, count: int) -> None:
    with contextlib.closing(broker.connection("test publish")) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(count):
            channel.basic_publish("", queue, str(n).encode())


async def open_session(
    broker: Broker, queues: dict[str, str]
) -> tuple[Session, list[tuple[int, str, ChannelAcks]], asyncio.Event]:
    """A session consuming ``queues``: the deliveries it took (tag, task, acks), and
    an event set at each."""
    taken: list[tuple[int, str, ChannelAcks]] = []
    arrived = asyncio.Event()

    def on_delivery(delivered: aio_pika.abc.DeliveredMessage, task: str, acks: ChannelAcks) -> None:
        taken.append((delivered.delivery_tag or 0, task, acks))
        arrived.set()

    session = Session(await aio_pika.connect(broker.url))
    await session.open(dict(queues), PREFETCH, on_delivery)
    return session, taken, arrived


async def take_at_least(taken: list[object], count: int, arrived: asyncio.Event) -> None:
    async def wait() -> None:
        while len(taken) < count:
            arrived.clear()
            await arrived.wait()

    await asyncio.wait_for(wait(), DEADLINE)


def test_a_boost_consumes_each_queue_twice_with_the_same_prefetch(
    broker: Broker, queues: dict[str, str]
) -> None:
    a = next(iter(queues))

    async def scenario() -> None:
        session, taken, arrived = await open_session(broker, queues)
        try:
            assert [consumers(broker, q) for q in queues] == [1, 1]
            publish(broker, a, 3 * PREFETCH)
            await take_at_least(taken, PREFETCH, arrived)
            await session.boost(PREFETCH)
            assert session.boosted
            assert session.queues_consumed() == 2
            assert [consumers(broker, q) for q in queues] == [2, 2]
            # The second consumer brings as many again (nothing was acked).
            await take_at_least(taken, 2 * PREFETCH, arrived)
            await session.unboost()
            assert [consumers(broker, q) for q in queues] == [1, 1]
            # What the cancelled consumer delivered is still in hand: acked, it leaves
            # the queue, and the remaining consumer brings the rest.
            assert session.acks is not None
            for tag, _, _ in list(taken):
                await session.acks.channel.basic_ack(tag)
            await take_at_least(taken, 3 * PREFETCH, arrived)
            assert {task for _, task, _ in taken} == {"a"}
        finally:
            await session.close()
        assert consumers(broker, a) == 0
        with contextlib.closing(broker.connection("test depth")) as connection:
            left = connection.channel().queue_declare(a, passive=True).method.message_count
        assert left == PREFETCH  # the last ten, never acked, returned with the connection

    asyncio.run(scenario())


def test_pause_resume_and_stop_while_boosted_touch_every_consumer_of_the_queue(
    broker: Broker, queues: dict[str, str]
) -> None:
    a = next(iter(queues))

    async def scenario() -> None:
        session, _, _ = await open_session(broker, queues)
        try:
            await session.boost(PREFETCH)
            await session.boost(PREFETCH)  # once is enough
            assert [consumers(broker, q) for q in queues] == [2, 2]
            await session.stop_consuming([a])  # a pause cancels both of a's consumers
            assert [consumers(broker, q) for q in queues] == [0, 2]
            await session.consume({a: "a"})  # the resume, boosted like the rest
            assert [consumers(broker, q) for q in queues] == [2, 2]
            await session.unboost()
            await session.unboost()
            assert [consumers(broker, q) for q in queues] == [1, 1]
            await session.boost(PREFETCH)
            await session.cancel_consumers()  # the graceful stop: none at all...
            assert [consumers(broker, q) for q in queues] == [0, 0]
            await session.boost(PREFETCH)  # ...and none after it
            await session.consume({a: "a"})
            assert [consumers(broker, q) for q in queues] == [0, 0]
        finally:
            await session.close()

    asyncio.run(scenario())


def test_a_deeper_second_consumer_has_its_own_prefetch_and_the_first_keeps_the_base(
    broker: Broker, queues: dict[str, str]
) -> None:
    """RabbitMQ gives a consumer the channel's prefetch of the moment it starts: the
    boost's consumers get theirs, and a queue resumed while boosted gets both again."""
    node = broker.controllable()
    a = next(iter(queues))

    async def scenario() -> str:
        session, _, _ = await open_session(broker, queues)
        try:
            await session.boost(3 * PREFETCH)
            await session.stop_consuming([a])
            await session.consume({a: "a"})
            return await asyncio.to_thread(
                node.ctl, "list_consumers", "-q", "--no-table-headers", "queue_name",
                "prefetch_count",
            )  # fmt: skip
        finally:
            await session.close()

    listed = asyncio.run(scenario())
    rows = [line.split() for line in listed.splitlines()]
    assert sorted((queue, int(n)) for queue, n in rows if queue in queues) == sorted(
        (queue, n) for queue in queues for n in (PREFETCH, 3 * PREFETCH)
    )


def test_the_boost_follows_the_pace_of_completions(broker: Broker, queues: dict[str, str]) -> None:
    """Tick by tick (a tick of 0.25 s; two queues of prefetch 10, second consumers of
    30: the deep buffer is 80, 20 completions a tick)."""

    async def scenario() -> None:
        session, _, _ = await open_session(broker, queues)
        idle = asyncio.Event()
        ended: list[list[str]] = []
        boost = PrefetchBoost(
            PREFETCH,
            session=lambda: session,
            completed=lambda: 0,
            working=idle.wait,
            is_working=idle.is_set,
            on_unboost=lambda tags, after: ended.append(tags),
        )
        try:
            await boost.follow(session, 19)
            assert not session.boosted
            await boost.follow(session, 20)
            assert session.boosted
            assert [consumers(broker, q) for q in queues] == [2, 2]
            await boost.follow(session, 0)
            await boost.follow(session, 1)
            assert session.boosted  # 40 in the last second: half the pace, still boosted
            await boost.follow(session, 0)
            assert not session.boosted  # 21 in the last second
            assert [len(tags) for tags in ended] == [2]  # the two second consumers
            assert [consumers(broker, q) for q in queues] == [1, 1]
        finally:
            await session.close()

    asyncio.run(scenario())


def test_a_worker_at_the_default_prefetch_boosts_through_a_drain_and_runs_each_job_once(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app()
    ran: list[str] = []

    @app.task("boost.job")
    def job(payload: Add) -> None:
        ran.append(payload.key)

    count = 2000
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest("boost.job", {"key": f"k{n}"}) for n in range(count)])
    store = MemoryStore()
    caplog.set_level(logging.DEBUG, logger="broker_jobs.worker.prefetch_boost")
    # concurrency 1: prefetch 66, the boost at 264 jobs a second
    counts = run_burst_worker(broker, app, store, concurrency=1)
    assert counts["succeeded"] == count
    assert sorted(ran) == sorted(f"k{n}" for n in range(count))  # each once
    assert {status: n for status, n in store.counts().items() if n} == {Status.SUCCEEDED: count}
    assert any("each queue consumed a second time" in r.getMessage() for r in caplog.records)
    queue = app.names.task_queue("boost.job")
    assert connection.channel().queue_declare(queue, passive=True).method.message_count == 0


def test_what_an_ended_boost_left_waiting_goes_back_to_its_queue_when_jobs_turn_long(
    broker: Broker,
    make_app: Callable[[], App],
    connection: pika.BlockingConnection,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Short jobs boost the worker; then one job blocks its only thread: the pace
    falls, the boost ends, and what its second consumer delivered is returned (the
    worker keeps one consumer's buffer); released, every job runs once."""
    monkeypatch.setattr(prefetch_boost, "LEFTOVER_WAIT", 0.5)
    app = make_app()
    ran: list[str] = []
    release = threading.Event()

    @app.task("turns.long")
    def job(payload: Add) -> None:
        ran.append(payload.key)
        if payload.key == "block":
            release.wait(60)

    keys = [f"a{n}" for n in range(3000)] + ["block"] + [f"b{n}" for n in range(500)]
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest("turns.long", {"key": key}) for key in keys])
    store = MemoryStore()
    caplog.set_level(logging.INFO, logger="broker_jobs.worker.fast_path")
    # concurrency 1: prefetch 66; a lease of 3 s sweeps every 0.5 s
    settings = WorkerSettings(concurrency=1, lease=3, burst=True)
    worker = Worker(broker.url, app, store, settings)
    counts: list[Counter[str]] = []
    thread = threading.Thread(target=lambda: counts.append(asyncio.run(worker.run())))
    thread.start()
    try:
        returned = wait_until(
            lambda: next(
                (r for r in caplog.records if "returned to their queues" in r.getMessage()), None
            ),
            within=DEADLINE,
            what="the ended boost's deliveries returned",
        )
        assert returned.getMessage().split()[0].isdigit()
    finally:
        release.set()
        thread.join(DEADLINE)
    assert not thread.is_alive()
    [outcomes] = counts
    assert outcomes["succeeded"] == len(keys)
    assert outcomes["returned"] >= 1
    assert sorted(ran) == sorted(keys)  # each once, the returned ones too
    assert {status: n for status, n in store.counts().items() if n} == {Status.SUCCEEDED: len(keys)}
    queue = app.names.task_queue("turns.long")
    assert connection.channel().queue_declare(queue, passive=True).method.message_count == 0
