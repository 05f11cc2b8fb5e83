"""A topology as RabbitMQ definitions JSON, for ``rabbitmqctl import_definitions``
and the ``load_definitions`` setting (a broker that starts with its topology).

Only exchanges, queues and bindings of one vhost: no users, permissions or vhosts,
so importing the file cannot change who may do what. The vhost must exist first.
The fields are those ``rabbitmqctl export_definitions`` writes on RabbitMQ 3.10,
which 3.10 to 4.x import.
"""

from __future__ import annotations

from typing import Any

from topology.model import BindingSpec, ExchangeSpec, QueueSpec, Topology
from topology.names import ARG_QUEUE_TYPE

#: The one format so far; the CLI's ``--format`` names it so others can follow.
RABBITMQ_DEFINITIONS = "rabbitmq-definitions"


def definitions(topology: Topology, vhost: str = "/") -> dict[str, Any]:
    """The definitions document of ``topology`` in ``vhost``."""
    return {
        "exchanges": [_exchange(spec, vhost) for spec in topology.exchanges],
        "queues": [_queue(spec, vhost) for spec in topology.queues],
        "bindings": [_binding(spec, vhost) for spec in topology.bindings],
    }


def _exchange(spec: ExchangeSpec, vhost: str) -> dict[str, Any]:
    return {
        "name": spec.name,
        "vhost": vhost,
        "type": spec.type,
        "durable": spec.durable,
        "auto_delete": False,
        "internal": False,
        "arguments": dict(spec.arguments),
    }


def _queue(spec: QueueSpec, vhost: str) -> dict[str, Any]:
    queue: dict[str, Any] = {
        "name": spec.name,
        "vhost": vhost,
        "durable": spec.durable,
        "auto_delete": False,
        "arguments": dict(spec.arguments),
    }
    # Exports from 3.10 on carry the type beside the argument; the argument is what
    # an import declares with, the field is for readers and newer importers.
    if ARG_QUEUE_TYPE in spec.arguments:
        queue["type"] = spec.arguments[ARG_QUEUE_TYPE]
    return queue


def _binding(spec: BindingSpec, vhost: str) -> dict[str, Any]:
    return {
        "source": spec.exchange,
        "vhost": vhost,
        "destination": spec.destination,
        "destination_type": "exchange" if spec.to_exchange else "queue",
        "routing_key": spec.routing_key,
        "arguments": {},
    }
