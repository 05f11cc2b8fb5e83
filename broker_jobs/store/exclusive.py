"""Stores whose state changes run as read, decide, write inside one exclusive section
(a lock, an immediate transaction): the rules of :mod:`broker_jobs.store.rules` are
applied in Python to the record as read, so a store of this kind only says how to
enter the section and how to load, save and keep there (:class:`Records`). The
memory store's section is a lock; SQLite's, ``BEGIN IMMEDIATE`` (it overrides the
hot path with fewer statements).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from broker_jobs.envelope import Job
from broker_jobs.store.base import Rule, Store
from broker_jobs.store.dead_letter_index import IndexRow
from broker_jobs.store.errors import LeaseLostError
from broker_jobs.store.records import (
    SUCCESS,
    Claim,
    ClaimOutcome,
    Finish,
    JobRecord,
    Output,
    PayloadText,
)
from broker_jobs.store.rules import claimed_record, decide, holds, published_record
from broker_jobs.store.values import check_lease, payload_text, utc


class Records(Protocol):
    """The view of the records inside an exclusive section."""

    #: The database connection of the section (None for the memory store).
    connection: Any

    def load(self, key: str) -> JobRecord | None: ...

    def save(self, record: JobRecord) -> None:
        """Insert or replace the record of ``record.idempotency_key``."""

    def keep_payload(self, key: str, payload: PayloadText, now: datetime) -> None:
        """Keep ``payload`` for ``key`` unless it has one already (the first wins)."""

    def keep_output(self, key: str, output: Output, now: datetime) -> None:
        """Keep a success's ``output`` for ``key``, replacing any kept before."""

    def index_letters(self, rows: Sequence[IndexRow], pass_id: str | None, now: datetime) -> None:
        """Insert or rewrite the dead letters' entries (:meth:`Store._index`)."""


class ExclusiveStore(Store):
    """A store whose state changes run as read, decide, write inside one exclusive
    section (a lock, an immediate transaction); the rules are applied in Python."""

    @abstractmethod
    def _exclusive(self, action: str = "change a record") -> AbstractContextManager[Records]:
        """Enter a section no other thread or process changes records in; commit on
        normal exit, undo on an exception. ``action``: what a :class:`StoreError`
        says could not be done."""

    def claim(self, job: Job, worker: str, lease: float, *, now: datetime | None = None) -> Claim:
        lease, moment = check_lease(lease), utc(now)
        with self._exclusive() as records:
            return _claim_in(records, job, worker, lease, moment)

    def claim_many(self, claims: Sequence[tuple[Job, str]], lease: float) -> list[Claim]:
        # One section for the batch: one lock (a transaction) for the worker's
        # batches, not one per job.
        lease, moment = check_lease(lease), utc(None)
        with self._exclusive() as records:
            return [_claim_in(records, job, worker, lease, moment) for job, worker in claims]

    def succeed_many(self, finished: Sequence[tuple[str, str]]) -> list[str]:
        moment, lost = utc(None), []
        with self._exclusive() as records:
            for key, worker in finished:
                record = records.load(key)
                if record is None or not holds(record, worker):
                    lost.append(key)
                    continue
                records.save(_finished_record(record, SUCCESS, moment))
        return lost

    def renew(self, key: str, worker: str, lease: float, *, now: datetime | None = None) -> None:
        lease, moment = check_lease(lease), utc(now)
        with self._held(key, worker, "renew the lease of") as (records, record):
            records.save(replace(record, lease_until=moment + timedelta(seconds=lease)))

    def succeed_with(
        self,
        key: str,
        worker: str,
        effects: Callable[[Any], Output | None],
        *,
        now: datetime | None = None,
    ) -> None:
        moment = utc(now)
        try:
            with self._held(key, worker, SUCCESS.action) as (records, record):
                try:
                    output = effects(records.connection)
                except Exception as error:  # past the store's translation of its own errors
                    raise _EffectsFailed(error) from error
                records.save(_finished_record(record, SUCCESS, moment))
                if output is not None and not output.empty:
                    records.keep_output(key, output, moment)
        except _EffectsFailed as failed:
            raise failed.error from failed.error.__cause__

    def _finish(self, key: str, worker: str, finish: Finish, now: datetime | None) -> None:
        moment = utc(now)
        with self._held(key, worker, finish.action) as (records, record):
            records.save(_finished_record(record, finish, moment))
            _keep(records, key, finish.payload, moment)
            if finish.output is not None:
                records.keep_output(key, finish.output, moment)

    def _rewrite(
        self,
        key: str,
        rule: Rule,
        now: datetime | None,
        action: str,
        payload: PayloadText | None = None,
        *,
        letter: IndexRow | None = None,
    ) -> JobRecord | None:
        moment = utc(now)
        with self._exclusive(action) as records:
            new = rule(records.load(key), moment)
            if new is not None:
                records.save(new)
                _keep(records, key, payload, moment)
            if letter is not None:
                records.index_letters([letter], None, moment)
            return new

    def _index(self, rows: Sequence[IndexRow], pass_id: str | None) -> None:
        with self._exclusive("index dead letters") as records:
            records.index_letters(rows, pass_id, utc(None))

    def release(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        moment = utc(now)
        with self._exclusive() as records:
            record = records.load(key)
            if record is not None and holds(record, worker):
                records.save(replace(record, worker=None, lease_until=moment))

    def lapse(self, key: str, worker: str, *, now: datetime | None = None) -> None:
        moment = utc(now)
        with self._exclusive() as records:
            record = records.load(key)
            if record is not None and holds(record, worker):
                records.save(replace(record, lease_until=moment))

    def record_published(
        self, jobs: Sequence[Job], *, now: datetime | None = None
    ) -> list[JobRecord | None]:
        moment = utc(now)
        with self._exclusive() as records:
            existing = []
            for job in jobs:
                record = records.load(job.idempotency_key)
                if record is None:
                    records.save(published_record(job, moment))
                    _keep(records, job.idempotency_key, payload_text(job.payload), moment)
                existing.append(record)
            return existing

    @contextmanager
    def _held(self, key: str, worker: str, action: str) -> Iterator[tuple[Records, JobRecord]]:
        """An exclusive section on a record that ``worker`` must hold."""
        with self._exclusive() as records:
            record = records.load(key)
            if record is None or not holds(record, worker):
                raise LeaseLostError(key, worker, record, action)
            yield records, record


class _EffectsFailed(Exception):
    """Carries a transactional handler's exception out of the store's section
    unchanged (a section turns the database's own errors into StoreError)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _claim_in(records: Records, job: Job, worker: str, lease: float, moment: datetime) -> Claim:
    """:meth:`Store.claim` in the exclusive section of ``records``."""
    record = records.load(job.idempotency_key)
    outcome = decide(record, job, worker, moment)
    if outcome is not ClaimOutcome.CLAIMED:
        assert record is not None  # only a missing record is claimed without one
        return Claim(outcome, record)
    new = claimed_record(record, job, worker, lease, moment)
    records.save(new)
    return Claim(outcome, new)


def _finished_record(record: JobRecord, finish: Finish, moment: datetime) -> JobRecord:
    """``record`` (held) ended as ``finish`` says: its lease given up."""
    return replace(
        record,
        status=finish.status,
        updated_at=moment,
        lease_until=None,
        last_error=finish.error if finish.error is not None else record.last_error,
        due_at=finish.due_at,
    )


def _keep(records: Records, key: str, payload: PayloadText | None, moment: datetime) -> None:
    """Keep ``payload`` for ``key`` in the section of ``records`` (if there is one)."""
    if payload is not None:
        records.keep_payload(key, payload, moment)
