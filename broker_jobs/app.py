"""The task registry: an :class:`App` names task types and their payload models.

There is no global app. A publishing service creates one (or none, to publish plain
dicts by task name); a worker imports the module that defines it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, get_type_hints

from pydantic import BaseModel, ValidationError

from broker_jobs.errors import (
    ConfigurationError,
    PayloadValidationError,
    UnknownTaskError,
    describe_validation_error,
)
from broker_jobs.job_context import handler_parameters
from broker_jobs.keywords import refuse_unknown_keywords
from broker_jobs.retry import RetryPolicy
from broker_jobs.schedule_decl import At, ScheduleDeclaration, Seconds, add_declaration
from topology import InvalidNameError, Names, QueueOptions, Topology, namespace_topology
from topology.lanes import InvalidShardsError
from topology.names import DEFAULT_NAMESPACE, check_task_name
from topology.priority import InvalidPriorityError, PriorityPolicy

Handler = Callable[..., Any]
HandlerT = TypeVar("HandlerT", bound=Handler)
ModelT = TypeVar("ModelT", bound=BaseModel)


@dataclass(frozen=True)
class TaskSpec(Generic[ModelT]):
    """A declared task type: its name, payload model, queue options and handler.

    ``handler`` is ``None`` in services that only publish. What :meth:`App.declare`
    returns: ``publisher.publish(spec, payload)`` type-checks the payload against the
    task's model.
    """

    name: str
    payload_model: type[ModelT]
    queue: QueueOptions
    handler: Handler | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: Seconds a run may take; None for no limit (the broker's consumer_timeout,
    #: 30 min by default, still applies to the delivery).
    time_limit: float | None = None
    #: The handler takes the store's database connection as second argument and
    #: its writes commit in the same transaction as the job's success record.
    transactional: bool = False
    #: The handler's parameter annotated JobContext (passed by keyword), or None.
    context_parameter: str | None = None
    #: Keep the handler's return value in the ledger with its success (``jobs show``,
    #: ``store.result``); False: returned values are dropped (docs/store.md, Results).
    keep_result: bool = True

    @functools.cached_property
    def is_async(self) -> bool:
        """Whether the handler is a coroutine function (run on the event loop)."""
        return self.handler is not None and inspect.iscoroutinefunction(self.handler)

    def same_contract(self, other: TaskSpec[Any]) -> bool:
        """Whether ``other`` declares the same payload model and queue options."""
        return self.payload_model is other.payload_model and self.queue == other.queue

    def describe(self) -> str:
        """The contract in words, for errors naming two declarations."""
        model = f"{self.payload_model.__module__}.{self.payload_model.__qualname__}"
        return f"payload {model}, {self.queue}"

    def validate(self, payload: BaseModel | Mapping[str, Any]) -> BaseModel:
        """The payload as an instance of the task's model, or ``PayloadValidationError``."""
        if isinstance(payload, self.payload_model):
            return payload
        if isinstance(payload, BaseModel):
            raise PayloadValidationError(
                self.name,
                f"expected {self.payload_model.__name__}, got {type(payload).__name__}",
            )
        try:
            return self.payload_model.model_validate(payload)
        except ValidationError as error:
            raise PayloadValidationError(self.name, describe_validation_error(error)) from None


