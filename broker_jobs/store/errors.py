"""The store's errors. A store turns its database's own exceptions into these, with a
message that says what to do (passwords masked), so callers catch one family
whichever store they were given; :class:`LeaseLostError` is the one the worker acts
on: another worker now decides the job's fate.
"""

from __future__ import annotations

from broker_jobs.errors import BrokerJobsError
from broker_jobs.store.records import JobRecord, Status


class StoreError(BrokerJobsError):
    """The store failed: unreachable database, a schema from a newer version, a store
    used after close... The message says what to do; passwords are masked."""


class StoreUnavailableError(StoreError):
    """The database cannot be used for now: down or restarting, unreachable, out of
    disk, locked. An outage to wait out (a daemon waits for it), not a mistake in the
    store's URL, credentials or schema to fix (a :class:`StoreError`)."""


class LeaseLostError(StoreError):
    """This worker no longer holds the job's lease (another worker took over after it
    expired, or the record already has an outcome). Do not ack as if the outcome was
    recorded: the holder of the lease decides the job's fate."""

    def __init__(self, key: str, worker: str | None, record: JobRecord | None, action: str):
        self.key = key
        self.worker = worker
        self.record = record
        if record is None:
            state = "there is no record of it"
        elif record.status is Status.RUNNING and record.worker is None:
            state = "it was released (no worker holds it)"
        elif record.status is Status.RUNNING:
            until = record.lease_until.isoformat() if record.lease_until else "-"
            state = f"it is running under {record.worker}'s lease until {until}"
        else:
            state = f"it is {record.status.value} (recorded by {record.worker or 'nobody'})"
        super().__init__(
            f"cannot {action} job key {key!r} as worker {worker!r}: {state}. This worker"
            " lost the lease; leave the job to the record's holder (do not record an outcome)"
        )
