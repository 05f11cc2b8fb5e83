"""The job envelope and its wire form (``docs/wire-format.md``).

A :class:`Job` is immutable; :meth:`Job.copy` makes a changed one (the next attempt
of a retry, say). :func:`encode` turns a job into a :class:`WireMessage` (AMQP
properties plus a JSON body) and :func:`decode` turns one back, raising
:class:`~broker_jobs.errors.DecodeError` with the reason when the message is not a
valid job. The driver adapters (pika, aio-pika) only copy fields in and out.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from broker_jobs.clock import utc_now
from broker_jobs.errors import DecodeError, describe_validation_error
from topology import names as n
from topology.priority import Priority

#: AMQP delivery mode 2: the broker writes the message to disk.
PERSISTENT = 2
#: The longest job id: message_id is an AMQP short string.
MAX_ID_BYTES = 255


def new_job_id() -> str:
    """A UUID version 7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits.

    Ids made one after another sort one after another, so the store's records of new
    jobs land beside each other in its key index: a claim of a few new jobs writes one
    or two index pages instead of one page per job (SQLite, 50,000 records: a 5-job
    claim ~200 -> ~120 us). Random enough to be unique: 74 bits within a millisecond.
    """
    milliseconds = time.time_ns() // 1_000_000
    value = (milliseconds & _MILLISECONDS_MASK) << 80 | int.from_bytes(os.urandom(10))
    # The UUID's canonical text, formatted here: a ``uuid.UUID`` on the way cost
    # as much again (a new id is on every publish's path).
    digits = f"{value & ~_VERSION_AND_VARIANT_MASK | _VERSION_7_AND_VARIANT:032x}"
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


_MILLISECONDS_MASK = (1 << 48) - 1
_VERSION_AND_VARIANT_MASK = 0xF << 76 | 0x3 << 62
_VERSION_7_AND_VARIANT = 0x7 << 76 | 0x2 << 62  # version 7, variant RFC 9562


class Job(BaseModel):
    """One unit of work: a task name, its JSON payload and delivery metadata."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=new_job_id, min_length=1, max_length=255)
    task: str
    payload: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str = Field(default="", max_length=255)
    attempt: int = Field(default=1, ge=1)
    created_at: datetime = Field(default_factory=utc_now)
    due_at: datetime | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    #: Its task's queue of this level (tasks declared with priorities; else normal).
    priority: Priority = Priority.NORMAL

    @field_validator("task")
    @classmethod
    def _task_name(cls, task: str) -> str:
        return n.check_task_name(task)

    @field_validator("id")
    @classmethod
    def _short_string(cls, job_id: str) -> str:
        # message_id is an AMQP short string: 255 bytes, not characters.
        if len(job_id.encode("utf-8")) > MAX_ID_BYTES:
            raise ValueError(f"must be at most {MAX_ID_BYTES} bytes in UTF-8 (AMQP short string)")
        return job_id

    @field_validator("created_at", "due_at")
    @classmethod
    def _aware_utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("must be timezone-aware (for example datetime.now(UTC))")
        try:
            return value.astimezone(UTC)
        except OverflowError:  # 0001-01-01T00:00+14:00: before year 1 in UTC
            raise ValueError("is out of the range of times (year 1 to 9999 in UTC)") from None

    def model_post_init(self, context: Any, /) -> None:
        # The key defaults to the id: a job published once runs once.
        if not self.idempotency_key:
            object.__setattr__(self, "idempotency_key", self.id)

    def copy(self, **changes: Any) -> Job:  # type: ignore[override,unused-ignore]
        """A new job with ``changes`` applied and validated."""
        return Job.model_validate({**self.model_dump(), **changes})


@dataclass(frozen=True)
class WireMessage:
    """The AMQP view of a job: the properties we set and the body."""

    body: bytes
    message_id: str | None
    type: str | None
    content_type: str | None
    content_encoding: str | None = n.CONTENT_ENCODING
    timestamp: int | None = None
    delivery_mode: int = PERSISTENT
    headers: Mapping[str, Any] = field(default_factory=dict)


