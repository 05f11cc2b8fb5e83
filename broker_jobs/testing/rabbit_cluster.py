"""A cluster of throwaway RabbitMQ nodes on this machine (no Docker needed).

Each node is a :class:`~broker_jobs.testing.rabbit_node.RabbitNode` with ports, name,
HOME and data dir of its own under ``base_dir``; all share one Erlang cookie. Nodes
2..n join node 1 the documented way (``stop_app``, ``join_cluster``, ``start_app``).

Fault tests kill a node with ``cluster.nodes[i].kill()`` (SIGKILL) and bring it back
with ``cluster.nodes[i].start()``: it boots from its own data dir and rejoins the
cluster by itself (it is still a member). ``cluster.start()`` does that for every node
that is down and then waits until ``cluster_status`` shows them all running.

RabbitMQ facts that shape this (3.10, measured on the project's machines, see the
shared RabbitMQ notes): a 3-node cluster takes ~30 s to form here; when every node is
down, all of them must boot together (a node waits up to 5 min for the Mnesia tables of
its peers), which :meth:`RabbitCluster.start` does; with 2 of 3 nodes down a confirmed
publish to a quorum queue blocks silently until a majority is back.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from broker_jobs.testing.rabbit_node import RabbitNode, RabbitNodeError, free_port, scratch_dir
from broker_jobs.testing.throwaway import Throwaway

T = TypeVar("T")


def _each(nodes: Sequence[RabbitNode], action: Callable[[RabbitNode], T]) -> list[T]:
    """Run ``action`` on every node at once (threads); raise the first failure after
    all of them finished."""
    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = [pool.submit(action, node) for node in nodes]
    errors = [error for future in futures if (error := future.exception()) is not None]
    if errors:
        raise errors[0]
    return [future.result() for future in futures]


@dataclass
class RabbitCluster(Throwaway):
    """Throwaway RabbitMQ nodes clustered together; node 1 is the one others join."""

    base_dir: Path
    nodes: list[RabbitNode]
    #: Seconds the last :meth:`start` took (boot, joins and the wait), for reports.
    started_in: float | None = field(default=None, init=False)

    @classmethod
    def create(
        cls, base_dir: Path | None = None, size: int = 3, *, root: Path | str | None = None
    ) -> RabbitCluster:
        """Pick ports, names and one cookie for ``size`` nodes; starts nothing.
        ``root``: another root's RabbitMQ (:class:`RabbitNode`); ``base_dir`` must then
        lie inside it (default: a new directory in its ``/tmp``)."""
        if size < 1:
            raise ValueError(f"a cluster needs at least one node, not {size}")
        base = Path(base_dir) if base_dir else scratch_dir("bjtest-cluster-", root)
        cookie = secrets.token_hex(16).upper()
        epmd = free_port() if root else None  # one epmd: the nodes find each other there
        nodes = [
            RabbitNode.create(
                base / f"node{n}", cookie=cookie, prefix=f"bjcluster{n}", root=root, epmd_port=epmd
            )
            for n in range(1, size + 1)
        ]
        return cls(base_dir=base, nodes=nodes)

    @staticmethod
    def available(root: Path | str | None = None) -> bool:
        """Is a lib-dir rabbitmq-server installed (under ``root``)? Lets tests skip
        instead of fail."""
        return RabbitNode.available(root)

    @property
    def urls(self) -> list[str]:
        """Each node's AMQP URL (guest/guest), in node order."""
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """All nodes' URLs as one comma-separated string (what ``BrokerURLs`` parses)."""
        return ",".join(self.urls)

    @property
    def nodenames(self) -> list[str]:
        return [node.nodename for node in self.nodes]

    def node(self, nodename: str) -> RabbitNode:
        """The node of that Erlang name (e.g. a quorum queue's leader)."""
        for node in self.nodes:
            if node.nodename == nodename:
                return node
        raise KeyError(nodename)

    # -- asking the cluster ------------------------------------------------------------

    def _ctl_json(self, *args: str, via: RabbitNode | None = None, timeout: float = 30.0) -> Any:
        """``rabbitmqctl <args> --formatter json`` on ``via`` or on the first running node."""
        candidates = [via] if via else [node for node in self.nodes if node.running]
        error: RabbitNodeError | None = None
        for node in candidates:
            try:
                return json.loads(node.ctl(*args, "--formatter", "json", timeout=timeout))
            except (RabbitNodeError, ValueError) as exc:
                error = RabbitNodeError(f"{node.nodename}: rabbitmqctl {' '.join(args)}: {exc}")
        raise error or RabbitNodeError("no node of the cluster is running")

    def status(self, via: RabbitNode | None = None) -> dict[str, Any]:
        """``rabbitmqctl cluster_status`` as JSON (keys ``running_nodes``, ``disk_nodes``,
        ``partitions``...), asked of ``via`` or of the first running node."""
        status: dict[str, Any] = self._ctl_json("cluster_status", via=via)
        return status

    def running_nodenames(self, via: RabbitNode | None = None) -> set[str]:
        """The nodes ``cluster_status`` reports running."""
        return set(self.status(via).get("running_nodes", []))

    def members(self, via: RabbitNode | None = None) -> set[str]:
        """The nodes that belong to the cluster, running or not."""
        return set(self.status(via).get("disk_nodes", []))

    def queue_members(self, queue: str, vhost: str = "/") -> list[str]:
        """Member nodes of a quorum queue (``rabbitmqctl list_queues members``)."""
        return self._queue_info(queue, vhost, "members")

    def queue_online(self, queue: str, vhost: str = "/") -> list[str]:
        """Members of a quorum queue whose Raft member runs (``online``)."""
        return self._queue_info(queue, vhost, "online")

    def queue_leader(self, queue: str, vhost: str = "/") -> str:
        """The node that leads a quorum queue."""
        leader: str = self._queue_row(queue, vhost)["leader"]
        return leader

    def _queue_info(self, queue: str, vhost: str, key: str) -> list[str]:
        return list(self._queue_row(queue, vhost)[key])

    def _queue_row(self, queue: str, vhost: str) -> dict[str, Any]:
        rows = self._ctl_json(
            "list_queues", "-p", vhost, "name", "type", "leader", "members", "online"
        )
        for row in rows:
            if row.get("name") == queue:
                return dict(row)
        raise RabbitNodeError(f"no queue {queue!r} in vhost {vhost!r}")

    def wait_running(self, timeout: float = 60.0) -> None:
        """Until every node's ``cluster_status`` shows all nodes running."""
        deadline, want = time.monotonic() + timeout, set(self.nodenames)
        last: object = None
        while True:
            try:
                views = [self.running_nodenames(via=node) for node in self.nodes]
                if all(view == want for view in views):
                    return
                last = views
            except RabbitNodeError as exc:
                last = exc
            if time.monotonic() > deadline:
                raise RabbitNodeError(
                    f"cluster not all running after {timeout}s: want {sorted(want)}, last {last}"
                )
            time.sleep(0.2)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        """Form the cluster, or bring back the nodes that are down; returns once
        ``cluster_status`` shows every node running on every node.

        Nodes that are down boot in parallel (faster here, and a full-cluster restart
        needs it); those not yet members then join node 1 (stop_app, join_cluster,
        start_app: see :meth:`_join`). On failure the nodes this call booted or joined are
        killed, so nothing is left half-started; nodes that were running stay up.
        """
        began, deadline = time.monotonic(), time.monotonic() + timeout
        touched = [node for node in self.nodes if not node.running]
        try:
            _each(touched, lambda node: node.start(timeout=max(10.0, deadline - time.monotonic())))
            seed = self.nodes[0]
            members = self.members(via=seed)
            joining = [node for node in self.nodes[1:] if node.nodename not in members]
            touched += [node for node in joining if node not in touched]
            self._join(joining, seed, deadline)
            self.wait_running(timeout=max(10.0, deadline - time.monotonic()))
        except BaseException:
            self.kill(touched)
            raise
        self.started_in = time.monotonic() - began

    @staticmethod
    def _join(joining: Sequence[RabbitNode], seed: RabbitNode, deadline: float) -> None:
        """stop_app on all of them at once, join_cluster one at a time (each changes the
        cluster's Mnesia schema), start_app at once again (like a full-cluster boot)."""

        def ctl(node: RabbitNode, *args: str) -> str:
            return node.ctl(*args, timeout=max(10.0, deadline - time.monotonic()))

        _each(joining, lambda node: ctl(node, "stop_app"))
        for node in joining:
            ctl(node, "join_cluster", seed.nodename)
        _each(joining, lambda node: ctl(node, "start_app"))

    def stop(self) -> None:
        """Stop every node gracefully, all at once (a node left running would keep the
        others' ports busy, and a later start of this cluster would clash)."""
        _each(self.nodes, lambda node: node.stop())

    def halt(self) -> None:
        """Kill every node: their data is deleted next (see RabbitNode.halt)."""
        self.kill()

    def kill(self, nodes: Sequence[RabbitNode] | None = None) -> None:
        """SIGKILL every node, or those given (best effort: start() cleaning up)."""
        for node in self.nodes if nodes is None else nodes:
            try:
                node.kill()
            except RabbitNodeError:
                continue

    def scratch_dirs(self) -> tuple[Path, ...]:
        return (self.base_dir,)
