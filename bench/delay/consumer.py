"""The consumer of ``bench.delay``, in a spawned process of its own (so that publishing
does not delay its timers): the reference a worker will be. It decodes each message,
holds it ``seconds_until_due`` with ``loop.call_later``, then records and acks."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Sequence
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import aio_pika
import aio_pika.abc

from broker_jobs.clock import utc_now
from broker_jobs.due import seconds_until_due
from broker_jobs.envelope import Job, decode
from broker_jobs.errors import DecodeError
from broker_jobs.worker.delivery import wire_message
from topology.delay import DELAY_LEVELS, DELAY_UNIT

#: The consumer's prefetch: at 200 jobs/s about 240 jobs wait out their hold at once.
PREFETCH = 1000
#: Once every job was consumed, the consumer stays this long to catch duplicates.
DUPLICATE_GRACE = 3.0
#: Seconds the consumer process has to connect and start consuming.
CONSUMER_START_TIMEOUT = 60.0


class Record(NamedTuple):
    """What the consumer saw of one delivery; seconds throughout."""

    job_id: str
    lateness: float  # run start - due_at
    hold: float  # seconds_until_due on arrival
    timer_late: float  # run start - (arrival + hold): the event loop's own lateness
    hops: int  # sum of the x-death counts: ladder levels passed
    units: int  # whole units routed through the ladder (the routing key's digits)
    ladder_excess: float  # arrival - created_at - units: transit beyond the whole units
    redelivered: bool
    arrived: float  # epoch seconds


def ladder_hops(headers: dict[str, Any]) -> int:
    """Levels passed: the sum of ``count`` over the ``x-death`` entries."""
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return 0
    return sum(int(entry.get("count", 0)) for entry in deaths if isinstance(entry, dict))


def routed_units(routing_key: str | None) -> int:
    """The ladder units spelt by a delayed job's routing key (0 for a direct key)."""
    parts = (routing_key or "").split(".")
    digits = parts[:DELAY_LEVELS]
    if len(parts) <= DELAY_LEVELS or any(digit not in ("0", "1") for digit in digits):
        return 0
    return int("".join(digits), 2)


class HoldingConsumer:
    """The reference consumer: decode, hold until due without blocking, run, ack."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.records: list[Record] = []
        self.errors: list[str] = []
        self._acks: set[asyncio.Task[None]] = set()
        self._seen: set[str] = set()
        self._waiting_for: set[str] | None = None
        self.complete = asyncio.Event()

    async def on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        arrived, arrived_clock = utc_now(), self._loop.time()
        try:
            job = decode(wire_message(message))
        except DecodeError as error:
            self.errors.append(str(error))
            await message.reject(requeue=False)
            return
        hold = seconds_until_due(job, arrived)
        self._loop.call_later(hold, self._run, message, job, arrived, arrived_clock + hold)

    def _run(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        job: Job,
        arrived: datetime,
        planned_clock: float,
    ) -> None:
        ran, ran_clock = utc_now(), self._loop.time()
        due = job.due_at or job.created_at
        headers = dict(message.headers or {})
        units = routed_units(message.routing_key)
        self.records.append(
            Record(
                job_id=job.id,
                lateness=(ran - due).total_seconds(),
                hold=seconds_until_due(job, arrived),
                timer_late=ran_clock - planned_clock,
                hops=ladder_hops(headers),
                units=units,
                ladder_excess=(arrived - job.created_at).total_seconds() - units * DELAY_UNIT,
                redelivered=bool(message.redelivered),
                arrived=arrived.timestamp(),
            )
        )
        self._note(job.id)
        task = self._loop.create_task(message.ack())
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)

    def _note(self, job_id: str) -> None:
        self._seen.add(job_id)
        if self._waiting_for is not None:
            self._waiting_for.discard(job_id)
            if not self._waiting_for:
                self.complete.set()

    def expect(self, job_ids: Sequence[str]) -> None:
        """Set ``complete`` once every one of ``job_ids`` ran."""
        self._waiting_for = set(job_ids) - self._seen
        if not self._waiting_for:
            self.complete.set()

    def report(self) -> dict[str, Any]:
        """Plain data only: it crosses the process boundary as a pickle."""
        return {"records": [tuple(record) for record in self.records], "errors": self.errors}


def consumer_main(url: str, queue: str, pipe: Connection) -> None:
    """The consumer process: say "ready", receive the job ids and a deadline, consume
    until all ran (plus a grace for duplicates) or the deadline, send the records."""
    asyncio.run(_consume(url, queue, pipe))


async def _consume(url: str, queue: str, pipe: Connection) -> None:
    connection = await aio_pika.connect(
        url, client_properties={"connection_name": "bench delay consumer"}
    )
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        consumer = HoldingConsumer()
        source = await channel.get_queue(queue, ensure=False)
        await source.consume(consumer.on_message, no_ack=False)
        pipe.send("ready")
        job_ids, deadline = await asyncio.to_thread(pipe.recv)
        consumer.expect(job_ids)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(consumer.complete.wait(), max(0.0, deadline - time.time()))
        if consumer.complete.is_set():
            await asyncio.sleep(DUPLICATE_GRACE)
    finally:
        await connection.close()
    pipe.send(consumer.report())


class ConsumerProcess:
    """The consumer in a spawned process, so that publishing does not delay its timers."""

    def __init__(self, url: str, queue: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child_end = context.Pipe()
        self._process = context.Process(
            target=consumer_main, args=(url, queue, child_end), name="bench delay consumer"
        )
        self._process.start()
        child_end.close()

    def wait_ready(self) -> None:
        self._receive(CONSUMER_START_TIMEOUT, "did not start consuming")

    def results(self, job_ids: list[str], deadline: float) -> dict[str, Any]:
        """Hand over the jobs to wait for; the records once they all ran (or not)."""
        self._pipe.send((job_ids, deadline))
        timeout = max(0.0, deadline - time.time()) + DUPLICATE_GRACE + 30.0
        report: dict[str, Any] = self._receive(timeout, "sent no results")
        return report

    def _receive(self, timeout: float, failure: str) -> Any:
        try:
            if self._pipe.poll(timeout):
                return self._pipe.recv()
        except EOFError:
            pass
        code = self._process.exitcode
        raise RuntimeError(f"the consumer process {failure} (exit code {code}; see above)")

    def stop(self) -> None:
        self._process.join(10.0)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(5.0)
        self._pipe.close()
