"""Turning a publish call into a job: a job without options goes out before its
model is built (``Prepared``), as the model would encode it, or not at all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import BaseModel

from broker_jobs import App, JobError, encode
from broker_jobs.clock import clock_override
from broker_jobs.publish.prepare import JobFactory


class Resize(BaseModel):
    url: str
    width: int


@pytest.fixture
def factory() -> JobFactory:
    app = App(namespace="factory")
    app.declare("image.resize", Resize, shards=4)
    return JobFactory(app, None)


def test_a_job_without_options_goes_out_as_its_model_encodes(factory: JobFactory) -> None:
    prepared = factory.build("image.resize", Resize(url="https://example.com/é", width=3))
    job = prepared.job
    assert prepared.message == encode(job)  # the same body, properties and headers
    assert (job.id, job.idempotency_key, job.attempt) == (job.id, job.id, 1)
    assert job.payload == {"url": "https://example.com/é", "width": 3}
    assert prepared.route == factory.build("image.resize", job.payload, job_id=job.id).route
    assert prepared.job is job  # built once


def test_a_job_with_options_is_built_before_it_goes_out(factory: JobFactory) -> None:
    prepared = factory.build("image.resize", {"url": "u", "width": 3}, idempotency_key="k")
    assert prepared.message == encode(prepared.job)
    assert prepared.job.idempotency_key == "k"


def test_what_the_model_refuses_is_refused_before_the_send() -> None:
    plain = JobFactory(None, "factory")
    with pytest.raises(JobError, match="invalid task name"):
        plain.build("image.*", {"width": 3})
    with pytest.raises(JobError, match="valid string"):
        plain.build("image.resize", {1: "a key that is not a string"})
    with clock_override(lambda: datetime(2030, 1, 1)), pytest.raises(JobError, match="aware"):
        plain.build("image.resize", {"width": 3})  # a test's clock without a time zone


def test_a_test_clock_in_another_zone_is_kept_in_utc() -> None:
    plain = JobFactory(None, "factory")
    paris = datetime(2030, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    with clock_override(lambda: paris):
        prepared = plain.build("image.resize", {"width": 3})
    assert prepared.job.created_at == datetime(2030, 1, 1, tzinfo=UTC)
    assert prepared.job.created_at.tzinfo is UTC
    assert prepared.message == encode(prepared.job)
