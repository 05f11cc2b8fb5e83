"""What both publishers share: turning a call into a job, and settling a batch.

The sync (pika) and async (aio-pika) publishers differ only in how they talk to the
broker; validation, encoding and the confirmed/failed bookkeeping live here so that
the two cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

from pydantic import BaseModel, ValidationError

from broker_jobs.amqp.declaring import declare_topology, prepare_ladder
from broker_jobs.amqp.driver_logs import connect_lines_dropped
from broker_jobs.app import App, TaskSpec
from broker_jobs.clock import utc_now
from broker_jobs.due import Delay, Route, direct_route, due_time, route_for
from broker_jobs.envelope import Job, WireMessage, encode, encode_again, encode_new, new_job_id
from broker_jobs.errors import (
    BrokerJobsError,
    ConfigurationError,
    JobError,
    MessageTooLargeError,
    PayloadEncodingError,
    PayloadValidationError,
    PublishBatchError,
    UnroutableError,
    describe_validation_error,
)
from broker_jobs.keywords import check_keywords, refuse_unknown_keywords
from broker_jobs.observe.tracing import publish_span, publish_spans, publishing_traced
from broker_jobs.publish.ledger import PublishedLedger
from broker_jobs.store.base import Store
from broker_jobs.urls import AnyBrokerURLs, BrokerURL, BrokerURLs
from topology import DEFAULT_NAMESPACE, InvalidNameError, Names, Topology, namespace_topology
from topology.lanes import Lane, shard_of
from topology.names import is_task_name
from topology.priority import InvalidPriorityError, Priority

Payload = BaseModel | Mapping[str, Any]
#: A task by name, or by the handle ``App.declare`` returned (typed publishing).
TaskRef = str | TaskSpec[Any]


def task_name(task: TaskRef) -> str:
    """The name of a task given by name or by its handle."""
    return task.name if isinstance(task, TaskSpec) else task


#: Seconds to wait for a publisher confirm. A quorum queue that lost its majority
#: never confirms; without a bound the caller would hang forever.
DEFAULT_CONFIRM_TIMEOUT = 10.0
#: Seconds to wait for the TCP and AMQP handshake.
DEFAULT_CONNECT_TIMEOUT = 10.0


#: RabbitMQ's default ``max_message_size`` (128 MiB, 3.8 and later).
DEFAULT_MAX_MESSAGE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class PublisherSettings:
    """Options shared by both publishers, validated once."""

    confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    declare: bool = True
    connection_name: str = "broker-jobs publisher"

    def __post_init__(self) -> None:
        for name in ("confirm_timeout", "connect_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigurationError(f"{name} must be a positive number of seconds")


class JobOptions(TypedDict, total=False):
    """Per-job options of ``publish``: ``job_id`` (default: a new UUID),
    ``idempotency_key`` (default: the job id), W3C trace context, and when to run:
    ``delay`` (seconds or a timedelta) or ``eta`` (a timezone-aware datetime), and
    ``priority`` (``"high"``, ``"normal"``, ``"low"`` or 0-9; for tasks declared with
    priorities)."""

    job_id: str | None
    idempotency_key: str | None
    traceparent: str | None
    tracestate: str | None
    delay: Delay | None
    eta: datetime | None
    #: Which execution this is (1 by default); workers publish retries with it.
    attempt: int | None
    priority: Priority | str | int | None


class Prepared:
    """A validated job, its wire form and its route.

    A job published without options goes out before its model is built: its wire
    form is made from its fields (:func:`~broker_jobs.envelope.encode_new`), checked
    before, and :attr:`job` builds the model when first asked for, which the sync
    publisher does while the confirm travels (the model's validation is ~30 us of a
    single publish's ~200 us before the send, on a CPU cold after a pause).
    """

    __slots__ = ("_job", "message", "route")

    def __init__(self, job: Job | dict[str, Any], message: WireMessage, route: Route) -> None:
        """``job``, or the fields of a job to build, which its model accepts."""
        self._job = job
        self.message = message
        self.route = route

    @property
    def job(self) -> Job:
        if isinstance(self._job, dict):
            self._job = Job.model_validate(self._job)
        return self._job

    def carrying(self, job: Job) -> Prepared:
        """The same job with ``job``'s trace context (``self`` when unchanged)."""
        if job is self.job:
            return self
        return Prepared(job, encode_again(job, self.message), self.route)


@dataclass
class TracedBatch:
    """A batch's jobs carrying their producer spans' contexts; the caller sets
    ``failed`` (job id to error) once the batch is settled."""

    prepared: list[Prepared]
    failed: Mapping[str, BaseException] = field(default_factory=dict)


_OPTION_FIELDS = {
    "job_id": "id",
    "idempotency_key": "idempotency_key",
    "traceparent": "traceparent",
    "tracestate": "tracestate",
    "attempt": "attempt",
}


class PublisherBase:
    """Construction shared by :class:`Publisher` and :class:`AsyncPublisher`."""

    default_connection_name = "broker-jobs publisher"

    def __init__(
        self,
        url: AnyBrokerURLs,
        app: App | None = None,
        *,
        namespace: str | None = None,
        confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        declare: bool = True,
        connection_name: str | None = None,
        ledger: Store | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        """``url``: the broker's AMQP URL, or the URLs of its nodes (a sequence, or
        separated by commas): the publisher connects to the first that answers and,
        after losing a connection, tries the other nodes first. ``app`` types and
        validates payloads (or pass ``namespace`` to publish plain dicts by task
        name); ``declare=False`` leaves the topology to the operator;
        ``connection_name`` shows in the broker's connection list; ``ledger``, the
        store the workers use, records each confirmed job as queued or scheduled, so
        it can be listed and cancelled before it starts (``docs/store.md``);
        ``max_message_bytes``: a job whose message is larger is refused before it is
        sent (:class:`MessageTooLargeError`), as the broker would refuse it (its
        ``max_message_size``) by closing the channel under every publish in flight."""
        self._urls = BrokerURLs.parse(url)
        #: The node of the current connection, or of the last one (lost or closed):
        #: the next connection tries the others first.
        self._node: BrokerURL | None = None
        self._factory = JobFactory(app, namespace, max_message_bytes=max_message_bytes)
        self._settings = PublisherSettings(
            confirm_timeout,
            connect_timeout,
            declare,
            connection_name or self.default_connection_name,
        )
        self._ladder_ready = False  # declared (or, with declare=False, assumed) on this connection
        self._routable_tasks: set[str] = set()  # tasks known to have a queue
        self._ledger = PublishedLedger(ledger) if ledger is not None else None
        self._init_connection_state()

    def _init_connection_state(self) -> None:
        """Set up the subclass's connection state (called by ``__init__``)."""

    def _traced(self, prepared: Prepared) -> AbstractContextManager[Prepared]:
        """Around one job's publish and confirm: its producer span
        (``observe/tracing.py``). Yields the job to send, carrying the span's trace
        context; an error raised in the block marks the span failed. Without a span
        to record, the job as it is."""
        if not publishing_traced():
            return nullcontext(prepared)
        return self._in_span(prepared)

    @contextmanager
    def _in_span(self, prepared: Prepared) -> Iterator[Prepared]:
        route = prepared.route
        with publish_span(
            prepared.job, exchange=route.exchange, routing_key=route.routing_key
        ) as job:
            yield prepared.carrying(job)

    @contextmanager
    def _traced_batch(self, prepared: Sequence[Prepared]) -> Iterator[TracedBatch]:
        """Around a batch's publish: a producer span per job, each ended when the
        batch is settled, failed for the jobs of ``TracedBatch.failed`` (for all of
        them when the block raises)."""
        spans = publish_spans(
            [(item.job, item.route.exchange, item.route.routing_key) for item in prepared]
        )
        batch = TracedBatch(
            [item.carrying(job) for item, job in zip(prepared, spans.jobs, strict=True)]
        )
        try:
            yield batch
        except BaseException as error:
            spans.end(error=error)
            raise
        spans.end(batch.failed)

    def _needs_ladder_check(self, prepared: Sequence[Prepared]) -> bool:
        return any(
            item.route.via_ladder
            and not (self._ladder_ready and item.job.task in self._routable_tasks)
            for item in prepared
        )

    def _check_ladder(self, prepared: Sequence[Prepared]) -> dict[str, BrokerJobsError]:
        """Before jobs enter the delay ladder: declare it once per connection, and
        refuse jobs whose task has no queue (they would wait in the ladder forever).
        Blocking; returns the refused jobs' errors by job id."""
        tasks = {item.job.task for item in prepared if item.route.via_ladder}
        unknown = tasks - self._routable_tasks
        missing = prepare_ladder(
            self._urls.starting_at(self._node),
            self._factory.names,
            unknown,
            declare_ladder=self._settings.declare and not self._ladder_ready,
            timeout=self._settings.connect_timeout,
            connection_name=f"{self._settings.connection_name} (declare)",
        )
        self._ladder_ready = True
        self._routable_tasks |= unknown - missing
        return {
            item.job.id: self._factory.unroutable(item.job)
            for item in prepared
            if item.route.via_ladder and item.job.task in missing
        }

    def _declare(self, node: BrokerURL) -> None:
        """Declare the topology (blocking), on ``node`` if it answers: called just
        after connecting to it. pika's dozen INFO lines about the declaring
        connection's life are dropped: a connection of ours, which our errors name."""
        with connect_lines_dropped():
            declare_topology(
                self._urls.starting_at(node),
                self._factory.topology(),
                timeout=self._settings.connect_timeout,
                connection_name=f"{self._settings.connection_name} (declare)",
            )

    def _record_confirmed(self, jobs: Sequence[Job]) -> None:
        """Tell the ledger (if given) of ``jobs``, all confirmed; blocking."""
        if self._ledger is not None:
            self._ledger.record(jobs)

    def _node_name(self) -> str:
        """The node connected to (masked), or every node before the first connection."""
        return self._node.masked if self._node is not None else self._urls.masked

    def _forget_connection_facts(self) -> None:
        """After a reconnect the broker may have been reset: check again."""
        self._ladder_ready = False
        self._routable_tasks.clear()

    def __repr__(self) -> str:
        namespace = self._factory.names.namespace
        return f"{type(self).__name__}({self._urls.masked!r}, namespace={namespace!r})"


@dataclass(frozen=True)
class JobRequest:
    """One job of a ``publish_many`` batch; the fields mean what ``publish`` takes
    (an unknown keyword is a ``TypeError`` naming it and, where one is close, the
    right one)."""

    task: TaskRef
    payload: Payload
    job_id: str | None = None
    idempotency_key: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    delay: Delay | None = None
    eta: datetime | None = None
    priority: Priority | str | int | None = None


JobRequest.__init__ = refuse_unknown_keywords(where="JobRequest")(  # type: ignore[method-assign]
    JobRequest.__init__
)
#: What ``publish`` takes as ``**options``.
JOB_OPTIONS = JobOptions.__required_keys__ | JobOptions.__optional_keys__


class JobFactory:
    """Builds validated, encoded jobs for one app, or for plain task names."""

    def __init__(
        self,
        app: App | None,
        namespace: str | None,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if app is not None and namespace not in (None, app.namespace):
            raise ConfigurationError(
                f"namespace {namespace!r} differs from the app's {app.namespace!r}:"
                " pass one or the other"
            )
        self.app = app
        self.max_message_bytes = max_message_bytes
        try:
            self.names = app.names if app else Names(namespace or DEFAULT_NAMESPACE)
        except InvalidNameError as error:
            raise ConfigurationError(str(error)) from None

    def topology(self) -> Topology:
        """What the publisher declares on connecting: the app's tasks, or just the
        exchanges. The delay ladder waits for the first delayed job."""
        if self.app is not None:
            return self.app.topology(ladder=False)
        return namespace_topology(self.names, (), ladder=False)

    def build(self, task: TaskRef, payload: Payload, **options: Unpack[JobOptions]) -> Prepared:
        """Validate, encode and route one job; raises a :class:`JobError` subclass
        (``TypeError`` for an option ``publish`` does not take)."""
        task = task_name(task)
        data = self._payload_data(task, payload)
        now = utc_now()
        if not options and _model_accepts(task, data, now):  # most publishes
            return self._build_plain(task, data, now)
        fields: dict[str, Any] = {"task": task, "payload": data, "created_at": now}
        if options:  # most publishes give none
            check_keywords("publish", options, JOB_OPTIONS)
            fields["due_at"] = due_time(now, options.get("delay"), options.get("eta"))
            for option, field_name in _OPTION_FIELDS.items():
                if value := options.get(option):
                    fields[field_name] = value
            fields["priority"] = self._priority(task, options.get("priority"))
        try:
            job = Job.model_validate(fields)
        except ValidationError as error:
            raise JobError(
                f"job for task {task!r} is invalid: {describe_validation_error(error)}"
            ) from None
        try:
            message = encode(job)
        except (TypeError, ValueError) as error:
            raise PayloadEncodingError(task, str(error)) from None
        self._check_size(task, message)
        return Prepared(job, message, route_for(self.names, job, now, self._shards(task)))

    def _build_plain(self, task: str, data: dict[str, Any], now: datetime) -> Prepared:
        """A job without options, its model left to build (:class:`Prepared`): the
        fields but the payload are made here, as the model would make them."""
        job_id = new_job_id()
        try:
            message = encode_new(job_id, task, data, now)
        except (TypeError, ValueError) as error:
            raise PayloadEncodingError(task, str(error)) from None
        self._check_size(task, message)
        lane = Lane(Priority.NORMAL, shard_of(job_id, self._shards(task)))
        fields = {"id": job_id, "task": task, "payload": data, "created_at": now}
        return Prepared(fields, message, direct_route(self.names, task, lane))

    def _check_size(self, task: str, message: WireMessage) -> None:
        limit = self.max_message_bytes
        if len(message.body) > limit:
            raise MessageTooLargeError(task, len(message.body), limit)

    def build_request(self, request: JobRequest) -> Prepared:
        return self.build(
            request.task,
            request.payload,
            job_id=request.job_id,
            idempotency_key=request.idempotency_key,
            traceparent=request.traceparent,
            tracestate=request.tracestate,
            delay=request.delay,
            eta=request.eta,
            priority=request.priority,
        )

    def again(self, job: Job, original: WireMessage) -> Prepared:
        """``job`` (a retry, or the same job for later) as the message that replaces
        ``original`` (:func:`~broker_jobs.envelope.encode_again`), routed for its due
        time; its payload was validated when ``original`` was decoded."""
        message = encode_again(job, original)
        return Prepared(job, message, route_for(self.names, job, utc_now(), self._shards(job.task)))

    def current_route(self, prepared: Prepared) -> Route:
        """The route as of now: a delayed job's whole units shrink while it waits to
        be sent (a first connection, the ladder's declaration)."""
        if not prepared.route.via_ladder:  # straight to its queue: it stays so
            return prepared.route
        job = prepared.job
        return route_for(self.names, job, utc_now(), self._shards(job.task))

    def unroutable(self, job: Job) -> UnroutableError:
        """The broker returned ``job``: no queue of its lane (its level and shard)."""
        lane = Lane(job.priority, shard_of(job.idempotency_key, self._shards(job.task)))
        names = self.names
        return UnroutableError(
            job.task, names.work_exchange, names.lane_queue(job.task, lane), level=job.priority
        )

    def _shards(self, task: str) -> int:
        """The task's shards: the app's declaration, else one (a publisher without the
        app sends every job to shard 0, which is always correct)."""
        if self.app is None or task not in self.app:
            return 1
        return self.app.get(task).queue.shards

    def _priority(self, task: str, value: Priority | str | int | None) -> Priority:
        """The level, refused for a task of the app declared without priorities (it
        has no queue of that level: the broker would return the job)."""
        try:
            level = Priority.of(value)
        except InvalidPriorityError as error:
            raise JobError(f"job for task {task!r}: {error}") from None
        if level is Priority.NORMAL or self.app is None:
            return level
        if self.app.get(task).queue.priorities is None:
            raise JobError(
                f"task {task!r} has no priorities, so no queue for {level.value!r} jobs:"
                f" declare it with priorities='6:3:1' (or 'strict'), apply the topology,"
                " or publish without a priority"
            )
        return level

    def _payload_data(self, task: str, payload: Payload) -> dict[str, Any]:
        try:
            if self.app is not None:
                return self.app.get(task).validate(payload).model_dump(mode="json")
            if isinstance(payload, BaseModel):
                return payload.model_dump(mode="json")
        except ValueError as error:  # pydantic's serialisation errors, invalid UTF-8 bytes
            raise PayloadEncodingError(task, str(error)) from None
        if not isinstance(payload, Mapping):
            raise PayloadValidationError(
                task, f"payload must be a dict or a pydantic model, got {type(payload).__name__}"
            )
        data = dict(payload)
        try:
            # Checked here, not at encode time, so the error names the real cause
            # rather than pydantic's copy of the value.
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise PayloadEncodingError(task, str(error)) from None
        return data


def _model_accepts(task: str, payload: dict[str, Any], now: datetime) -> bool:
    """What a job's model checks of the fields a publish was given, and of the time
    (a test's clock may give any): else the model is built before the send, and
    raises its error."""
    return is_task_name(task) and now.tzinfo is UTC and all(isinstance(key, str) for key in payload)


@dataclass
class BatchOutcome:
    """Confirmed and failed jobs of one batch, in publish order."""

    jobs: Sequence[Job]
    confirmed: set[str] = field(default_factory=set)
    failed: dict[str, BrokerJobsError] = field(default_factory=dict)

    def confirmed_jobs(self) -> list[Job]:
        return [job for job in self.jobs if job.id in self.confirmed]

    def settle(self) -> list[Job]:
        """Return the jobs if all were confirmed, else raise :class:`PublishBatchError`."""
        if not self.failed:
            return list(self.jobs)
        raise PublishBatchError([job.id for job in self.confirmed_jobs()], self.failed)


def check_unique_ids(jobs: Sequence[Job]) -> None:
    """Confirms and returns are matched to jobs by id, so a batch repeats none."""
    if len({job.id for job in jobs}) != len(jobs):
        raise JobError("a batch holds two jobs with the same id; give each job its own id")


def confirm_timeout_hint(reason: str | None, *, blocked: bool = False) -> str:
    """Why confirms may not come, for a :class:`ConfirmTimeoutError`: the broker
    blocked the connection (with ``reason``, when the client was told one; ``blocked``
    when it only knows that), or the likely other cause."""
    if reason or blocked:
        said = f" ({reason})" if reason else ""
        return (
            f"The broker reports the connection blocked{said}: a memory or disk alarm"
            " stops publishing until it clears (rabbitmq-diagnostics alarms)."
        )
    return "A quorum queue without a majority of its replicas cannot confirm."
