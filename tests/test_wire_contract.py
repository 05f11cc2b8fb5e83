"""The wire format document is enough: a plain pika publisher that follows only
docs/wire-format.md produces a job that broker-jobs decodes, and a job that
broker-jobs publishes carries exactly the documented properties and headers."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pika
import pytest
from pydantic import BaseModel

from broker_jobs import App, Job
from tests.support import AnyPublisher, Broker, drain
from topology import declare
from topology import names as n

pytestmark = pytest.mark.broker


class Resize(BaseModel):
    url: str
    width: int


@pytest.fixture
def app(make_app: Callable[[], App], connection: pika.BlockingConnection) -> App:
    app = make_app()
    app.declare("image.resize", Resize)
    declare(connection, app.topology(ladder=False))
    return app


def test_a_job_published_from_the_document_alone_decodes_to_the_same_job(
    app: App, connection: pika.BlockingConnection
) -> None:
    # Everything below comes from docs/wire-format.md, not from the library.
    job_id = str(uuid.uuid4())
    payload = {"url": "https://example.com/a.png", "width": 128}
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        exchange=f"{app.namespace}.work",
        routing_key="image.resize",
        body=json.dumps(payload).encode(),
        properties=pika.BasicProperties(
            content_type="application/json",
            delivery_mode=2,
            message_id=job_id,
            type="image.resize",
            timestamp=1_795_946_400,
            headers={
                "bj-wire-version": 1,
                "bj-idempotency-key": "invoice-42-thumb",
                "bj-attempt": 1,
                "bj-created-at": "2026-11-29T10:00:00.000000Z",
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            },
        ),
        mandatory=True,
    )
    expected = Job(
        id=job_id,
        task="image.resize",
        payload=payload,
        idempotency_key="invoice-42-thumb",
        attempt=1,
        created_at=datetime(2026, 11, 29, 10, tzinfo=UTC),
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    assert drain(connection, f"{app.namespace}.task.image.resize") == [expected]


def test_the_minimal_documented_message_decodes_with_defaults(
    app: App, connection: pika.BlockingConnection
) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        f"{app.namespace}.work",
        "image.resize",
        b'{"url": "u", "width": 1}',
        pika.BasicProperties(
            content_type="application/json", delivery_mode=2, message_id="m-1", type="image.resize"
        ),
        mandatory=True,
    )
    (job,) = drain(connection, f"{app.namespace}.task.image.resize")
    assert (job.id, job.idempotency_key, job.attempt) == ("m-1", "m-1", 1)


def test_library_jobs_carry_the_documented_properties(
    app: App, connection: pika.BlockingConnection, make_publisher: Callable[..., AnyPublisher]
) -> None:
    job = make_publisher(app).publish(
        "image.resize", {"url": "u", "width": 2}, idempotency_key="key-7"
    )
    method, properties, body = connection.channel().basic_get(
        f"{app.namespace}.task.image.resize", auto_ack=True
    )
    assert method is not None
    assert method.routing_key == "image.resize"
    assert method.exchange == f"{app.namespace}.work"
    assert json.loads(body) == {"url": "u", "width": 2}
    assert properties.content_type == "application/json"
    assert properties.delivery_mode == 2
    assert properties.message_id == job.id
    assert properties.type == "image.resize"
    assert properties.timestamp == int(job.created_at.timestamp())
    # RabbitMQ adds its own x- headers (x-delivery-count on quorum queues).
    # Headers at their default (wire version 1, attempt 1, a key equal to the id) are
    # left out: the page says a consumer reads an absent header as its default.
    ours = {k: v for k, v in properties.headers.items() if not k.startswith("x-")}
    assert ours == {
        "bj-idempotency-key": "key-7",
        "bj-created-at": job.created_at.isoformat(timespec="microseconds").replace("+00:00", "Z"),
    }


def test_the_pages_table_of_dead_letter_reasons_is_the_codes() -> None:
    """Every reason the worker can write is on the page, with the same meaning, and
    the page lists no other: the two cannot drift."""
    page = (Path(__file__).parent.parent / "docs" / "wire-format.md").read_text()
    block = page.split("<!-- dead-reasons", 1)[1].split("<!-- /dead-reasons -->", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \| (.+) \|$", block, flags=re.MULTILINE)
    assert rows == list(n.DEAD_REASONS.items())


def test_every_header_the_page_types_is_decoded_by_that_type() -> None:
    """The page's header table and the decoder's one rule for types agree."""
    page = (Path(__file__).parent.parent / "docs" / "wire-format.md").read_text()
    typed = dict(re.findall(r"^\| `((?:bj-|trace)[a-z-]+)` \| (string|integer)", page, re.M))
    job_headers = {name: kind for name, kind in typed.items() if not name.startswith("bj-dead")}
    assert job_headers == {
        **dict.fromkeys(n.STRING_HEADERS, "string"),
        **dict.fromkeys(n.INTEGER_HEADERS, "integer"),
    }


def test_the_default_vhost_may_be_written_as_a_slash_or_as_percent_2f(
    app: App, make_publisher: Callable[..., AnyPublisher], broker: Broker
) -> None:
    base = broker.url.split("?")[0].rstrip("/")
    for url in (f"{base}/", f"{base}/%2F"):
        publisher = make_publisher(app, url=url)
        assert publisher.publish("image.resize", {"url": "u", "width": 1}).id