#: What ``json.dumps`` with these options builds on every call, built once.
_COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode(job: Job) -> WireMessage:
    """Serialise ``job``. Raises ``TypeError``/``ValueError`` only for a payload that
    is not JSON; callers turn that into a ``PayloadEncodingError``."""
    # Headers at their wire default (version 1, the key equal to the id, attempt 1)
    # are left out: every consumer reads an absent header as its default.
    headers: dict[str, Any] = {n.HEADER_CREATED_AT: _iso(job.created_at)}
    if job.idempotency_key != job.id:
        headers[n.HEADER_IDEMPOTENCY_KEY] = job.idempotency_key
    if job.attempt != 1:
        headers[n.HEADER_ATTEMPT] = job.attempt
    if job.due_at is not None:
        headers[n.HEADER_DUE_AT] = _iso(job.due_at)
    if job.priority is not Priority.NORMAL:
        headers[n.HEADER_PRIORITY] = job.priority.value
    if job.traceparent:
        headers[n.HEADER_TRACEPARENT] = job.traceparent
    if job.tracestate:
        headers[n.HEADER_TRACESTATE] = job.tracestate
    return _wire_message(job.id, job.task, job.payload, job.created_at, headers)


def encode_new(
    job_id: str, task: str, payload: Mapping[str, Any], created_at: datetime
) -> WireMessage:
    """:func:`encode` of a job with every field but these at its default (attempt 1,
    the key equal to the id, due now, normal priority, no trace context), from its
    fields: the same message, made before the model is built. ``created_at`` is UTC."""
    headers: dict[str, Any] = {n.HEADER_CREATED_AT: _iso(created_at)}
    return _wire_message(job_id, task, payload, created_at, headers)


def _wire_message(
    job_id: str,
    task: str,
    payload: Mapping[str, Any],
    created_at: datetime,
    headers: dict[str, Any],
) -> WireMessage:
    return WireMessage(
        body=_COMPACT_JSON.encode(payload).encode("utf-8"),
        message_id=job_id,
        type=task,
        content_type=n.CONTENT_TYPE,
        timestamp=int(created_at.timestamp()),
        headers=headers,
    )


#: The headers :func:`encode` writes from a job's fields: a message that replaces
#: another (:func:`encode_again`) takes these from its job, the others from the original.
JOB_HEADERS = frozenset(
    {
        n.HEADER_WIRE_VERSION,
        n.HEADER_IDEMPOTENCY_KEY,
        n.HEADER_ATTEMPT,
        n.HEADER_CREATED_AT,
        n.HEADER_DUE_AT,
        n.HEADER_PRIORITY,
        n.HEADER_TRACEPARENT,
        n.HEADER_TRACESTATE,
    }
)


def encode_again(job: Job, original: WireMessage) -> WireMessage:
    """The message that replaces ``original`` for ``job`` (its retry, the same job
    sent through the ladder): the original's body as it is (a retry reads the bytes
    its first attempt read, not the payload written again), its content type and
    timestamp, and the headers a publisher added of its own; the job's headers
    (attempt, due time, trace context...) from ``job``; RabbitMQ's ``x-`` ones dropped."""
    # The job's fields but its payload: the body is the original's, and a payload the
    # decoder took may not encode again (a lone surrogate escape, say).
    fresh = encode(job.copy(payload={}))
    headers = {
        key: encodable(value)
        for key, value in original.headers.items()
        if key not in JOB_HEADERS and not key.startswith(n.BROKER_HEADER_PREFIX)
    }
    headers.update(fresh.headers)
    return replace(
        fresh,
        body=original.body,
        content_type=original.content_type,
        content_encoding=original.content_encoding,
        timestamp=fresh.timestamp if original.timestamp is None else original.timestamp,
        headers=headers,
    )


def encodable(value: Any) -> Any:
    """A header value as it came, in a form the AMQP encoder takes again: a string
    that was not UTF-8 comes in as ``bytes``, which pamqp cannot write, so it goes out
    as a byte array (``x``), its bytes kept; tables and arrays alike, all the way down."""
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, Mapping):
        return {key: encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(item) for item in value]
    return value


