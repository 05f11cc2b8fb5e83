"""Emitting one fire of a schedule as a job, over the leader's own channel.

A fire is a job whose idempotency key is the schedule's fence key
(``beat:<schedule>:<fire time in UTC>``) and whose id is derived from that key, so
two leaders emitting the same fire (a failover, a split brain) publish two copies of
one job, and the worker's idempotency store runs it once. Jitter delays the job
through the delay ladder by an amount derived from the key: every leader picks the
same delay for the same fire.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import aio_pika
import aio_pika.abc
import aio_pika.exceptions

from broker_jobs.amqp.cancelling import cancelled_by_closing
from broker_jobs.envelope import Job
from broker_jobs.errors import (
    BrokerConnectionError,
    ConfirmTimeoutError,
    NackedError,
    TopologyMissingError,
)
from broker_jobs.publish.async_publisher import amqp_message
from broker_jobs.publish.prepare import JobFactory
from broker_jobs.urls import mask_text
from scheduler.schedules import Schedule


class Emitter:
    """Publishes fires on a channel with publisher confirms (the leader's)."""

    def __init__(self, factory: JobFactory, *, confirm_timeout: float = 10.0) -> None:
        self._factory = factory
        self._confirm_timeout = confirm_timeout

    def job_for(self, schedule: Schedule, fire: datetime) -> tuple[Job, aio_pika.Message, str, str]:
        """The job of one fire, its AMQP message, exchange and routing key."""
        jitter = schedule.jitter_for(fire)
        prepared = self._factory.build(
            schedule.task,
            schedule.payload,
            job_id=schedule.job_id(fire),
            idempotency_key=schedule.fence_key(fire),
            eta=fire + timedelta(seconds=jitter) if jitter > 0 else None,
        )
        route = self._factory.current_route(prepared)
        return prepared.job, amqp_message(prepared.message), route.exchange, route.routing_key

    async def emit(
        self, channel: aio_pika.abc.AbstractChannel, schedule: Schedule, fire: datetime
    ) -> Job:
        """Publish the fire and wait for the broker's confirm; raise a
        :class:`PublishError` or :class:`BrokerConnectionError` otherwise."""
        job, message, exchange_name, routing_key = self.job_for(schedule, fire)
        try:
            exchange = await channel.get_exchange(exchange_name, ensure=False)
            await asyncio.wait_for(
                exchange.publish(message, routing_key, mandatory=True), self._confirm_timeout
            )
        except aio_pika.exceptions.ChannelNotFoundEntity as error:
            raise TopologyMissingError(mask_text(str(error))) from None
        except aio_pika.exceptions.PublishError:  # returned: no queue for the task
            raise self._factory.unroutable(job) from None
        except aio_pika.exceptions.DeliveryError:
            raise NackedError(job.task, job.id) from None
        except TimeoutError:
            raise ConfirmTimeoutError(job.task, job.id, self._confirm_timeout) from None
        except aio_pika.exceptions.AMQPError as error:
            raise BrokerConnectionError(
                f"emitting {schedule.name} failed: {type(error).__name__}: {mask_text(str(error))}"
            ) from None
        except asyncio.CancelledError:
            if not cancelled_by_closing():
                raise
            # A leader standing down closes its connection under an unconfirmed fire.
            raise BrokerConnectionError(
                f"emitting {schedule.name} failed: its connection closed before the broker"
                " confirmed the fire"
            ) from None
        return job