class App:
    """A namespace of task types. Pass it to publishers and workers explicitly.

    >>> class Resize(BaseModel):
    ...     url: str
    ...     width: int
    >>> app = App(namespace="jobs")
    >>> app.declare("image.resize", Resize)  # publisher side: model only
    """

    def __init__(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        try:
            self.names = Names(namespace)
        except InvalidNameError as error:
            raise ConfigurationError(str(error)) from None
        self._tasks: dict[str, TaskSpec[Any]] = {}
        self._schedules: dict[str, ScheduleDeclaration] = {}

    @property
    def namespace(self) -> str:
        return self.names.namespace

    @refuse_unknown_keywords()
    def declare(
        self,
        name: str,
        payload_model: type[ModelT],
        *,
        queue: QueueOptions | None = None,
        priorities: PriorityPolicy | str | None = None,
        shards: int | None = None,
    ) -> TaskSpec[ModelT]:
        """Declare a task type without a handler: a contract that the publishing
        service and the worker share (``priorities`` and ``shards`` as for
        :meth:`task`). The worker binds its handler with :meth:`handler` (or
        :meth:`task` with the same model), so the publisher never imports the
        worker's code and the queue options cannot drift. Returns the task's handle:
        ``publisher.publish(handle, Model(...))`` type-checks the payload."""
        options = _queue_options(name, queue, priorities, shards)
        spec = TaskSpec(_task_name(name), payload_model, options)
        declared = self._tasks.get(spec.name)
        if declared is not None and declared.same_contract(spec):
            return declared  # the same contract, again
        return self._add(spec)

    @refuse_unknown_keywords()
    def handler(
        self,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        time_limit: float | None = None,
        transactional: bool = False,
        keep_result: bool = True,
    ) -> Callable[[HandlerT], HandlerT]:
        """Decorator binding a handler to a task declared with :meth:`declare` (in a
        contracts module the publishing service imports too): the handler's payload
        model must be the declared one; the queue options are the declaration's.
        ``retry``, ``time_limit``, ``transactional`` and ``keep_result`` as for
        :meth:`task`."""
        if name not in self._tasks:
            raise ConfigurationError(
                f"task {name!r} is not declared in this app: declare it first"
                f" (app.declare({name!r}, Model)), or use @app.task({name!r})"
            )
        declared = self._tasks[name]
        return self.task(
            name,
            queue=declared.queue,
            retry=retry,
            time_limit=time_limit,
            transactional=transactional,
            keep_result=keep_result,
        )

    @refuse_unknown_keywords()
    def task(
        self,
        name: str,
        *,
        queue: QueueOptions | None = None,
        retry: RetryPolicy | None = None,
        time_limit: float | None = None,
        transactional: bool = False,
        priorities: PriorityPolicy | str | None = None,
        shards: int | None = None,
        keep_result: bool = True,
    ) -> Callable[[HandlerT], HandlerT]:
        """Decorator declaring a task whose handler takes the payload model as its
        first parameter (annotated): ``@app.task("image.resize") def resize(p: Resize)``.
        ``retry`` decides retries (default: 5 attempts, exponential backoff);
        ``time_limit`` bounds one run in seconds. ``transactional=True``: the handler
        is ``def handle(payload: Model, db) -> None`` and its writes through ``db``
        (the store's sqlite3 or psycopg connection) commit in one transaction with the
        job's success, so they happen exactly once (no time limit then: a transaction
        cannot be cut short from outside). ``priorities`` (``"strict"`` or weights
        such as ``"6:3:1"``): a queue per level (high, normal, low) and the order the
        worker starts them in (docs/priorities.md); publish with ``priority=``.
        ``shards=N``: N queues (per level), a job going to its key's shard, so one hot
        task is spread over several queues and their leaders (docs/scaling.md).
        What the handler returns (JSON: a pydantic model, dict, list, scalar) is kept
        in the ledger with its success; ``keep_result=False`` drops it.
        """
        options = _queue_options(name, queue, priorities, shards)
        # Not given: a task declared already (a shared contract) keeps its options.
        options_given = options if (queue, priorities, shards) != (None, None, None) else None
        if transactional and time_limit is not None:
            raise ConfigurationError(
                f"task {name!r}: a transactional handler cannot have a time_limit; bound"
                " its work inside the transaction (e.g. a statement timeout) instead"
            )
        if time_limit is not None and time_limit <= 0:
            raise ConfigurationError(f"time_limit of task {name!r} must be positive seconds")

        def register(handler: HandlerT) -> HandlerT:
            model = _payload_model_of(name, handler)
            if transactional and inspect.iscoroutinefunction(handler):
                raise ConfigurationError(
                    f"transactional task {name!r} needs a sync handler taking"
                    " (payload, db): it runs inside the store's database transaction"
                )
            parameters = handler_parameters(name, handler, transactional=transactional)
            spec = TaskSpec(
                _task_name(name),
                model,
                options_given or self._declared_options(name, options),
                handler,
                retry or RetryPolicy(),
                time_limit,
                transactional,
                parameters.context,
                keep_result,
            )
            self._bind(spec, handler)
            return handler

        return register

    @refuse_unknown_keywords()
    def schedule(
        self,
        name: str,
        task: str,
        *,
        cron: str | None = None,
        every: Seconds | None = None,
        at: At | None = None,
        payload: Mapping[str, Any] | BaseModel | None = None,
        timezone: str | None = None,
        catch_up: str = "all",
        lookback: Seconds = 3600.0,
        jitter: Seconds = 0.0,
        grace: Seconds = 2.0,
    ) -> ScheduleDeclaration:
        """Declare a job the beat publishes on a timing: exactly one of ``cron``
        (5 fields, or 6 with seconds first), ``every`` (seconds or timedelta) or ``at``
        (an instant). Only recorded here; ``scheduler.load_schedules`` validates it.
        """
        declaration = ScheduleDeclaration(
            name=name,
            task=task,
            cron=cron,
            every=every,
            at=at,
            payload=payload,
            timezone=timezone,
            catch_up=catch_up,
            lookback=lookback,
            jitter=jitter,
            grace=grace,
        )
        return add_declaration(self._schedules, declaration)

    @property
    def schedules(self) -> tuple[ScheduleDeclaration, ...]:
        """The declared schedules, in declaration order."""
        return tuple(self._schedules.values())

    def get(self, name: str) -> TaskSpec[Any]:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTaskError(name, list(self._tasks)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[TaskSpec[Any]]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def queue_names(self, task: str) -> tuple[str, ...]:
        """The task's queues: one, or one per lane (priority level, shard)."""
        return tuple(self.names.lane_queue(task, lane) for lane in self.get(task).queue.lanes)

    def lanes_by_task(self) -> dict[str, tuple[str, ...]]:
        """The queues of each task that has more than one (status reads them all)."""
        found = {spec.name: self.queue_names(spec.name) for spec in self}
        return {task: queues for task, queues in found.items() if len(queues) > 1}

    def topology(self, *, ladder: bool = True) -> Topology:
        """The broker objects this app's tasks need; ``ladder=False`` leaves out the
        delay ladder (declared on first use of a delay)."""
        tasks = ((spec.name, spec.queue) for spec in self)
        return namespace_topology(self.names, tasks, ladder=ladder)

    def _add(self, spec: TaskSpec[ModelT]) -> TaskSpec[ModelT]:
        declared = self._tasks.get(spec.name)
        if declared is not None:
            raise ConfigurationError(
                f"task {spec.name!r} is declared twice in this app, differently:"
                f" {declared.describe()}; then {spec.describe()}"
            )
        self._tasks[spec.name] = spec
        return spec

    def _declared_options(self, name: str, default: QueueOptions) -> QueueOptions:
        declared = self._tasks.get(name)
        return declared.queue if declared is not None else default

    def _bind(self, spec: TaskSpec[Any], handler: Handler) -> None:
        """Register a task with its handler: new, or bound to its declaration (the
        same model and queue options; anything else names both)."""
        declared = self._tasks.get(spec.name)
        if declared is None:
            self._tasks[spec.name] = spec
            return
        name = getattr(handler, "__qualname__", repr(handler))
        if declared.handler is not None:
            raise ConfigurationError(
                f"task {spec.name!r} already has a handler"
                f" ({getattr(declared.handler, '__qualname__', declared.handler)!r});"
                f" {name!r} cannot be bound to it too"
            )
        if not declared.same_contract(spec):
            raise ConfigurationError(
                f"handler {name!r} does not match the declaration of task {spec.name!r}:"
                f" declared with {declared.describe()}; the handler has {spec.describe()}"
            )
        self._tasks[spec.name] = spec

    def __repr__(self) -> str:
        return f"App(namespace={self.namespace!r}, tasks={sorted(self._tasks)})"


def _queue_options(
    task: str,
    queue: QueueOptions | None,
    priorities: PriorityPolicy | str | None,
    shards: int | None,
) -> QueueOptions:
    options = queue or QueueOptions()
    changes: dict[str, object] = {}
    if priorities is not None:
        changes["priorities"] = priorities
    if shards is not None:
        changes["shards"] = shards
    if not changes:
        return options
    try:
        return dataclasses.replace(options, **changes)  # type: ignore[arg-type]
    except (InvalidPriorityError, InvalidShardsError) as error:
        raise ConfigurationError(f"task {task!r}: {error}") from None


def _task_name(name: str) -> str:
    try:
        return check_task_name(name)
    except InvalidNameError as error:
        raise ConfigurationError(str(error)) from None


def _payload_model_of(task: str, handler: Handler) -> type[BaseModel]:
    parameters = list(inspect.signature(handler).parameters.values())
    hints = get_type_hints(handler)
    model = hints.get(parameters[0].name) if parameters else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigurationError(
            f"handler of task {task!r} must take its payload as a first parameter annotated"
            " with a pydantic model, e.g. def handle(payload: MyPayload) -> None"
        )
    return model
