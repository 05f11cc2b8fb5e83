"""The publisher of ``bench.delay``: one ``AsyncPublisher.publish_many`` of a tick's
delayed jobs every ``TICK`` seconds, each tick started on schedule."""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from broker_jobs import App, AsyncPublisher, JobRequest, PublishBatchError
from broker_jobs.envelope import Job

TASK = "bench.delayed"
PAYLOAD: dict[str, Any] = {"url": "https://example.com/images/123.png", "width": 128}
#: Seconds between publishing ticks: 200 jobs/s is 20 jobs every 100 ms.
TICK = 0.1
#: The warm-up's delayed job: long enough to take the ladder (declared on first use).
WARM_UP_DELAY = 1.5


class Delayed(BaseModel):
    """The benchmark task's payload model."""

    url: str
    width: int


def fresh_app() -> App:
    app = App(namespace=f"bdelay{secrets.token_hex(4)}")
    app.declare(TASK, Delayed)
    return app


@dataclass
class Published:
    job_ids: list[str] = field(default_factory=list)
    warm_up_ids: list[str] = field(default_factory=list)
    failed: int = 0
    confirm_latencies: list[float] = field(default_factory=list)
    tick_lags: list[float] = field(default_factory=list)
    elapsed: float = 0.0


def tick_sizes(total: int, rate: float) -> list[int]:
    """Jobs per tick for a steady ``rate``, ``total`` in all."""
    per_tick = rate * TICK
    ticks = math.ceil(total / per_tick)
    sizes = [round((i + 1) * per_tick) - round(i * per_tick) for i in range(ticks)]
    sizes[-1] -= sum(sizes) - total
    return [size for size in sizes if size > 0]


async def publish_round(url: str, app: App, delays: list[float], rate: float) -> Published:
    async with AsyncPublisher(url, app, connection_name="bench delay publisher") as publisher:
        published = Published()
        # Connect, declare, check the ladder: untimed, like the publish benchmark.
        for delay in (0.0, WARM_UP_DELAY):
            job = await publisher.publish(TASK, PAYLOAD, delay=delay)
            published.warm_up_ids.append(job.id)
        await publish_paced(publisher, delays, rate, published)
        return published


async def publish_paced(
    publisher: AsyncPublisher, delays: list[float], rate: float, published: Published
) -> None:
    """One ``publish_many`` per tick, each started on schedule without waiting for the
    previous tick's confirms."""
    loop = asyncio.get_running_loop()
    start, offset = loop.time(), 0
    ticks: list[asyncio.Task[None]] = []
    for index, size in enumerate(tick_sizes(len(delays), rate)):
        scheduled = start + index * TICK
        await asyncio.sleep(max(0.0, scheduled - loop.time()))
        published.tick_lags.append(loop.time() - scheduled)
        batch = [JobRequest(TASK, PAYLOAD, delay=delay) for delay in delays[offset : offset + size]]
        offset += size
        ticks.append(asyncio.create_task(publish_tick(publisher, batch, published)))
    published.elapsed = loop.time() - start + TICK
    await asyncio.gather(*ticks)


async def publish_tick(
    publisher: AsyncPublisher, batch: list[JobRequest], published: Published
) -> None:
    """Publish one tick's jobs; note the confirmed ids, failures and confirm latencies."""

    def confirmed(job: Job) -> None:
        published.confirm_latencies.append(time.time() - job.created_at.timestamp())

    try:
        jobs = await publisher.publish_many(batch, on_confirmed=confirmed)
    except PublishBatchError as error:
        published.job_ids.extend(error.confirmed)
        published.failed += len(error.failed)
        return
    published.job_ids.extend(job.id for job in jobs)
