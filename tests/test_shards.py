"""Shards: one hot task spread over several queues, a job going to its key's shard,
all of them consumed by the task's workers, each job run once."""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter
from collections.abc import Callable

import pika
import pytest
from pydantic import BaseModel

from broker_jobs import App, JobRequest, Publisher
from broker_jobs.errors import ConfigurationError
from broker_jobs.store.memory import MemoryStore
from broker_jobs.worker import Worker, WorkerSettings
from tests.support import Broker, wait_until
from topology.file import TopologyFileError, parse
from topology.lanes import Lane, shard_of
from topology.priority import Priority

pytestmark = pytest.mark.broker


class Item(BaseModel):
    key: str


def test_the_shard_is_crc32_of_the_key_modulo_the_shards() -> None:
    # 0xCBF43926 is CRC-32's published check value of "123456789".
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert shard_of("123456789", 7) == 0xCBF43926 % 7
    assert shard_of("anything", 1) == 0
    assert shard_of("é", 5) == zlib.crc32("é".encode()) % 5


def test_lanes_name_levels_then_shards_and_bad_counts_are_refused() -> None:
    assert Lane(Priority.HIGH, 3).suffix == "@high:3"
    assert Lane(Priority.NORMAL, 0).suffix == ""
    with pytest.raises(ConfigurationError, match="shards must be a whole number from 1 to 64"):
        App().declare("hot.task", Item, shards=0)
    with pytest.raises(TopologyFileError, match="shards"):
        parse({"tasks": {"hot.task": {"shards": 65}}})
    spec = parse({"tasks": {"hot.task": {"shards": 2, "priorities": "strict"}}})
    queues = {queue.name for queue in spec.topology().queues}
    assert {"jobs.task.hot.task", "jobs.task.hot.task:1", "jobs.task.hot.task@high:1",
            "jobs.task.hot.task@low"} <= queues


def _depth(connection: pika.BlockingConnection, queue: str) -> int:
    return connection.channel().queue_declare(queue, passive=True).method.message_count


def test_jobs_spread_over_the_shards_and_a_worker_drains_them_all_once(
    make_app: Callable[[], App], broker: Broker, connection: pika.BlockingConnection
) -> None:
    app = make_app()
    runs: Counter[str] = Counter()

    @app.task("hot.task", shards=3, time_limit=30)
    def hot(payload: Item) -> None:
        runs[payload.key] += 1

    keys = [f"k{n}" for n in range(300)]
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many(
            [JobRequest("hot.task", {"key": key}, idempotency_key=key) for key in keys]
        )
    expected = Counter(shard_of(key, 3) for key in keys)
    depths = {shard: _depth(connection, app.names.task_queue("hot.task", shard=shard))
              for shard in range(3)}
    assert depths == dict(expected)
    assert all(depths.values()), "a shard got nothing"
    # A delayed job leaves the ladder into its shard's queue (here shard 2).
    late = next(key for key in (f"late{n}" for n in range(100)) if shard_of(key, 3) == 2)
    with Publisher(broker.url, app) as publisher:
        publisher.publish("hot.task", {"key": late}, idempotency_key=late, delay=1.5)
    shard_2 = app.names.task_queue("hot.task", shard=2)
    wait_until(lambda: _depth(connection, shard_2) == expected[2] + 1, within=10, what="late")
    outcomes = asyncio.run(
        Worker(broker.url, app, MemoryStore(), WorkerSettings(burst=True, concurrency=4)).run()
    )
    assert outcomes["succeeded"] == len(keys) + 1
    assert runs == Counter(dict.fromkeys([*keys, late], 1))
