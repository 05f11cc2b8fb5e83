"""The job inside its handler: a handler that declares a parameter annotated
:class:`JobContext` gets the job it runs, its attempt, its time left, the worker's id,
the trace context and a logger whose lines carry the job's fields.

    @app.task("image.resize", time_limit=60)
    def resize(payload: Resize, job: JobContext) -> None:
        job.log.info("resizing %s (attempt %d of %d)", payload.url, job.attempt,
                     job.max_attempts)

Its :meth:`JobContext.then` asks for a next step: a job published once this one's
success is recorded (exactly once: docs/worker.md, "Next steps").

A parameter, not a global accessor: what a handler needs is in its signature, the same
for sync, async and transactional handlers, on either of the worker's paths, and a
test calls the handler with a context of its own (:meth:`JobContext.for_test`).
Which parameter is the context, and that the worker can call the handler at all, is
settled when the task is declared (:func:`handler_parameters`).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, get_type_hints

from broker_jobs.clock import utc_now
from broker_jobs.envelope import Job
from broker_jobs.errors import ConfigurationError

#: The logger a handler's :attr:`JobContext.log` writes to.
HANDLER_LOGGER = "broker_jobs.handler"

#: Builds a follow-up job (validated, its key derived if not given): the worker's
#: (``broker_jobs.worker.calling``); the options are :meth:`JobContext.then`'s.
FollowUpBuilder = Callable[..., Job]


@dataclass(frozen=True)
class JobContext:
    """The job a handler runs (read-only)."""

    job_id: str
    idempotency_key: str
    task: str
    #: Which execution this is: 1 for the first, 2 for the first retry, ...
    attempt: int
    #: The task's retry policy's attempts, the first included.
    max_attempts: int
    #: When the job was published (its first attempt's publish, for a retry).
    published_at: datetime
    #: When it was due (None: at once).
    due_at: datetime | None
    #: The id of the worker running it (``host:pid:rand``).
    worker_id: str
    #: W3C trace context the job was published with (None without tracing).
    traceparent: str | None
    tracestate: str | None
    #: The task's time limit in seconds (None: none).
    time_limit: float | None
    #: ``time.monotonic()`` when the handler started.
    started: float = field(default_factory=time.monotonic)
    #: The jobs asked for with :meth:`then`, in order (published after the success).
    follow_ups: list[Job] = field(default_factory=list, compare=False, repr=False)
    _build_follow_up: FollowUpBuilder | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        job: Job,
        *,
        max_attempts: int,
        worker_id: str,
        time_limit: float | None,
        follow_ups: FollowUpBuilder | None = None,
    ) -> JobContext:
        """The context of ``job``, starting now; ``follow_ups`` builds what
        :meth:`then` asks for."""
        return cls(
            job_id=job.id,
            idempotency_key=job.idempotency_key,
            task=job.task,
            attempt=job.attempt,
            max_attempts=max_attempts,
            published_at=job.created_at,
            due_at=job.due_at,
            worker_id=worker_id,
            traceparent=job.traceparent,
            tracestate=job.tracestate,
            time_limit=time_limit,
            _build_follow_up=follow_ups,
        )

    @classmethod
    def for_test(cls, task: str = "test.task", **fields: Any) -> JobContext:
        """A context for calling a handler directly in a test; ``fields`` override."""
        values: dict[str, Any] = {
            "job_id": "test-job",
            "idempotency_key": "test-job",
            "task": task,
            "attempt": 1,
            "max_attempts": 1,
            "published_at": utc_now(),
            "due_at": None,
            "worker_id": "test-worker",
            "traceparent": None,
            "tracestate": None,
            "time_limit": None,
        }
        values.update(fields)
        return cls(**values)

    def then(
        self,
        task: Any,
        payload: Any,
        *,
        idempotency_key: str | None = None,
        delay: Any = None,
        eta: datetime | None = None,
        priority: Any = None,
    ) -> Job:
        """Ask for a job to be published when this one succeeds: ``task`` (a name or
        a declared task's handle) with ``payload`` (its model, or a dict), checked
        now against the worker's app (an unknown task, an invalid payload or option
        is a :class:`~broker_jobs.errors.FollowUpError`, which fails this attempt).

        It is recorded with the success, in the same transaction, then published and
        confirmed before this job's delivery is acked; a worker that dies between
        these steps publishes it on the job's next delivery, with the same job id
        and key. ``idempotency_key`` defaults to this job's key and the follow-up's
        number (``"<key>>1"``, ``"<key>>2"``...): a retry or a replay asks for the
        same keys, so each next step runs once. ``delay``/``eta``/``priority`` as
        for ``publish``; a delay counts from this call. A failed attempt publishes
        none of its follow-ups. Returns the job (its ``id`` names it in the ledger).
        """
        if self._build_follow_up is None:
            # A context made for a test, without an app to check against: the
            # follow-ups are kept as asked, for it to inspect (JobsKit.context checks).
            number = len(self.follow_ups) + 1
            model_dump = getattr(payload, "model_dump", None)
            job = Job(
                task=getattr(task, "name", task),
                payload=payload if model_dump is None else model_dump(mode="json"),
                idempotency_key=idempotency_key or follow_up_key(self.idempotency_key, number),
            )
        else:
            job = self._build_follow_up(
                task,
                payload,
                number=len(self.follow_ups) + 1,
                idempotency_key=idempotency_key,
                delay=delay,
                eta=eta,
                priority=priority,
            )
        self.follow_ups.append(job)
        return job

    @property
    def is_last_attempt(self) -> bool:
        """Whether a failure now dead-letters the job (no attempt is left)."""
        return self.attempt >= self.max_attempts

    def time_left(self) -> float | None:
        """Seconds before the task's time limit interrupts the handler (None: no
        limit; never below 0)."""
        if self.time_limit is None:
            return None
        return max(0.0, self.time_limit - (time.monotonic() - self.started))

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose lines carry the job's id, key, task and attempt (fields of
        ``--log-format json``)."""
        return logging.LoggerAdapter(
            logging.getLogger(HANDLER_LOGGER),
            {
                "job_id": self.job_id,
                "key": self.idempotency_key,
                "task": self.task,
                "attempt": self.attempt,
                "worker": self.worker_id,
            },
        )


