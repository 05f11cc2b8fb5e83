"""A deep index of dead letters for ``bench.dashboard``: the ledger's dead jobs get
their dead letters, as the worker indexes them, and made-up ones fill it up to
``--dead-letters`` (100,000 by default), spread over the tasks and reasons."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from datetime import datetime, timedelta

from bench.dashboard.rows import ERRORS, job_id
from broker_jobs.dead_letter import DeadLetter, dead_letter_from
from broker_jobs.store.base import Status, Store

#: Reasons and their shares.
REASONS = {"exhausted": 70, "permanent": 20, "schema": 6, "json": 2, "wrong-queue": 2}
#: Dead letters indexed per transaction.
BATCH = 1000


def _letter(
    task: str, *, job: str, key: str, reason: str, error: str, at: datetime, n: int
) -> DeadLetter:
    payload = {"to": f"user{n}@example.com", "template": "receipt", "order": n}
    return dead_letter_from(
        task,
        {
            "bj-idempotency-key": key,
            "bj-attempt": 3,
            "bj-dead-reason": reason,
            "bj-dead-error": error,
            "bj-dead-attempts": 3,
            "bj-dead-worker": "worker-a-4101",
            "bj-dead-at": at.isoformat(timespec="milliseconds"),
            "bj-dead-traceback": f"Traceback (most recent call last):\n  ...\n{error}\n",
        },
        {"message_id": job, "type": task, "content_type": "application/json"},
        json.dumps(payload).encode(),
    )


def fill_dead_letters(store: Store, count: int, tasks: Sequence[str], now: datetime) -> int:
    """Index ``count`` dead letters: those of the ledger's dead jobs (newest first),
    then made-up ones, oldest first. Returns how many."""
    rng = random.Random(7)
    reasons, weights = list(REASONS), list(REASONS.values())
    dead = store.find(status=Status.DEAD, limit=count)
    made: list[DeadLetter] = []
    for n in range(count - len(dead)):
        at = now - timedelta(days=7) + timedelta(seconds=n * 5)
        jid = job_id(at, rng)
        made.append(
            _letter(
                rng.choice(tasks),
                job=jid,
                key=jid,
                reason=rng.choices(reasons, weights)[0],
                error=rng.choice(ERRORS),
                at=at,
                n=n,
            )
        )
    # The ledger's own dead jobs last: the newest entries, as in a live index.
    for n, record in enumerate(reversed(dead)):
        made.append(
            _letter(
                record.task,
                job=record.job_id,
                key=record.idempotency_key,
                reason=rng.choices(reasons, weights)[0],
                error=record.last_error or rng.choice(ERRORS),
                at=record.updated_at,
                n=n,
            )
        )
    for start in range(0, len(made), BATCH):
        store.index_dead_letters(made[start : start + BATCH])
    return len(made)
