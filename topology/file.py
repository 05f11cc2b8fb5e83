"""A namespace's topology declared in a TOML file, for operators without the app's code.

The file names what the app would register, and nothing the model cannot derive::

    namespace = "jobs"                 # optional, default "jobs"

    [tasks."image.resize"]             # quote task names: they contain dots
    queue_type = "quorum"              # optional: "quorum" (default) or "classic"
    delivery_limit = 10                # optional, quorum queues only
    priorities = "6:3:1"               # optional: "strict" or weights high:normal:low
    shards = 4                         # optional: queues per level (default 1)

    [tasks."mail.send"]                # a task with every default

    [ladder]                           # optional
    queue_type = "quorum"              # the delay ladder's queues and <ns>.unroutable

Both this file and an ``App`` become a :class:`NamespaceSpec`, so the operator's
commands see one model whichever way the topology is given. Unknown keys are errors:
a typo must not silently fall back to a default the operator did not choose.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topology.lanes import InvalidShardsError, check_shards
from topology.model import QueueOptions, QueueType, Topology
from topology.names import DEFAULT_NAMESPACE, InvalidNameError, Names, check_task_name
from topology.namespace import namespace_topology
from topology.priority import InvalidPriorityError, PriorityPolicy

_TOP_KEYS = {"namespace", "tasks", "ladder"}
_TASK_KEYS = {"queue_type", "delivery_limit", "priorities", "shards"}
_LADDER_KEYS = {"queue_type"}


class TopologyFileError(ValueError):
    """The file cannot be read or says something the model cannot hold."""


@dataclass(frozen=True)
class NamespaceSpec:
    """What a namespace declares: its names, its tasks' queue options, the ladder."""

    names: Names
    tasks: tuple[tuple[str, QueueOptions], ...] = ()
    ladder_queue_type: QueueType = QueueType.QUORUM

    @property
    def task_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.tasks)

    def topology(self) -> Topology:
        """Everything on the broker, delay ladder included: the operator declares all
        of it up front, since a publisher without configure permission cannot."""
        return namespace_topology(
            self.names, self.tasks, ladder=True, ladder_queue_type=self.ladder_queue_type
        )


def load_file(path: str | Path) -> NamespaceSpec:
    """Read and check a topology file; :class:`TopologyFileError` names file and key."""
    source = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise TopologyFileError(f"cannot read topology file {source}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise TopologyFileError(f"{source}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise TopologyFileError(f"{source}: not valid TOML: {error}") from None
    return parse(data, source)


def parse(data: Mapping[str, Any], source: str = "<topology>") -> NamespaceSpec:
    """Build the spec from parsed TOML; ``source`` names the file in errors."""
    _no_unknown_keys(data, _TOP_KEYS, "the top level", source)
    namespace = data.get("namespace", DEFAULT_NAMESPACE)
    if not isinstance(namespace, str):
        raise TopologyFileError(f'{source}: namespace must be a string, e.g. namespace = "jobs"')
    try:
        names = Names(namespace)
    except InvalidNameError as error:
        raise TopologyFileError(f"{source}: {error}") from None
    tasks_table = _table(data.get("tasks", {}), "[tasks]", source)
    tasks = tuple(
        (_task_name(name, source), _task_options(name, options, source))
        for name, options in tasks_table.items()
    )
    ladder = _table(data.get("ladder", {}), "[ladder]", source)
    _no_unknown_keys(ladder, _LADDER_KEYS, "[ladder]", source)
    ladder_type = _queue_type(ladder.get("queue_type", QueueType.QUORUM.value), "[ladder]", source)
    return NamespaceSpec(names, tasks, ladder_type)


def _task_name(name: str, source: str) -> str:
    try:
        return check_task_name(name)
    except InvalidNameError as error:
        raise TopologyFileError(f"{source}: [tasks.{name}]: {error}") from None


def _task_options(name: str, value: Any, source: str) -> QueueOptions:
    where = f'[tasks."{name}"]'
    options = _table(value, where, source)
    for key, item in options.items():
        if isinstance(item, Mapping):
            # [tasks.image.resize] without quotes nests tables: say how to write it.
            raise TopologyFileError(
                f"{source}: {where} holds a table {key!r}: quote task names that contain"
                f' dots, e.g. [tasks."{name}.{key}"]'
            )
    _no_unknown_keys(options, _TASK_KEYS, where, source)
    queue_type = _queue_type(options.get("queue_type", QueueType.QUORUM.value), where, source)
    priorities = _priorities(options.get("priorities"), where, source)
    shards = _shards(options.get("shards", 1), where, source)
    if "delivery_limit" not in options:
        return QueueOptions(queue_type=queue_type, priorities=priorities, shards=shards)
    limit = options["delivery_limit"]
    # bool is an int in Python; "delivery_limit = true" is a mistake, not 1.
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise TopologyFileError(
            f"{source}: {where} delivery_limit must be a whole number >= 1, got {limit!r}"
        )
    if queue_type is QueueType.CLASSIC:
        raise TopologyFileError(
            f"{source}: {where} delivery_limit applies to quorum queues only; remove it"
            ' or use queue_type = "quorum"'
        )
    return QueueOptions(
        queue_type=queue_type, delivery_limit=limit, priorities=priorities, shards=shards
    )


def _shards(value: Any, where: str, source: str) -> int:
    try:
        return check_shards(value)
    except InvalidShardsError as error:
        raise TopologyFileError(f"{source}: {where} {error}") from None


def _priorities(value: Any, where: str, source: str) -> PriorityPolicy | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TopologyFileError(
            f'{source}: {where} priorities must be a string: "strict" or weights such as'
            f' "6:3:1", got {value!r}'
        )
    try:
        return PriorityPolicy.parse(value)
    except InvalidPriorityError as error:
        raise TopologyFileError(f"{source}: {where} {error}") from None


def _queue_type(value: Any, where: str, source: str) -> QueueType:
    try:
        return QueueType(value)
    except ValueError:
        choices = ", ".join(f'"{item.value}"' for item in QueueType)
        raise TopologyFileError(
            f"{source}: {where} queue_type must be one of {choices}, got {value!r}"
        ) from None


def _table(value: Any, where: str, source: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TopologyFileError(f"{source}: {where} must be a table, got {value!r}")
    return value


def _no_unknown_keys(table: Mapping[str, Any], known: set[str], where: str, source: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise TopologyFileError(
            f"{source}: unknown key {unknown[0]!r} in {where}"
            f" (known keys: {', '.join(sorted(known))})"
        )