def follow_up_key(parent_key: str, number: int) -> str:
    """The default key of a job's ``number``-th follow-up: derived from the job's own
    key, so that a retry, a redelivery or a replay of the job asks for the same key
    (and its next step runs once). A parent key too long to extend is hashed."""
    suffix = f">{number}"
    if len(parent_key) + len(suffix) > MAX_KEY_LENGTH:
        parent_key = hashlib.sha256(parent_key.encode("utf-8")).hexdigest()
    return parent_key + suffix


#: Idempotency keys are at most this long (:class:`~broker_jobs.envelope.Job`).
MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class HandlerParameters:
    """How the worker calls a handler: its payload first, then, by keyword, the
    job's context (``context``: the parameter's name, or None)."""

    context: str | None


def handler_parameters(
    task: str, handler: Callable[..., Any], *, transactional: bool
) -> HandlerParameters:
    """Check that the worker can call ``handler`` and say how: ``handler(payload)``
    (``handler(payload, db)`` when transactional), with the parameter annotated
    :class:`JobContext`, if any, by keyword. Anything else a call would need is a
    :class:`ConfigurationError` now, at import, rather than a failure of every attempt."""
    signature = inspect.signature(handler)
    try:
        hints = get_type_hints(handler)
    except Exception:  # an annotation that does not resolve: not a JobContext
        hints = {}
    parameters = list(signature.parameters.values())
    passed = 2 if transactional else 1
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = positional[:passed]
    problems = []
    if len(given) < passed and not any(p.kind is p.VAR_POSITIONAL for p in parameters):
        problems.append(f"it takes fewer than {passed} positional parameters")
    context = None
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if hints.get(parameter.name) is JobContext:
            if parameter in given or parameter.kind is parameter.POSITIONAL_ONLY:
                problems.append(f"its JobContext {parameter.name!r} must come after those")
            elif context is not None:
                problems.append("only one parameter may be annotated JobContext")
            else:
                context = parameter.name
        elif parameter not in given and parameter.default is parameter.empty:
            problems.append(f"nothing is passed for {parameter.name!r} (give it a default)")
    if problems:
        name = getattr(handler, "__qualname__", repr(handler))
        takes = "(payload, db)" if transactional else "(payload)"
        raise ConfigurationError(
            f"handler {name}{signature} of task {task!r} cannot be called by the worker:"
            f" it calls {takes}, and passes the job's context to a parameter annotated"
            f" JobContext; {'; '.join(problems)}"
        )
    return HandlerParameters(context)
