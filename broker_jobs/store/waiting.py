"""Opening the ledger for a daemon (worker, beat) that may start before its database.

A worker started while its broker is away waits for it; the same goes for its ledger:
a PostgreSQL server that is down or restarting, an SQLite file on a full disk or
locked by another process is an outage to wait out (said once, then every
:data:`SAY_EVERY` seconds), not a reason to exit 1, which a supervisor of several
worker processes takes for a configuration error every process would meet and stops
them all. A mistake in the store's URL (a missing database or role, a wrong password,
a directory that does not exist) is still raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from broker_jobs.store.base import Store
from broker_jobs.store.errors import StoreUnavailableError
from broker_jobs.store.urls import open_store
from broker_jobs.store.values import mask_dsn

log = logging.getLogger(__name__)

#: The first pause between tries; it doubles up to :data:`LONGEST_PAUSE`.
FIRST_PAUSE = 0.5
LONGEST_PAUSE = 10.0
#: While it waits, the ledger's unavailability is said again this often.
SAY_EVERY = 30.0


def open_store_when_up(
    url: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Store:
    """:func:`~broker_jobs.store.open_store`, waiting while it raises
    :class:`StoreUnavailableError`; any other :class:`StoreError` at once."""
    pause, started, said_at = FIRST_PAUSE, clock(), None
    while True:
        try:
            store = open_store(url)
        except StoreUnavailableError as error:
            now = clock()
            if said_at is None or now - said_at >= SAY_EVERY:
                log.warning(
                    "the ledger %s cannot be opened for now (%s); waiting for it, trying"
                    " again every %g s at most",
                    mask_dsn(url),
                    error,
                    LONGEST_PAUSE,
                )
                said_at = now
            sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
            continue
        if said_at is not None:
            log.warning("the ledger %s answers after %.0f s", mask_dsn(url), clock() - started)
        return store
