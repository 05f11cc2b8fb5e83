"""Errors raised by broker-jobs. Driver exceptions (pika, aiormq, aio-pika) are
translated at the boundary into these, so callers catch one tree:

    BrokerJobsError
    ├── ConfigurationError        bad settings or an invalid URL
    ├── JobError                  the job itself is wrong; fix the call
    │   ├── UnknownTaskError      the app does not declare this task
    │   ├── PayloadValidationError  the payload fails the task's model
    │   ├── PayloadEncodingError  the payload is not JSON-serialisable
    │   ├── MessageTooLargeError  the message is larger than the broker takes
    │   └── DecodeError           a message is not a valid job (bad JSON, headers...)
    ├── PublishError              the broker did not take a job
    │   ├── UnroutableError       no queue is bound for the task (mandatory flag)
    │   ├── NackedError           the broker refused the job (e.g. queue full)
    │   ├── ConfirmTimeoutError   no confirm within the timeout: outcome unknown
    │   ├── PublisherBusyError    not sent: other threads held the shared publisher
    │   └── PublishBatchError     part of a batch failed; says which jobs were confirmed
    ├── BrokerConnectionError     the broker cannot be reached or the connection broke
    │   ├── BrokerUnreachableError  no node answered (or each refused us); says why
    │   └── ReconnectTimeoutError a worker found no broker for --reconnect-timeout
    ├── AccessRefusedError        the user may not do that (403): its permissions
    └── TopologyError             the broker's objects are missing or conflict
        ├── TopologyMissingError  an exchange or queue that must exist does not
        ├── ConsumerCancelledError  the broker cancelled a worker's consumer
        └── TopologyConflictError

A daemon's command exits with the error's ``exit_code`` (1 unless it says otherwise),
so that a supervisor can tell "restart me" from "fix me".

Messages never contain passwords: URLs are masked before they reach an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import ValidationError

from broker_jobs.keywords import closest
from topology.names import DEAD_REASONS
from topology.priority import Priority

if TYPE_CHECKING:
    from topology.errors import Conflict


class BrokerJobsError(Exception):
    """Base of every error broker-jobs raises."""

    #: What a command that stops on this error exits with.
    exit_code = 1


class ConfigurationError(BrokerJobsError):
    """Settings that cannot work; the message says which and what to use instead."""


class JobError(BrokerJobsError):
    """The job cannot be published or run as given."""


class UnknownTaskError(JobError):
    def __init__(self, task: str, known: Sequence[str]) -> None:
        self.task = task
        listing = ", ".join(sorted(known)) or "none"
        hint = closest(task, known)
        suggestion = f" (did you mean {hint!r}?)" if hint else ""
        super().__init__(
            f"unknown task {task!r}{suggestion}: this app declares {listing}. Declare it with"
            " app.declare(name, PayloadModel) or @app.task(name), or publish through an"
            " untyped publisher (app=None) to send a plain dict"
        )


class PayloadValidationError(JobError):
    def __init__(self, task: str, details: str) -> None:
        self.task = task
        super().__init__(f"payload for task {task!r} is invalid: {details}")


class PayloadEncodingError(JobError):
    def __init__(self, task: str, details: str) -> None:
        self.task = task
        super().__init__(
            f"payload for task {task!r} cannot be encoded as JSON: {details}."
            " Send JSON types only (str, int, float, bool, None, list, dict with str keys),"
            " or declare a pydantic model that serialises the value"
        )


class MessageTooLargeError(JobError):
    def __init__(self, task: str, size: int, limit: int) -> None:
        self.task, self.size, self.limit = task, size, limit
        super().__init__(
            f"job for task {task!r} is a message of {size:,} bytes, more than the"
            f" {limit:,} a RabbitMQ node takes (its max_message_size; 128 MiB by default):"
            " nothing was sent. Keep large data elsewhere (object storage) and send its"
            " address, or raise both max_message_size and the publisher's max_message_bytes"
        )


class DecodeError(JobError):
    """A message that is not a valid job; ``reason`` is a short machine-usable cause."""

    def __init__(self, reason: str, details: str) -> None:
        if reason not in DEAD_REASONS:  # it becomes a dead letter's reason on the wire
            raise ValueError(f"no such dead-letter reason {reason!r}: add it to DEAD_REASONS")
        self.reason = reason
        super().__init__(f"not a valid job ({reason}): {details}")


class FollowUpError(JobError):
    """A handler asked for a follow-up (``JobContext.then``) that cannot be published:
    an unknown task, an invalid payload or option. A bug in the handler: its attempt
    fails (the task's retry policy decides), and nothing of it is recorded."""

    def __init__(self, parent_task: str, details: str) -> None:
        self.parent_task = parent_task
        super().__init__(
            f"the handler of task {parent_task!r} asked for an invalid follow-up: {details}"
        )


class PublishError(BrokerJobsError):
    """The broker did not confirm a job."""


class UnroutableError(PublishError):
    def __init__(
        self, task: str, exchange: str, queue: str, *, level: Priority = Priority.NORMAL
    ) -> None:
        """``queue``: the one the job's lane needed; ``level``: the job's priority."""
        self.task = task
        self.exchange = exchange
        self.queue = queue
        declare = (
            ""
            if level is Priority.NORMAL
            else f" A {level.value!r} priority needs the task declared with priorities"
            " (priorities='6:3:1' or 'strict'), or publish without one."
        )
        super().__init__(
            f"job for task {task!r} is unroutable: exchange {exchange!r} has no queue bound"
            f" for it (expected queue {queue!r}).{declare} Declare the task's queues first:"
            " `broker-jobs topology apply`, or publish with an app that declares the task"
        )


class NackedError(PublishError):
    def __init__(self, task: str, job_id: str) -> None:
        self.task = task
        self.job_id = job_id
        super().__init__(
            f"the broker refused job {job_id} of task {task!r} (basic.nack): it was not"
            " stored by a queue it is routed to (another queue bound beside the task's"
            " may hold it). A quorum queue refuses while it has no leader (a node lost, a"
            " failover under way: again in a few seconds it is taken), when a length"
            " limit rejects publishes, or on an internal error of the broker; publishing"
            " it again with the same idempotency key is safe (it runs once)"
        )


class ConfirmTimeoutError(PublishError):
    def __init__(self, task: str, job_id: str, timeout: float, hint: str = "") -> None:
        self.task = task
        self.job_id = job_id
        super().__init__(
            f"no confirm for job {job_id} of task {task!r} within {timeout:g} s: the"
            " outcome is unknown. Publishing it again with the same idempotency key is"
            " safe (it runs once)." + (f" {hint}" if hint else "")
        )


class PublisherBusyError(PublishError):
    def __init__(self, task: str, job_id: str, waited: float) -> None:
        self.task = task
        self.job_id = job_id
        super().__init__(
            f"job {job_id} of task {task!r} was not sent: other threads' publishes held"
            f" this publisher for {waited:g} s (its confirm_timeout): the broker does not"
            " answer in time (a memory or disk alarm: rabbitmq-diagnostics alarms), or the"
            " network to it stopped carrying (its heartbeat ends the connection then)."
            " Nothing was stored: publish it again later; a thread with its own"
            " Publisher waits for no other"
        )


class PublishBatchError(PublishError):
    """Raised by ``publish_many`` when not every job was confirmed.

    ``confirmed`` holds the ids the broker confirmed: they are stored. ``failed`` maps
    the other ids to their error; for a connection loss the outcome of those is
    unknown, and publishing them again (same ids and keys) is safe.
    """

    def __init__(self, confirmed: list[str], failed: dict[str, BrokerJobsError]) -> None:
        self.confirmed = confirmed
        self.failed = failed
        first = next(iter(failed.values()))
        super().__init__(
            f"{len(confirmed)} of {len(confirmed) + len(failed)} jobs confirmed,"
            f" {len(failed)} not; first error: {first}"
        )


class BrokerConnectionError(BrokerJobsError):
    """The broker cannot be reached, or the connection broke mid-operation."""


class BrokerUnreachableError(BrokerConnectionError):
    """No node of the broker could be connected to: nothing listens, the login or
    the vhost was refused, or no answer came in time (the message says which)."""


class ReconnectTimeoutError(BrokerConnectionError):
    """A worker had no broker for longer than its reconnect timeout."""

    #: EX_TEMPFAIL (sysexits.h): a temporary failure; restarting may help.
    exit_code = 75


class AccessRefusedError(BrokerJobsError):
    """The broker refused an operation to the user (``403 ACCESS_REFUSED``): it lacks
    a permission. The message says which operation needs what."""


class HandlerStuckError(BrokerJobsError):
    """A sync handler ran past its time limit and did not return within the overrun
    grace after being interrupted: its thread cannot be stopped, so the worker
    process must be replaced (its attempt is recorded as failed by its time limit)."""

    #: EX_SOFTWARE (sysexits.h): restart the process (``--processes``' supervisor,
    #: systemd ``Restart=on-failure``, Kubernetes do).
    exit_code = 70

    def __init__(self, jobs: Sequence[str], unrecorded: Sequence[str] = ()) -> None:
        self.jobs = tuple(jobs)
        #: Those whose failed attempt could not be recorded (the ledger not answering
        #: within the grace): they run again once their lease lapses.
        self.unrecorded = tuple(unrecorded)
        recorded = [job for job in self.jobs if job not in self.unrecorded]
        said = []
        if recorded:
            said.append(
                f"{_listed(recorded)}: the attempt was recorded as failed by the time limit"
            )
        if self.unrecorded:
            said.append(
                f"{_listed(self.unrecorded)}: the failed attempt could not be recorded (the"
                " ledger did not answer in time); the job runs again once its lease lapses"
            )
        super().__init__(
            "handler threads stuck past their time limit ("
            + "; ".join(said)
            + "): this process must exit (the threads cannot be stopped otherwise) and be"
            " started again"
        )


def _listed(jobs: Sequence[str]) -> str:
    return ", ".join(jobs)


class TopologyError(BrokerJobsError):
    """The broker's objects cannot be declared as wanted."""


#: How a publisher gets a missing topology declared.
PUBLISHER_DECLARES = "or publish with declare=True and an app that declares the task"
#: How a worker does (it declares its own queues unless told not to).
WORKER_DECLARES = "or start the worker without --no-declare (it declares its queues at start)"


class TopologyMissingError(TopologyError):
    def __init__(self, broker_message: str, *, or_else: str = PUBLISHER_DECLARES) -> None:
        """``or_else``: the way out besides the topology command, for who met it."""
        self.broker_message = broker_message
        super().__init__(
            f"the broker says {broker_message!r}: the topology does not exist. Declare it"
            " first: `broker-jobs topology apply --app module:app` (or --file"
            f" topology.toml), {or_else}"
        )


class ConsumerCancelledError(TopologyError):
    """The broker cancelled a worker's consumer: its queue was deleted (or, on a
    cluster, lost with its node)."""

    #: EX_UNAVAILABLE (sysexits.h): the queue is gone; an operator must act.
    exit_code = 69

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(
            f"the broker cancelled the consumer of queue {queue!r} (the queue was deleted?):"
            " the worker stops rather than idle. Declare the queue again (`broker-jobs"
            " topology apply --app module:app`) and restart the worker"
        )


class TopologyConflictError(TopologyError):
    """Existing exchanges or queues differ from the wanted ones; see ``conflicts``."""

    def __init__(self, message: str, conflicts: tuple[Conflict, ...]) -> None:
        self.conflicts = conflicts
        super().__init__(message)


def describe_validation_error(error: ValidationError) -> str:
    """One line per failing field: ``width: Input should be a valid integer``."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'value'}: {item['msg']}"
        for item in error.errors()
    )
