"""The broker's shape as data: names, queue arguments, declaration.

This package knows nothing of ``broker_jobs``; the dependency points the other way.
"""

from topology.declare import DeclareReport, declare
from topology.definitions import definitions
from topology.errors import (
    Conflict,
    Difference,
    TopologyConflictError,
    TopologyError,
    TopologyMissingError,
)
from topology.file import NamespaceSpec, TopologyFileError, load_file
from topology.inspect import Inspection, inspect_topology
from topology.model import (
    DEFAULT_DELIVERY_LIMIT,
    BindingSpec,
    ExchangeSpec,
    QueueOptions,
    QueueSpec,
    QueueType,
    Topology,
)
from topology.names import DEFAULT_NAMESPACE, InvalidNameError, Names
from topology.namespace import ladder_topology, namespace_topology, task_topology
from topology.permissions import Permissions, Role, role_permissions

__all__ = [
    "DEFAULT_DELIVERY_LIMIT",
    "DEFAULT_NAMESPACE",
    "BindingSpec",
    "Conflict",
    "DeclareReport",
    "Difference",
    "ExchangeSpec",
    "InvalidNameError",
    "Names",
    "QueueOptions",
    "QueueSpec",
    "QueueType",
    "Topology",
    "TopologyConflictError",
    "TopologyError",
    "TopologyMissingError",
    "declare",
    "ladder_topology",
    "namespace_topology",
    "task_topology",
    # the operator's commands: a declarative file, read-only inspection, export,
    # least-privilege permissions
    "Inspection",
    "NamespaceSpec",
    "Permissions",
    "Role",
    "TopologyFileError",
    "definitions",
    "inspect_topology",
    "load_file",
    "role_permissions",
]