def decode(message: WireMessage) -> Job:
    """Parse a wire message into a :class:`Job`, or raise :class:`DecodeError`.

    Only ``message_id``, ``type`` and the JSON body are required, so a minimal
    publisher in any language works; missing optional headers take their defaults.
    """
    _check_content_type(message.content_type)
    if (message.content_encoding or "utf-8").lower() not in _UTF8:
        raise DecodeError(
            "content-encoding",
            f"content_encoding is {message.content_encoding!r}, expected 'utf-8' or none"
            " (compressed bodies are not accepted: send the JSON as it is)",
        )
    payload = _parse_body(message.body)
    headers = dict(message.headers or {})
    version = _integer_header(headers, n.HEADER_WIRE_VERSION, n.WIRE_VERSION)
    if version != n.WIRE_VERSION:
        raise DecodeError(
            "wire-version", f"{n.HEADER_WIRE_VERSION} is {version!r}, expected {n.WIRE_VERSION}"
        )
    if not message.message_id:
        raise DecodeError("message-id", "message_id is missing; it carries the job id")
    if not message.type:
        raise DecodeError("type", "the type property is missing; it carries the task name")
    fields: dict[str, Any] = {
        "id": message.message_id,
        "task": message.type,
        "payload": payload,
        "idempotency_key": _text_header(headers, n.HEADER_IDEMPOTENCY_KEY) or "",
        "attempt": _integer_header(headers, n.HEADER_ATTEMPT, 1),
        "due_at": _text_header(headers, n.HEADER_DUE_AT),
        "traceparent": _text_header(headers, n.HEADER_TRACEPARENT),
        "tracestate": _text_header(headers, n.HEADER_TRACESTATE),
        "priority": _priority_header(headers),
    }
    created = _text_header(headers, n.HEADER_CREATED_AT)
    if created is not None:
        fields["created_at"] = created
    elif message.timestamp is not None:
        fields["created_at"] = datetime.fromtimestamp(message.timestamp, UTC)
    try:
        return Job.model_validate(fields)
    except ValidationError as error:
        raise DecodeError("envelope", describe_validation_error(error)) from None


def _parse_body(body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DecodeError("encoding", f"body is not UTF-8: {error}") from None
    try:
        payload = _STRICT_JSON.decode(text)
    except ValueError as error:  # a JSONDecodeError, or NaN, Infinity, 1e999
        raise DecodeError("json", f"body is not JSON: {error}") from None
    except RecursionError:  # arrays or objects nested ~1,000 deep
        raise DecodeError("json", "body is nested too deeply to decode") from None
    if not isinstance(payload, dict):
        raise DecodeError("json", f"body must be a JSON object, got {type(payload).__name__}")
    return payload


def _not_json(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not a JSON number")


def _finite(number: str) -> float:
    value = float(number)
    if math.isinf(value):
        raise ValueError(f"{number} is beyond a double's range")
    return value


#: Python's JSON decoder accepts NaN, Infinity and numbers that overflow to infinity,
#: which are not JSON: another language's consumer would refuse the body, and the
#: job's retry would carry them as null. Refused here, as the body not being JSON.
_STRICT_JSON = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def strict_json(text: str) -> Any:
    """``text`` as JSON the way a job's body is read: NaN, Infinity and numbers out of
    a float's range refused (ValueError), as too deep a nesting (RecursionError)."""
    return _STRICT_JSON.decode(text)

#: Spellings of UTF-8 accepted in content_encoding and a content_type's charset.
_UTF8 = ("utf-8", "utf8")


def _check_content_type(content_type: str | None) -> None:
    """``application/json``, with parameters or not (``; charset=utf-8`` is many
    clients' default); a charset other than UTF-8 is refused."""
    media, *parameters = (content_type or "").split(";")
    if media.strip().lower() != n.CONTENT_TYPE:
        raise DecodeError(
            "content-type", f"content_type is {content_type!r}, expected {n.CONTENT_TYPE!r}"
        )
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in _UTF8:
            raise DecodeError(
                "content-type", f"content_type is {content_type!r}: the charset must be utf-8"
            )


def _text_header(headers: Mapping[str, Any], name: str) -> str | None:
    """A string header: an AMQP long string, or a byte array holding UTF-8."""
    value = headers.get(name)
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("header", f"header {name!r} is a byte array but not UTF-8") from None
    if value is not None and not isinstance(value, str):
        raise DecodeError(
            "header",
            f"header {name!r} must be a string (an AMQP long string, or a byte array of"
            f" UTF-8), got {type(value).__name__} {value!r}",
        )
    return value


def _priority_header(headers: Mapping[str, Any]) -> Priority:
    text = _text_header(headers, n.HEADER_PRIORITY)
    if text is None:
        return Priority.NORMAL
    try:
        return Priority(text)
    except ValueError:
        raise DecodeError(
            "envelope",
            f"header {n.HEADER_PRIORITY!r} must be 'high', 'normal' or 'low', got {text!r}",
        ) from None


def _integer_header(headers: Mapping[str, Any], name: str, default: int) -> int:
    """An integer header: any AMQP integer type; never a string, float or boolean."""
    value = headers.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(
            "header",
            f"header {name!r} must be an integer (any AMQP integer type), got"
            f" {type(value).__name__} {value!r}",
        )
    return value


def _iso(moment: datetime) -> str:
    if moment.tzinfo is not UTC:  # a job's own times are UTC already
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
