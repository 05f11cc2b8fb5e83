"""The broker's shape as data: names, queue arguments, declaration.

This package knows nothing of ``broker_jobs``; the dependency points the other way.
"""

from topology.declare import DeclareReport, declare
from topology.errors import (
    Conflict,
    Difference,
    TopologyConflictError,
    TopologyError,
    TopologyMissingError,
)
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
]
