"""The job envelope: immutability, defaults, and the wire encoding both ways."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from broker_jobs import DecodeError, Job, WireMessage, decode, encode
from broker_jobs.envelope import encode_again, new_job_id
from topology import names as n
from topology.priority import Priority


def make_job(**fields: object) -> Job:
    return Job.model_validate({"task": "image.resize", "payload": {"width": 128}, **fields})


def test_defaults_give_an_id_a_key_equal_to_it_and_a_first_attempt() -> None:
    job = make_job()
    assert job.id
    assert job.idempotency_key == job.id
    assert job.attempt == 1
    assert job.created_at.tzinfo is not None
    assert job.due_at is None


def test_jobs_are_immutable_and_copy_validates_changes() -> None:
    job = make_job(idempotency_key="invoice-42")
    with pytest.raises(ValidationError):
        job.attempt = 2  # type: ignore[misc]
    retry = job.copy(attempt=2)
    assert (retry.attempt, retry.id, retry.idempotency_key) == (2, job.id, "invoice-42")
    with pytest.raises(ValidationError):
        job.copy(attempt=0)


def test_naive_times_are_refused_and_aware_ones_become_utc() -> None:
    with pytest.raises(ValidationError, match="timezone-aware"):
        make_job(due_at=datetime(2030, 1, 1))
    paris = timezone(timedelta(hours=1))
    job = make_job(due_at=datetime(2030, 1, 1, 12, tzinfo=paris))
    assert job.due_at == datetime(2030, 1, 1, 11, tzinfo=UTC)
    assert job.due_at.tzinfo == UTC


def test_invalid_task_names_are_refused() -> None:
    for bad in ["", "image.*", "image.#", "a..b", "with space", "x" * 300]:
        with pytest.raises(ValidationError):
            make_job(task=bad)


def test_encode_sets_the_documented_properties_and_headers() -> None:
    job = make_job(
        idempotency_key="k-1",
        attempt=3,
        due_at=datetime(2030, 1, 1, tzinfo=UTC),
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    wire = encode(job)
    assert json.loads(wire.body) == {"width": 128}
    assert (wire.message_id, wire.type) == (job.id, "image.resize")
    assert wire.content_type == "application/json"
    assert wire.delivery_mode == 2
    assert wire.timestamp == int(job.created_at.timestamp())
    assert wire.headers[n.HEADER_IDEMPOTENCY_KEY] == "k-1"
    assert wire.headers[n.HEADER_ATTEMPT] == 3
    assert wire.headers[n.HEADER_DUE_AT] == "2030-01-01T00:00:00.000000Z"
    assert wire.headers[n.HEADER_TRACEPARENT] == job.traceparent


def test_encode_leaves_out_headers_at_their_default() -> None:
    # Wire version 1, the key equal to the id, attempt 1: absent means the default
    # (docs/wire-format.md); fewer bytes for the broker to keep and the worker to read.
    job = make_job()
    wire = encode(job)
    assert list(wire.headers) == [n.HEADER_CREATED_AT]
    assert decode(wire) == job
    keyed = make_job(idempotency_key="order-7")
    assert encode(keyed).headers[n.HEADER_IDEMPOTENCY_KEY] == "order-7"
    assert n.HEADER_ATTEMPT not in encode(keyed).headers


def test_decode_inverts_encode() -> None:
    job = make_job(idempotency_key="k", attempt=2, due_at=datetime.now(UTC), tracestate="a=b")
    assert decode(encode(job)) == job


def test_non_ascii_payloads_survive() -> None:
    job = make_job(payload={"name": "Zoë 🚀"})
    assert decode(encode(job)).payload == {"name": "Zoë 🚀"}


def wire(body: bytes = b"{}", **changes: object) -> WireMessage:
    fields: dict[str, object] = {
        "body": body,
        "message_id": "id-1",
        "type": "image.resize",
        "content_type": "application/json",
        "headers": {},
    }
    fields.update(changes)
    return WireMessage(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (wire(content_type="application/x-python-pickle"), "content-type"),
        (wire(content_type=None), "content-type"),
        (wire(content_encoding="gzip"), "content-encoding"),
        (wire(body=b"\xff\xfe"), "encoding"),
        (wire(body=b"{not json"), "json"),
        (wire(body=b"[1, 2]"), "json"),
        (wire(message_id=None), "message-id"),
        (wire(type=None), "type"),
        (wire(type="bad name"), "envelope"),
        (wire(type="image.resize\n"), "envelope"),  # a regex's $ would let it through
        (wire(headers={n.HEADER_ATTEMPT: 0}), "envelope"),
        (wire(headers={n.HEADER_ATTEMPT: "many"}), "header"),
        (wire(headers={n.HEADER_ATTEMPT: "1"}), "header"),
        (wire(headers={n.HEADER_ATTEMPT: 1.0}), "header"),
        (wire(headers={n.HEADER_ATTEMPT: True}), "header"),
        (wire(headers={n.HEADER_WIRE_VERSION: "1"}), "header"),
        (wire(headers={n.HEADER_IDEMPOTENCY_KEY: bytearray(b"\xff")}), "header"),
        (wire(content_type="application/json; charset=latin-1"), "content-type"),
        (wire(content_type="application/jsonp"), "content-type"),
        (wire(headers={n.HEADER_IDEMPOTENCY_KEY: "k" * 256}), "envelope"),
        (wire(message_id="é" * 128), "envelope"),
        (wire(headers={n.HEADER_IDEMPOTENCY_KEY: 42}), "header"),
        (wire(headers={n.HEADER_DUE_AT: "tomorrow"}), "envelope"),
        (wire(headers={n.HEADER_WIRE_VERSION: 99}), "wire-version"),
        # Python's decoder takes these, JSON does not (a retry would send them as null)
        (wire(body=b'{"x": NaN}'), "json"),
        (wire(body=b'{"x": [-Infinity]}'), "json"),
        (wire(body=b'{"x": 1e999}'), "json"),
        (wire(headers={n.HEADER_PRIORITY: "urgent"}), "envelope"),  # a value, not a type
        (wire(headers={n.HEADER_PRIORITY: 1}), "header"),
    ],
)
def test_decode_failures_raise_decode_error_with_a_reason(
    message: WireMessage, reason: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(message)
    assert caught.value.reason == reason
    assert reason in str(caught.value)


def test_minimal_message_decodes_with_defaults() -> None:
    job = decode(wire(body=b'{"width": 1}', timestamp=1_700_000_000))
    assert (job.id, job.task, job.payload) == ("id-1", "image.resize", {"width": 1})
    assert job.idempotency_key == "id-1"
    assert job.attempt == 1
    assert job.created_at == datetime.fromtimestamp(1_700_000_000, UTC)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_every_string_header_may_be_a_byte_array_of_utf8(kind: type) -> None:
    """aiormq decodes an AMQP byte array ('x') as a bytearray, pika as bytes."""
    values = {
        n.HEADER_IDEMPOTENCY_KEY: "invoice-42-é",
        n.HEADER_CREATED_AT: "2026-11-29T10:00:00.000000Z",
        n.HEADER_DUE_AT: "2026-11-29T10:00:05.000000Z",
        n.HEADER_PRIORITY: "high",
        n.HEADER_TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        n.HEADER_TRACESTATE: "congo=t61rcWkgMzE",
    }
    assert set(values) == set(n.STRING_HEADERS)
    job = decode(wire(headers={name: kind(text.encode()) for name, text in values.items()}))
    assert job.idempotency_key == values[n.HEADER_IDEMPOTENCY_KEY]
    assert job.created_at == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert job.due_at == datetime(2026, 11, 29, 10, 0, 5, tzinfo=UTC)
    assert job.priority is Priority.HIGH
    assert (job.traceparent, job.tracestate) == (
        values[n.HEADER_TRACEPARENT],
        values[n.HEADER_TRACESTATE],
    )


@pytest.mark.parametrize("name", n.STRING_HEADERS)
def test_every_string_header_refuses_other_types_alike(name: str) -> None:
    for value in (42, 1.5, True, ["a"]):
        with pytest.raises(DecodeError) as caught:
            decode(wire(headers={name: value}))
        assert caught.value.reason == "header"
        assert "must be a string" in str(caught.value)


@pytest.mark.parametrize("name", n.INTEGER_HEADERS)
def test_every_integer_header_takes_any_integer_and_refuses_other_types_alike(name: str) -> None:
    assert decode(wire(headers={name: 1})).attempt == 1
    for value in ("1", b"1", 1.0, True, [1]):
        with pytest.raises(DecodeError) as caught:
            decode(wire(headers={name: value}))
        assert caught.value.reason == "header"
        assert "must be an integer" in str(caught.value)


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", 'Application/JSON;charset="UTF-8"'],
)
def test_content_type_may_carry_a_utf8_charset(content_type: str) -> None:
    assert decode(wire(content_type=content_type, content_encoding="UTF-8")).task == "image.resize"


def test_every_reason_is_one_of_the_wire_contracts() -> None:
    with pytest.raises(ValueError, match="DEAD_REASONS"):
        DecodeError("made-up", "a reason nobody documented")


def test_new_job_ids_are_uuid7_carrying_the_millisecond_they_were_made_in() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_job_id() for _ in range(10_000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for job_id in (ids[0], ids[-1]):
        parsed = uuid.UUID(job_id)
        assert str(parsed) == job_id
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert before <= parsed.int >> 80 <= after
    # made one after another, they sort one after another (by millisecond)
    assert [job_id[:13] for job_id in ids] == sorted(job_id[:13] for job_id in ids)
    assert Job(task="image.resize").id[14] == "7"


def test_a_priority_travels_in_its_header_and_normal_adds_none() -> None:
    job = Job(task="image.resize", priority=Priority.LOW)
    message = encode(job)
    assert message.headers[n.HEADER_PRIORITY] == "low"
    assert decode(message).priority is Priority.LOW
    assert n.HEADER_PRIORITY not in encode(Job(task="image.resize")).headers
    with pytest.raises(DecodeError, match="must be 'high', 'normal' or 'low'"):
        decode(wire(headers={n.HEADER_PRIORITY: "urgent"}))


def test_finite_numbers_of_any_size_decode() -> None:
    job = decode(wire(body=b'{"big": 1e308, "tiny": 1e-400, "long": 123456789012345678901234}'))
    assert job.payload == {"big": 1e308, "tiny": 0.0, "long": 123456789012345678901234}


def test_a_message_made_again_keeps_the_body_and_the_publishers_own_headers() -> None:
    """A retry (or the same job for later) replaces its delivery: the body's bytes as
    they came, the publisher's own headers, its content type and timestamp; the job's
    headers from the job; RabbitMQ's x- headers dropped."""
    body = b'{ "width" : 128 }'
    original = wire(
        body=body,
        content_type="application/json; charset=utf-8",
        timestamp=1_795_946_400,
        headers={
            n.HEADER_CREATED_AT: "2026-11-29T12:00:00.5+02:00",
            n.HEADER_IDEMPOTENCY_KEY: "invoice-42",
            n.HEADER_PRIORITY: "high",
            "my-header": b"mine",
            "x-delivery-count": 2,
            "x-death": [{"reason": "expired"}],
        },
    )
    job = decode(original)
    due = datetime(2030, 1, 1, tzinfo=UTC)
    again = encode_again(job.copy(attempt=2, due_at=due, priority=Priority.LOW), original)
    assert again.body == body
    assert (again.message_id, again.type) == ("id-1", "image.resize")
    assert (again.content_type, again.timestamp) == (original.content_type, 1_795_946_400)
    assert again.headers == {
        n.HEADER_CREATED_AT: "2026-11-29T10:00:00.500000Z",
        n.HEADER_IDEMPOTENCY_KEY: "invoice-42",
        n.HEADER_ATTEMPT: 2,
        n.HEADER_DUE_AT: "2030-01-01T00:00:00.000000Z",
        n.HEADER_PRIORITY: "low",
        "my-header": b"mine",
    }
    # what was due comes back due now, and decodes to the job it carries
    now = encode_again(job.copy(attempt=2), again)
    assert n.HEADER_DUE_AT not in now.headers
    assert decode(now) == job.copy(attempt=2, priority=Priority.HIGH)
