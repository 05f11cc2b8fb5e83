"""The ledger's index of dead letters: what each store keeps of a dead letter, and the
shape of the SQL that finds them (written once for SQLite and PostgreSQL).

Every dead letter a worker makes is indexed in the same step that records its job
dead (:meth:`Store.dead`'s ``letter``), so listing and showing dead letters reads
the ledger and never the queue (reading a queue moves every message of it:
:mod:`broker_jobs.ops.dead_letter_pass`). An entry is keyed by its task and
:attr:`DeadLetter.letter_id` (a second copy of one dead letter in its queue is one
entry); its ``seq`` grows with each new entry, so the index lists them in the order
they reached their queue. A replayed job keeps its id, so when it dies again its new
dead letter (another ``dead_at``) replaces the entry of the old one with a new entry,
placed last.

**Keeping in step with the queue.** Replay and purge act on the queue and drop the
entries of what they took, by letter id *and* ``dead_at``: the entry of a replayed
job that died again before the pass wrote its drops is the new dead letter's, and
stays. Every pass over a queue (replay, purge with a filter,
``broker-jobs dlq reindex``) also re-indexes what it kept under its ``pass_id`` and,
once the pass is complete, *sweeps* the task's entries older than the pass (``seq``
up to the mark taken before it) that it did not see: dead letters that left the queue
some other way. Entries made while the pass ran have a higher ``seq`` and stay. So an
interrupted operation leaves at most a few stale entries, which the next pass mends;
it never hides a dead letter that is in the queue from the next complete pass.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker_jobs.dead_letter import DeadLetter, DeadLetterFilter
from broker_jobs.store.values import MAX_PAYLOAD_BYTES

#: The document key saying the body is kept as base64 (it was not UTF-8 text, or
#: held NUL characters, which PostgreSQL's text does not take).
BASE64 = "body_base64"


@dataclass(frozen=True)
class IndexedDeadLetter:
    """A dead letter as the ledger's index keeps it."""

    letter: DeadLetter
    seq: int  #: its place: entries are listed in the order they were indexed first
    body_size: int  #: bytes of the message body
    #: False when the body was larger than :data:`MAX_PAYLOAD_BYTES`: only its size is
    #: kept (``letter.body`` is empty); the dead letter in its queue has it whole.
    body_kept: bool
    indexed_at: datetime  #: when it was last indexed (aware UTC)


@dataclass(frozen=True)
class IndexRow:
    """The stored form of one entry: the columns every store keeps."""

    task: str
    letter_id: str
    job_id: str | None
    idempotency_key: str | None
    reason: str | None
    error: str | None
    dead_at: datetime | None
    #: :meth:`DeadLetter.to_json` without its payload and body, as JSON text.
    document: str
    body: str | None  #: the body as text (base64 if the document says so); None: too large
    body_size: int

    @classmethod
    def of(cls, letter: DeadLetter) -> IndexRow:
        document = letter.to_json()
        document.pop("payload", None)
        document.pop("body", None)
        body: str | None = None
        if len(letter.body) <= MAX_PAYLOAD_BYTES:
            try:
                body = letter.body.decode("utf-8")
            except UnicodeDecodeError:
                body = None
            if body is None or "\x00" in body:
                body = base64.b64encode(letter.body).decode("ascii")
                document[BASE64] = True
        return cls(
            task=letter.task,
            letter_id=letter.letter_id,
            job_id=letter.job_id,
            idempotency_key=letter.idempotency_key,
            reason=letter.reason,
            error=letter.error,
            dead_at=letter.dead_at,
            document=json.dumps(document, ensure_ascii=False, separators=(",", ":")),
            body=body,
            body_size=len(letter.body),
        )

    def params(self) -> dict[str, Any]:
        """The row as named statement parameters (``dead_at`` as the store gives it)."""
        return {
            "task": self.task,
            "letter_id": self.letter_id,
            "job_id": self.job_id,
            "idempotency_key": self.idempotency_key,
            "reason": self.reason,
            "error": self.error,
            "dead_at": self.dead_at,
            "document": self.document,
            "body": self.body,
            "body_size": self.body_size,
        }


def read_entry(
    document_text: str, body: str | None, body_size: int, seq: int, indexed_at: datetime
) -> IndexedDeadLetter:
    """An entry from its stored columns."""
    document = json.loads(document_text)
    if body is None:
        data = b""
    elif document.get(BASE64):
        data = base64.b64decode(body)
    else:
        data = body.encode("utf-8")
    return IndexedDeadLetter(
        letter=DeadLetter.from_json(document, data),
        seq=seq,
        body_size=body_size,
        body_kept=body is not None,
        indexed_at=indexed_at,
    )


@dataclass(frozen=True)
class Dialect:
    """What differs between the SQL of two stores: the placeholder of a named
    parameter, the function finding a substring (``instr`` / ``strpos``, same
    arguments), how a time is given as a parameter, and how the table is named in
    the condition's subquery (PostgreSQL's is filled in with its schema later)."""

    placeholder: Callable[[str], str]
    substring: str
    moment: Callable[[datetime], Any]
    table: str


def where_sql(
    dialect: Dialect, tasks: Sequence[str], where: DeadLetterFilter | None
) -> tuple[str, dict[str, Any]]:
    """The WHERE condition (without the keyword) of entries of ``tasks`` that
    ``where`` takes, and its parameters; the same rules as
    :meth:`DeadLetterFilter.matches`."""
    p = dialect.placeholder
    params: dict[str, Any] = {}
    names = [f"task{index}" for index in range(len(tasks))]
    params.update(zip(names, tasks, strict=True))
    conditions = [f"task IN ({', '.join(p(name) for name in names)})" if tasks else "1 = 0"]
    where = where or DeadLetterFilter()
    if where.reasons:
        reasons = sorted(where.reasons)
        names = [f"reason{index}" for index in range(len(reasons))]
        params.update(zip(names, reasons, strict=True))
        conditions.append(f"reason IN ({', '.join(p(name) for name in names)})")
    if where.error:  # an empty text is in every error, a missing one included
        params["error"] = where.error
        conditions.append(f"{dialect.substring}(lower(error), lower({p('error')})) > 0")
    if where.ref is not None:
        params["ref"] = where.ref
        # As a subquery of two lookups, each by its index (a plain condition lets the
        # planner walk the task's entries in order instead: 80 ms at 100,000).
        ref = p("ref")
        table = dialect.table
        conditions.append(
            f"seq IN (SELECT seq FROM {table} WHERE job_id = {ref}"
            f" UNION ALL SELECT seq FROM {table} WHERE idempotency_key = {ref})"
        )
    if where.since is not None:
        params["since"] = dialect.moment(where.since)
        conditions.append(f"dead_at >= {p('since')}")
    if where.until is not None:
        params["until"] = dialect.moment(where.until)
        conditions.append(f"dead_at < {p('until')}")
    return " AND ".join(conditions), params
