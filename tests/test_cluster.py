"""The fault-test infrastructure itself: a 3-node cluster of throwaway RabbitMQ nodes
(:mod:`broker_jobs.testing.rabbit_cluster`) and the TCP proxy that cuts the network
(:mod:`broker_jobs.testing.tcp_proxy`).

Times (cluster forming, failover, a killed node's rejoin) are printed, not asserted:
run with ``-s`` to see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import aio_pika
import pika
import pika.exceptions
import pytest

from broker_jobs.testing.rabbit_cluster import RabbitCluster
from broker_jobs.testing.tcp_proxy import TcpProxy

#: A confirm that takes longer than this failed (2 of 3 nodes down blocks silently).
CONFIRM_TIMEOUT = 10.0


@pytest.fixture
def cluster(rabbit_cluster: RabbitCluster) -> Iterator[RabbitCluster]:
    """The session's cluster; a node a test killed is brought back afterwards, so the
    next test gets all three."""
    yield rabbit_cluster
    if not all(node.running for node in rabbit_cluster.nodes):
        rabbit_cluster.start()


@pytest.fixture
def quorum_queue(cluster: RabbitCluster) -> Iterator[str]:
    """A quorum queue declared through node 1; deleted afterwards through a live node."""
    name = f"t{uuid.uuid4().hex[:10]}.quorum"
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(cluster.urls[0]))) as conn:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    yield name
    for node in cluster.nodes:
        if node.running:
            with contextlib.suppress(pika.exceptions.AMQPError):
                conn = pika.BlockingConnection(pika.URLParameters(node.url))
                with contextlib.closing(conn):
                    conn.channel().queue_delete(name)
                return


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


# -- the cluster ---------------------------------------------------------------------


@pytest.mark.also_on_rabbitmq_4
@pytest.mark.cluster
def test_the_cluster_forms_and_a_quorum_queue_has_a_member_on_each_node(
    cluster: RabbitCluster, quorum_queue: str
) -> None:
    if cluster.started_in is not None:
        print(f"\ncluster formed in {cluster.started_in:.1f} s")
    names = set(cluster.nodenames)
    assert len(names) == 3
    for node in cluster.nodes:
        assert cluster.running_nodenames(via=node) == names
    assert len({port for node in cluster.nodes for port in (node.amqp_port, node.dist_port)}) == 6
    assert set(cluster.queue_members(quorum_queue)) == names
    assert cluster.queue_leader(quorum_queue) in names


@pytest.mark.also_on_rabbitmq_4
@pytest.mark.cluster
def test_a_confirmed_publisher_keeps_working_through_kill_9_of_the_queue_leader(
    cluster: RabbitCluster, quorum_queue: str
) -> None:
    """The publisher is connected to a node that survives; the queue's leader is
    killed between two confirmed publishes. Every message is confirmed, none lost;
    then the killed node boots from its data dir and rejoins by itself."""
    time.sleep(1)  # Ra saves its names every 500 ms (RabbitNode.kill on 3.10): let it
    leader = cluster.node(cluster.queue_leader(quorum_queue))
    via = next(node for node in cluster.nodes if node is not leader)

    async def publish_around_the_kill() -> tuple[int, list[float]]:
        connection = await aio_pika.connect(via.url)
        async with connection:
            channel = await connection.channel()  # publisher confirms on
            confirms: list[float] = []

            async def publish(number: int) -> None:
                began = time.monotonic()
                message = aio_pika.Message(str(number).encode(), delivery_mode=2)
                await asyncio.wait_for(
                    channel.default_exchange.publish(message, routing_key=quorum_queue),
                    CONFIRM_TIMEOUT,
                )
                confirms.append(time.monotonic() - began)

            for number in range(20):
                await publish(number)
            await asyncio.to_thread(leader.kill)
            for number in range(20, 120):
                await publish(number)
            declared = await channel.declare_queue(quorum_queue, passive=True)
            return declared.declaration_result.message_count or 0, confirms[20:]

    count, after_kill = asyncio.run(publish_around_the_kill())
    assert not leader.running
    assert count == 120
    new_leader = cluster.queue_leader(quorum_queue)
    assert new_leader != leader.nodename
    print(
        f"\nkill -9 of the leader: first confirm after it {ms(after_kill[0])},"
        f" worst {ms(max(after_kill))}; new leader {new_leader.split('-')[0]}"
    )

    began = time.monotonic()
    leader.start()
    booted = time.monotonic()
    cluster.wait_running()
    running = time.monotonic()
    while len(cluster.queue_online(quorum_queue)) < 3:
        assert time.monotonic() - running < 60, cluster.queue_online(quorum_queue)
        time.sleep(0.1)
    print(
        f"killed node back: booted {booted - began:.1f} s, running in every cluster_status"
        f" {running - began:.1f} s, queue member online {time.monotonic() - began:.1f} s"
    )
    assert set(cluster.queue_members(quorum_queue)) == set(cluster.nodenames)


# -- the TCP proxy -------------------------------------------------------------------


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    """A TCP server on 127.0.0.1 that sends back whatever it receives."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[:2]
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()


def receive(conn: socket.socket, size: int, within: float = 2.0) -> bytes:
    """Up to ``size`` bytes, whatever came within ``within`` seconds."""
    conn.settimeout(within)
    got = b""
    with contextlib.suppress(TimeoutError):
        while len(got) < size and (chunk := conn.recv(size - len(got))):
            got += chunk
    return got


def test_the_proxy_holds_bytes_while_cut_and_delivers_them_after_the_heal(
    echo_server: tuple[str, int],
) -> None:
    with TcpProxy(echo_server) as proxy, socket.create_connection(proxy.address) as conn:
        conn.sendall(b"before")
        assert receive(conn, 6) == b"before"
        assert proxy.connections == 1

        proxy.cut()
        conn.sendall(b"during")
        assert receive(conn, 6, within=0.5) == b""  # silence, and the socket stays open
        with socket.create_connection(proxy.address) as late:  # accepted, but held
            late.sendall(b"late")
            assert receive(late, 4, within=0.3) == b""

            proxy.heal()
            assert receive(conn, 6) == b"during"  # held, not lost
            assert receive(late, 4) == b"late"
        conn.sendall(b"after")
        assert receive(conn, 5) == b"after"


def test_the_proxy_drop_resets_both_sides_and_keeps_accepting(
    echo_server: tuple[str, int],
) -> None:
    with TcpProxy(echo_server) as proxy:
        conn = socket.create_connection(proxy.address)
        with conn:
            conn.sendall(b"ping")
            assert receive(conn, 4) == b"ping"
            proxy.drop()
            conn.settimeout(2)
            with pytest.raises(ConnectionResetError):
                conn.recv(1)
        assert proxy.connections == 0
        with socket.create_connection(proxy.address) as again:
            again.sendall(b"again")
            assert receive(again, 5) == b"again"


def test_the_proxy_url_keeps_credentials_vhost_and_query() -> None:
    proxy = TcpProxy("amqp://user:pw@broker.example:5673/jobs?heartbeat=2").start()
    try:
        assert proxy.upstream == ("broker.example", 5673)
        assert proxy.url == f"amqp://user:pw@127.0.0.1:{proxy.port}/jobs?heartbeat=2"
    finally:
        proxy.stop()
    assert TcpProxy("amqp://localhost/").upstream == ("localhost", 5672)
