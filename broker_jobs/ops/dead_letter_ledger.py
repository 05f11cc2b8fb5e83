"""The dead letters as the ledger's index knows them: read without the broker
(:class:`IndexedDeadLetters`), and kept in step with their queues by every pass over
one (:class:`IndexKeeper`).

``broker-jobs dlq list|show``, the dashboard's dead-letter pages and a dead job's
page read the index: a read moves no message and needs no broker permission
(reading a queue would rewrite it: :mod:`~broker_jobs.ops.dead_letter_pass`). The
workers index each dead letter they make in the step that records its job dead; a
dead letter that reached its queue another way (RabbitMQ's own delivery limit, an
older broker-jobs, another tool) is indexed by the next pass over its queue:
``broker-jobs dlq reindex``, or a replay or a purge with a filter
(:mod:`broker_jobs.store.dead_letter_index` says how a pass keeps the index exact).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from broker_jobs.dead_letter import DeadLetter, DeadLetterFilter
from broker_jobs.errors import BrokerJobsError
from broker_jobs.store.base import Store
from broker_jobs.store.dead_letter_index import IndexedDeadLetter
from topology import names as n

#: Entries a pass writes to the index in one transaction, at most...
BATCH = 200
#: ...and at least every this many seconds: a replay killed midway (it takes ~200
#: letters a second, each published and confirmed) leaves the entries of what it
#: took in this time, not of a whole batch.
FLUSH_EVERY = 0.25


class IndexedDeadLetters:
    """The indexed dead letters of ``tasks`` in ``store`` (the workers' ledger)."""

    def __init__(self, store: Store, tasks: Sequence[str]) -> None:
        if not store.indexes_dead_letters:
            raise BrokerJobsError(
                f"{store!r} keeps no index of dead letters (its role may not write the"
                " dead letters' table): grant it SELECT, INSERT, UPDATE and DELETE there"
                " (docs/store.md), or open the store once as its owner"
            )
        self.store = store
        self.tasks = tuple(tasks)

    def entries(
        self, where: DeadLetterFilter | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[IndexedDeadLetter]:
        """The matching entries, oldest first, ``offset`` of them skipped."""
        return self.store.dead_letters(self.tasks, where, limit=limit, offset=offset)

    def letters(
        self, where: DeadLetterFilter | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[DeadLetter]:
        """The matching dead letters, oldest first."""
        return [entry.letter for entry in self.entries(where, limit=limit, offset=offset)]

    def find(self, ref: str) -> list[IndexedDeadLetter]:
        """The entries whose job id or idempotency key is ``ref`` (usually one)."""
        return self.entries(DeadLetterFilter(ref=ref), limit=20)

    def counts(self, where: DeadLetterFilter | None = None) -> dict[str, int]:
        """How many of each task's dead letters ``where`` takes."""
        return self.store.dead_letter_counts(self.tasks, where)


def unindexed_note(namespace: str, missed: Mapping[str, int]) -> str:
    """The line saying the queues hold ``missed`` dead letters (by task) more than the
    index, and the command that indexes them (``status`` and ``dlq list`` print it).

    It names first what is usually the cause while workers are dead-lettering: a
    worker indexes each dead letter just after the broker confirmed it in its
    queue, so those being made right now count for a moment. Only a gap that stays
    is one of dead letters that came another way."""
    which = ", ".join(f"{task}: {count}" for task, count in missed.items())
    return (
        f"dead letters not in the ledger's index yet ({which}): those being"
        " dead-lettered right now count until their worker indexes them; a gap that"
        " stays came another way (RabbitMQ's own delivery limit, an older broker-jobs,"
        f" another tool): broker-jobs dlq reindex --namespace {namespace}"
        + "".join(f" --task {task}" for task in missed)
    )


@dataclass
class IndexKeeper:
    """Keeps the index in step with one pass over ``task``'s dead-letter queue: what
    the pass keeps is indexed as seen by it, what it takes is dropped, and when the
    pass is complete, :meth:`finish` sweeps the entries of dead letters it did not
    see. A taken letter is dropped only after it was acked (the next call, or
    :meth:`finish`), so a kill never hides a dead letter that is still queued."""

    store: Store
    task: str
    pass_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    mark: int = 0
    indexed: int = 0
    dropped: int = 0
    _pending: list[tuple[bool, DeadLetter]] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic
    #: When the oldest of ``_pending`` was seen (on ``clock``).
    _since: float = 0.0

    @classmethod
    def start(cls, store: Store, task: str) -> IndexKeeper:
        """A keeper for a pass starting now (the mark: the newest entry before it)."""
        return cls(store, task, mark=store.dead_letter_mark(task))

    def saw(self, letter: DeadLetter, *, taken: bool) -> None:
        """The pass looked at ``letter`` and took it (to be acked) or kept it."""
        now = self.clock()
        if len(self._pending) >= BATCH or (self._pending and now - self._since >= FLUSH_EVERY):
            self.flush()  # before this one: a taken letter is not acked yet
        if not self._pending:
            self._since = now
        self._pending.append((taken, letter))

    def flush(self) -> None:
        """Write what was seen, in the order seen (a letter in its queue twice may be
        taken once and kept once)."""
        pending, self._pending = self._pending, []
        while pending:
            taken = pending[0][0]
            run = 0
            while run < len(pending) and pending[run][0] is taken:
                run += 1
            letters = [letter for _, letter in pending[:run]]
            pending = pending[run:]
            if taken:
                # By letter id and dead at: a job the pass replayed that died again
                # before this write has a new entry, which stays.
                self.dropped += self.store.unindex_dead_letters(self.task, letters)
            else:
                kept = [_as_queued(letter) for letter in letters]
                self.store.index_dead_letters(kept, pass_id=self.pass_id)
                self.indexed += len(letters)

    def finish(self) -> None:
        """After the whole pass: write the rest, sweep what the pass did not see."""
        self.flush()
        self.dropped += self.store.sweep_dead_letters(
            self.task, up_to=self.mark, pass_id=self.pass_id
        )


def _as_queued(letter: DeadLetter) -> DeadLetter:
    """``letter`` as it lies in its queue: without the delivery count that the pass's
    own read added (a quorum queue's ``x-delivery-count``)."""
    if n.HEADER_DELIVERY_COUNT not in letter.headers:
        return letter
    headers = {k: v for k, v in letter.headers.items() if k != n.HEADER_DELIVERY_COUNT}
    return dataclasses.replace(letter, headers=headers)
