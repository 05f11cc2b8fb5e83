"""Least-privilege RabbitMQ permissions for each role of a namespace.

RabbitMQ grants a user three regular expressions per vhost, matched against object
names: *configure* (declare, delete), *write* (publish to an exchange, bind) and
*read* (consume or get from a queue, bind). With the topology declared by an
operator (``broker-jobs topology apply``), no role needs configure:

- publisher: write the work exchange and the delay ladder's level exchanges (a
  delayed job enters at the level of its delay's highest bit);
- worker: read its task queues; write the work exchange (immediate retries), the
  ladder's exchanges (delayed retries) and the dead-letter exchange (jobs it gives
  up on). Dead-lettering by the queue itself needs no permission. Read and write
  ``<ns>.unroutable`` (a queue and a fanout exchange of that name): a worker sends
  on the delayed jobs a restarting broker put there (``broker_jobs.worker.rerouting``),
  and puts back at the end of the queue those whose task has no queue;
- beat: what a publisher has, plus configure, write and read on ``<ns>.beat.leader``:
  its leader election declares a quorum queue and a fanout exchange of that name,
  binds them, publishes tokens to the exchange and consumes the queue.

Passive declares (checking that an object exists) need no permission: measured on
RabbitMQ 3.10, a user with ``^$`` everywhere may passive-declare any exchange or
queue of the vhost, and is refused (403) on anything else.

Routing to ``<ns>.unroutable`` (the alternate exchange of ``<ns>.delay.out``) needs
no permission: measured on 3.10, a publisher with the grants below whose job
goes from a ladder exchange on to ``<ns>.delay.out`` and its alternate exchange
while it publishes is not refused, and the job lands in the queue.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from topology.names import Names

#: Matches no name: RabbitMQ's way of granting nothing.
NOTHING = "^$"


class Role(StrEnum):
    PUBLISHER = "publisher"
    WORKER = "worker"
    BEAT = "beat"


@dataclass(frozen=True)
class Permissions:
    role: Role
    configure: str
    write: str
    read: str
    #: Why each grant is there, one line each, for the printed command.
    notes: tuple[str, ...]

    def command(self, user: str, vhost: str = "/") -> str:
        """The ready-to-run ``rabbitmqctl set_permissions`` line, shell-quoted."""
        arguments = ["set_permissions", "-p", vhost, user, self.configure, self.write, self.read]
        return "rabbitmqctl " + " ".join(shlex.quote(argument) for argument in arguments)


def beat_leader_queue(names: Names) -> str:
    """The queue (and fanout exchange) of beat's leader election."""
    return f"{names.namespace}.beat.leader"


def role_permissions(role: Role, names: Names, tasks: Sequence[str] | None) -> Permissions:
    """Permissions of ``role``; a worker reads the queues of ``tasks``, or every task
    queue of the namespace when ``tasks`` is None."""
    # Delayed jobs enter the ladder at the level of their delay's highest bit.
    ladder = names.delay_exchange_pattern
    publishes = f"write: publish to {names.work_exchange} and the delay ladder's exchanges"
    if role is Role.PUBLISHER:
        notes = ("configure: nothing", publishes, "read: nothing")
        write = exact([names.work_exchange], patterns=[ladder])
        return Permissions(role, NOTHING, write, NOTHING, notes)
    if role is Role.WORKER:
        unroutable = names.unroutable_queue  # also its exchange's name
        if tasks is None:
            queues = [escape(names.task_queue_prefix) + ".+"]
            reads = f"read: consume every task queue of the namespace, and {unroutable}"
        else:
            # Each task's queue and its lanes' (priority levels, shards), which the
            # task names alone do not tell: every lane a task can have.
            queues = [escape(names.task_queue(task)) + LANES for task in tasks]
            reads = f"read: consume the task queues, and {unroutable}"
        writes = [names.work_exchange, names.dead_letter_exchange]
        return Permissions(
            role,
            NOTHING,
            exact([*writes, unroutable], patterns=[ladder]),
            exact([unroutable], patterns=queues),
            (
                "configure: nothing",
                f"write: retries and dead letters to {', '.join(writes)} and the ladder;"
                f" unroutable delayed jobs back to {unroutable}",
                reads + " (sending on the delayed jobs a restarting broker put there)",
            ),
        )
    leader = beat_leader_queue(names)
    return Permissions(
        role,
        exact([leader]),
        exact([names.work_exchange, leader], patterns=[ladder]),
        exact([leader]),
        (
            f"configure: declare the queue and exchange {leader} (leader election)",
            f"{publishes}; tokens to {leader}",
            f"read: consume {leader} and bind it to its exchange",
        ),
    )


#: What a lane adds to a task queue's name (topology/lanes.py): ``@high``, ``:3``...
LANES = r"(@(high|low))?(:[0-9]+)?"


def escape(name: str) -> str:
    """A name as a regex literal. Our names hold letters, digits, ``_``, ``-`` and
    dots; only the dot is special outside a character class, and escaping just it
    keeps the printed patterns readable."""
    return name.replace(".", r"\.")


def exact(names: Iterable[str], patterns: Iterable[str] = ()) -> str:
    """A regex matching exactly ``names`` and ``patterns`` (``^$`` for none)."""
    escaped = [escape(name) for name in names] + list(patterns)
    if not escaped:
        return NOTHING
    return "^(" + "|".join(escaped) + ")$" if len(escaped) > 1 else f"^{escaped[0]}$"
