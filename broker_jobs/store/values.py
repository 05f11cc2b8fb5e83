"""What the stores check in a call and how they shape what they keep: aware UTC times,
positive leases, error texts cut to a bound, payloads as compact JSON text (or only
their size), passwords masked in messages. One place, so a value means the same in
every store and a ledger written by one reads the same through another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from broker_jobs.clock import utc_now
from broker_jobs.envelope import Job
from broker_jobs.store.records import KeptOutput, KeptPayload, PayloadText

#: Error texts are stored truncated to this many bytes of UTF-8 (a traceback's tail
#: is cut, with a marker), so one huge exception cannot bloat the ledger.
MAX_ERROR_BYTES = 4096
_TRUNCATED = "\n... [truncated by broker-jobs]"

#: A job's payload is kept (as JSON text) only up to this many bytes of UTF-8: a
#: larger one is not kept at all (its size is), so one huge job cannot bloat the
#: ledger. Cut JSON would not be JSON, so nothing is truncated.
MAX_PAYLOAD_BYTES = 64 * 1024


def clip_error(error: str) -> str:
    """``error`` as stored: at most :data:`MAX_ERROR_BYTES` of UTF-8, NUL characters
    escaped (PostgreSQL text cannot hold them), unencodable characters replaced."""
    data = error.replace("\x00", "\\x00").encode("utf-8", "replace")
    if len(data) <= MAX_ERROR_BYTES:
        return data.decode("utf-8")
    keep = MAX_ERROR_BYTES - len(_TRUNCATED.encode("utf-8"))
    return data[:keep].decode("utf-8", "ignore") + _TRUNCATED


def payload_text(payload: Mapping[str, Any] | None) -> PayloadText | None:
    """``payload`` as the ledger stores it: compact JSON text, unless its UTF-8 is
    larger than :data:`MAX_PAYLOAD_BYTES` (then only the size). None for no payload,
    or one that is no JSON (a job's always is: it came as JSON or was sent as JSON).
    Control characters (NUL included) are escaped by JSON: PostgreSQL text takes it."""
    return None if payload is None else json_text(dict(payload))


def json_text(value: Any) -> PayloadText | None:
    """Any JSON value (a payload, a handler's result) as the ledger stores it: as
    :func:`payload_text` says; None for a value that is no JSON (NaN included)."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON's escapes carry it
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
        data = text.encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        return None
    return PayloadText(text if len(data) <= MAX_PAYLOAD_BYTES else None, len(data))


def follow_ups_text(follow_ups: Sequence[Job]) -> str | None:
    """Follow-up jobs as the ledger stores them: a JSON array of the jobs' fields
    (None for none). Never capped: each payload was validated as a job's."""
    if not follow_ups:
        return None
    return json.dumps([job.model_dump(mode="json") for job in follow_ups], separators=(",", ":"))


def read_output(
    result: str | None,
    result_size: int | None,
    follow_ups: str | None,
    sent_at: datetime | None,
    kept_at: datetime,
) -> KeptOutput:
    """A stored output back: the result parsed (never evaluated; text that is no
    JSON reads as not kept), the follow-ups as jobs."""
    value = _parsed(result)
    jobs = tuple(Job.model_validate(fields) for fields in json.loads(follow_ups or "[]"))
    too_large = result is None and result_size is not None
    return KeptOutput(value, result_size, jobs, sent_at, kept_at, too_large)


def read_payload(text: str | None, size: int, kept_at: datetime) -> KeptPayload:
    """A stored payload back (JSON parsed, never evaluated); text that is not a JSON
    object (no code writes such) reads as not kept, like one too large."""
    found = _parsed(text)
    return KeptPayload(found if isinstance(found, dict) else None, size, kept_at)


def _parsed(text: str | None) -> Any:
    """Stored JSON text parsed (None for none, or for text that is no JSON)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def utc(moment: datetime | None) -> datetime:
    """``moment`` in UTC (now when None); naive datetimes are refused."""
    if moment is None:
        return utc_now()
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} must be timezone-aware (for example datetime.now(UTC))")
    return moment.astimezone(UTC)


def check_lease(lease: float) -> float:
    if not lease > 0:
        raise ValueError(f"lease must be a positive number of seconds, got {lease!r}")
    return float(lease)


def check_limit(limit: int) -> int:
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return limit


#: Bounded, and from the start of a scheme only: masking runs on every log line, and
#: unbounded parts tried from each place of a long line are quadratic (urls.py).
_URL_PASSWORD = re.compile(
    r"((?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,32}://[^:/@\s]{0,1024}):[^@\s]{0,1024}@", re.IGNORECASE
)
#: libpq's ``password=`` and ``sslpassword=`` (a client key's passphrase).
_KEYWORD_PASSWORD = re.compile(
    r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE
)


def mask_dsn(text: str) -> str:
    """Mask passwords in database URLs (``scheme://user:***@host``) and in libpq
    ``password=...`` settings (keyword form or URL query) anywhere in ``text``."""
    return _KEYWORD_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", text))


def leader_schedules_text(identity: str, schedules: Mapping[str, str] | None) -> str | None:
    """The leader record's schedules column: the digests with the identity that wrote
    them, so a record rewritten by a beat that writes no digests (an older version,
    which leaves the column alone) is not read as its own."""
    if schedules is None:
        return None
    return json.dumps({"identity": identity, "schedules": dict(schedules)}, sort_keys=True)


def read_leader_schedules(identity: str, text: str | None) -> dict[str, str] | None:
    """The digests of the leader ``identity`` from its schedules column; None when
    they are missing or were written by another beat."""
    if text is None:
        return None
    try:
        found = json.loads(text)
        if found.get("identity") != identity:
            return None
        return {str(name): str(digest) for name, digest in found["schedules"].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None  # not ours to fail on: the record is only shown
