"""Beat leader election (:mod:`scheduler.leadership`) against a real broker.

Contenders that are killed or paused run as processes of their own (``CONTENDER``):
each prints one line per event (``LEADER <time>``, ``EMIT <time>``...) and, while it
leads, emits a message every 20 ms on the leadership's channel into a queue of the
test (an ``EMIT`` line gives the time it decided to emit, then that of the confirm).
Tests wait for those lines, never for a sleep. Two proofs of "one leader at a time":
the terms read from the lines do not overlap, and on the broker the emitted messages
of different terms never interleave. Handover times are printed, not asserted (run
with ``-s`` to see them).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import pika
import pika.exceptions
import pytest

from broker_jobs.errors import BrokerConnectionError, ConfigurationError
from broker_jobs.testing.tcp_proxy import TcpProxy
from scheduler.leadership import Leadership
from tests.support import Broker

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parent.parent
#: Seconds to wait for a line that must come (a SIGSTOP handover takes 4-6 s).
PATIENCE = 20.0

CONTENDER = """
import asyncio, contextlib, json, signal, sys, time
import aio_pika
from scheduler.leadership import Leadership

url, namespace, identity, heartbeat, emits = sys.argv[1:]

def say(*words):
    print(*words, flush=True)

async def emit(leadership, decided):
    term = leadership.elected_at.wall.isoformat()
    body = json.dumps({"identity": identity, "term": term, "at": time.time()}).encode()
    try:
        await leadership.channel.default_exchange.publish(
            aio_pika.Message(body), routing_key=emits, timeout=1
        )
    except Exception as error:
        say("EMITFAIL", decided, time.time(), type(error).__name__)
    else:
        say("EMIT", decided, time.time())

async def main():
    leadership = Leadership(
        url, namespace, identity, heartbeat=int(heartbeat),
        on_change=lambda leader: say("LEADER" if leader else "FOLLOWER", time.time()),
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await leadership.start()
    # The connection object, not only the flag: a session lost and replaced between
    # two polls (a busy machine) still shows as DISCONNECTED, then CONNECTED.
    current = None
    while not stop.is_set():
        live = leadership.connection if leadership.connected else None
        if live is not current:
            if current is not None:
                say("DISCONNECTED", time.time())
            if live is not None:
                say("CONNECTED", time.time())
            current = live
        if leadership.is_leader():  # just before each emit, as beat's emitter does
            await emit(leadership, time.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)
    await leadership.stop()
    say("STOPPED", time.time())

asyncio.run(main())
"""


@dataclass(frozen=True)
class Event:
    who: str
    kind: str
    at: float
    rest: tuple[str, ...] = ()


@dataclass
class Contenders:
    """Contender processes, their events in arrival order, and signals sent."""

    url: str
    namespace: str
    emits: str
    logs: Path
    heartbeat: int = 5
    processes: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    _inbox: queue.Queue[Event] = field(default_factory=queue.Queue)
    _readers: list[threading.Thread] = field(default_factory=list)
    _unclaimed: list[Event] = field(default_factory=list)

    def spawn(self, who: str, url: str | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-c", CONTENDER, url or self.url, self.namespace, who]
        command += [str(self.heartbeat), self.emits]
        with (self.logs / f"{who}.stderr").open("w") as stderr:
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self.processes[who] = process
        reader = threading.Thread(target=self._read, args=(who, process), daemon=True)
        reader.start()
        self._readers.append(reader)

    def _read(self, who: str, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                kind, at, *rest = line.split()
                event = Event(who, kind, float(at), tuple(rest))
            except ValueError:  # cut short by a kill -9
                event = Event(who, "GARBLED", time.time(), (line,))
            self._inbox.put(event)
        self._inbox.put(Event(who, "EXIT", time.time()))

    def expect(self, matches: Callable[[Event], bool], what: str) -> Event:
        """The first event not yet expected that ``matches``, waiting for it if need
        be. Every event read is kept in ``events``."""
        for event in self._unclaimed:
            if matches(event):
                self._unclaimed.remove(event)
                return event
        deadline = time.monotonic() + PATIENCE
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                event = self._inbox.get(timeout=remaining)
            except queue.Empty:
                break
            self.events.append(event)
            if matches(event):
                return event
            self._unclaimed.append(event)
        tails = {who: (self.logs / f"{who}.stderr").read_text()[-1500:] for who in self.processes}
        pytest.fail(f"no {what} within {PATIENCE} s; events: {self.events[-15:]}; {tails}")

    def expect_kind(
        self, kind: str, who: str | None = None, *, not_who: str = "", after: float = 0.0
    ) -> Event:
        def matches(event: Event) -> bool:
            return (
                event.kind == kind
                and who in (None, event.who)
                and event.who != not_who
                and event.at >= after
            )

        return self.expect(matches, f"{kind} from {who or 'anyone'}")

    def settle(self, connected: set[str]) -> str:
        """Wait until ``connected`` are all connected and one of them leads; the leader."""
        waiting = set(connected)
        leader = ""
        while waiting or not leader:
            event = self.expect(lambda e: e.kind in {"CONNECTED", "LEADER"}, "CONNECTED/LEADER")
            waiting.discard(event.who)
            leader = event.who if event.kind == "LEADER" else leader
        return leader

    def last_leader_at(self, who: str) -> float:
        return max(e.at for e in self.events if e.who == who and e.kind == "LEADER")

    def signal(self, who: str, signum: signal.Signals) -> float:
        at = time.time()
        os.kill(self.processes[who].pid, signum)
        self.events.append(Event(who, signum.name, at))
        if signum is signal.SIGKILL:
            self.processes[who].wait()
        return at

    def close(self) -> None:
        # Followers first, the leader last: a leader killed first hands over to a
        # follower within milliseconds, and the test's list of leaders would miss the
        # term it starts while the others are being killed.
        alive = [who for who, process in self.processes.items() if process.poll() is None]
        leading = [e.who for e in self.events if e.kind == "LEADER" and e.who in alive]
        for who in sorted(alive, key=lambda who: who == (leading[-1] if leading else None)):
            # The kill is the end of a leader's term: its EXIT line is read only
            # after it died, when a follower killed next may already have been
            # elected (seen on RabbitMQ 4.0: a term "ending" 0.1 ms into the next).
            self.events.append(Event(who, "SIGKILL", time.time()))
            self.processes[who].kill()
            self.processes[who].wait()
        for process in self.processes.values():
            process.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        for process in self.processes.values():
            if process.stdout is not None:
                process.stdout.close()
        while not self._inbox.empty():
            self.events.append(self._inbox.get())

    def terms(self) -> list[tuple[str, float, float]]:
        """(who, start, end) of each leadership, from its LEADER line until it stood
        down or was killed, stopped or paused (a paused leader cannot act)."""
        ends = {"FOLLOWER", "SIGKILL", "SIGSTOP", "EXIT", "STOPPED"}
        open_terms: dict[str, float] = {}
        terms = []
        for event in sorted(self.events, key=lambda event: event.at):
            if event.kind == "LEADER":
                open_terms[event.who] = event.at
            elif event.kind in ends and event.who in open_terms:
                terms.append((event.who, open_terms.pop(event.who), event.at))
        terms += [(who, start, float("inf")) for who, start in open_terms.items()]
        return sorted(terms, key=lambda term: term[1])

    def assert_one_leader_at_a_time(self) -> None:
        terms = self.terms()
        for (who, _, end), (successor, start, _) in itertools.pairwise(terms):
            assert end <= start, f"{who} led until {end}, {successor} from {start}: {terms}"


def emitted_terms(connection: pika.BlockingConnection, emits: str) -> list[tuple[str, str]]:
    """The emitted messages' (identity, term) in broker order, runs collapsed."""
    channel = connection.channel()
    runs: list[tuple[str, str]] = []
    while True:
        method, _, body = channel.basic_get(emits, auto_ack=True)
        if method is None:
            return runs
        message = json.loads(body)
        term = (message["identity"], message["term"])
        if not runs or runs[-1] != term:
            runs.append(term)


def assert_terms_never_interleave(runs: list[tuple[str, str]]) -> None:
    """Once a term's messages stop, that term never emits again, and terms follow
    one another in the order they began: no two leaders emitted at once."""
    assert len(runs) == len(set(runs)), f"two terms interleaved on the broker: {runs}"
    starts = [datetime.fromisoformat(term) for _, term in runs]
    assert starts == sorted(starts), runs


@pytest.fixture
def leader_objects(namespace: str, connection: pika.BlockingConnection) -> Iterator[str]:
    """Declare ``<ns>.emits`` (where contenders emit); delete it and the election's
    queue and exchange afterwards. Yields the emits queue's name."""
    emits = f"{namespace}.emits"
    connection.channel().queue_declare(emits, durable=True)  # RabbitMQ 4 frowns on transient
    yield emits
    for delete in (
        lambda channel: channel.queue_delete(emits),
        lambda channel: channel.queue_delete(f"{namespace}.beat.leader"),
        lambda channel: channel.exchange_delete(f"{namespace}.beat.leader"),
    ):
        with contextlib.suppress(pika.exceptions.AMQPError):
            delete(connection.channel())


@pytest.fixture
def contenders(
    broker: Broker, namespace: str, leader_objects: str, tmp_path: Path
) -> Iterator[Contenders]:
    group = Contenders(broker.url, namespace, leader_objects, tmp_path)
    try:
        yield group
    finally:
        group.close()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


# -- processes: kill -9, graceful stop, SIGSTOP --------------------------------------


@pytest.mark.also_on_rabbitmq_4
def test_kill_9_of_the_leader_hands_over_to_one_other_contender(
    contenders: Contenders, connection: pika.BlockingConnection, leader_objects: str
) -> None:
    for who in ("a", "b", "c"):
        contenders.spawn(who)
    leader = contenders.settle({"a", "b", "c"})
    leaders = [leader]
    handovers = []
    for spare in ("d", "e", "f"):
        contenders.expect_kind("EMIT", leader, after=contenders.last_leader_at(leader))
        killed_at = contenders.signal(leader, signal.SIGKILL)
        elected = contenders.expect_kind("LEADER", not_who=leader, after=killed_at)
        handovers.append(elected.at - killed_at)
        leader = elected.who
        leaders.append(leader)
        contenders.spawn(spare)  # three contenders again
        contenders.expect_kind("CONNECTED", spare)
    contenders.expect_kind("EMIT", leader, after=contenders.last_leader_at(leader))
    print(f"\nkill -9 handovers: {', '.join(ms(seconds) for seconds in handovers)}")

    contenders.close()
    contenders.assert_one_leader_at_a_time()
    runs = emitted_terms(connection, leader_objects)
    assert_terms_never_interleave(runs)
    assert [who for who, _ in runs] == leaders


@pytest.mark.also_on_rabbitmq_4
def test_a_leader_that_stops_stands_down_before_the_next_one_leads(
    contenders: Contenders, connection: pika.BlockingConnection, leader_objects: str
) -> None:
    contenders.spawn("a")
    contenders.spawn("b")
    leader = contenders.settle({"a", "b"})
    contenders.expect_kind("EMIT", leader)
    asked_at = contenders.signal(leader, signal.SIGTERM)
    stood_down = contenders.expect_kind("FOLLOWER", leader, after=asked_at)
    elected = contenders.expect_kind("LEADER", not_who=leader, after=asked_at)
    contenders.expect_kind("STOPPED", leader)
    contenders.expect_kind("EMIT", elected.who, after=elected.at)
    print(
        f"\ngraceful stop: next leader {ms(elected.at - stood_down.at)} after the old one"
        f" stood down ({ms(elected.at - asked_at)} after SIGTERM)"
    )

    assert stood_down.at < elected.at
    contenders.close()
    contenders.assert_one_leader_at_a_time()
    runs = emitted_terms(connection, leader_objects)
    assert_terms_never_interleave(runs)
    assert [who for who, _ in runs] == [leader, elected.who]


@pytest.mark.also_on_rabbitmq_4
def test_a_paused_leader_is_replaced_and_stands_down_when_it_resumes(
    contenders: Contenders, connection: pika.BlockingConnection, leader_objects: str
) -> None:
    contenders.heartbeat = 2
    contenders.spawn("a")
    contenders.spawn("b")
    paused = contenders.settle({"a", "b"})
    contenders.expect_kind("EMIT", paused)
    stopped_at = contenders.signal(paused, signal.SIGSTOP)
    elected = contenders.expect_kind("LEADER", not_who=paused, after=stopped_at)
    successor = elected.who
    contenders.expect_kind("EMIT", successor, after=elected.at)
    resumed_at = contenders.signal(paused, signal.SIGCONT)
    stood_down = contenders.expect_kind("FOLLOWER", paused, after=resumed_at)
    contenders.expect_kind("DISCONNECTED", paused, after=resumed_at)
    rejoined = contenders.expect_kind("CONNECTED", paused, after=resumed_at)
    # Not one emit decided after the pause (an emit decided before it may end after).
    after_resume = [e for e in contenders.events if e.who == paused and e.at >= resumed_at]
    assert not [e for e in after_resume if e.kind in {"LEADER", "EMIT", "EMITFAIL"}]

    # Re-joined as a follower: it takes over when the successor dies.
    killed_at = contenders.signal(successor, signal.SIGKILL)
    again = contenders.expect_kind("LEADER", paused, after=killed_at)
    contenders.expect_kind("EMIT", paused, after=again.at)
    print(
        f"\nSIGSTOP (heartbeat 2 s): next leader {ms(elected.at - stopped_at)} after the"
        f" pause; the resumed one stood down {ms(stood_down.at - resumed_at)} after SIGCONT"
        f" and re-joined {ms(rejoined.at - resumed_at)} after it; kill -9 of the successor"
        f" -> it leads again {ms(again.at - killed_at)} later"
    )

    contenders.close()
    contenders.assert_one_leader_at_a_time()
    runs = emitted_terms(connection, leader_objects)
    assert_terms_never_interleave(runs)
    assert [who for who, _ in runs] == [paused, successor, paused]


def test_a_leader_cut_off_by_the_network_stands_down_before_another_is_elected(
    contenders: Contenders, connection: pika.BlockingConnection, leader_objects: str
) -> None:
    """The lease at work: the cut-off leader runs on, but with no renewal confirmed
    it stands down after one heartbeat, while the broker hands over after two or
    three (aiormq alone notices the silence after 3 x (heartbeat + 1) s)."""
    contenders.heartbeat = 2
    partition = TcpProxy(contenders.url).start()
    try:
        contenders.spawn("a", partition.url)
        contenders.expect_kind("LEADER", "a")
        contenders.spawn("b")
        contenders.expect_kind("CONNECTED", "b")
        contenders.expect_kind("EMIT", "a")
        cut_at = time.time()
        partition.cut()
        stood_down = contenders.expect_kind("FOLLOWER", "a", after=cut_at)
        elected = contenders.expect_kind("LEADER", "b", after=cut_at)
        contenders.expect_kind("EMIT", "b", after=elected.at)
        print(
            f"\npartition (heartbeat 2 s): the cut-off leader stood down"
            f" {ms(stood_down.at - cut_at)} after the cut, the next one led"
            f" {ms(elected.at - cut_at)} after it"
        )
        assert stood_down.at < elected.at
        contenders.close()
    finally:
        partition.stop()
    contenders.assert_one_leader_at_a_time()
    runs = emitted_terms(connection, leader_objects)
    assert_terms_never_interleave(runs)
    assert [who for who, _ in runs] == ["a", "b"]


# -- in-process: tokens, queue, configuration ----------------------------------------


async def first_leader(beats: list[Leadership]) -> Leadership:
    waits = {asyncio.ensure_future(beat.wait_until_leader(PATIENCE)): beat for beat in beats}
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for waiting in pending:
        waiting.cancel()
    winner = next(iter(done))
    assert winner.result(), "no leader"
    return waits[winner]


async def ready_count(channel: aio_pika.abc.AbstractChannel, name: str) -> int:
    declared = await channel.declare_queue(name, passive=True)
    return declared.declaration_result.message_count or 0


@pytest.mark.also_on_rabbitmq_4
def test_token_refresh_keeps_one_token_held_and_the_queue_empty(
    broker: Broker, namespace: str, leader_objects: str
) -> None:
    async def scenario() -> tuple[int, int, int]:
        beats = [
            Leadership(broker.url, namespace, f"beat-{n}", heartbeat=2, refresh_every=0.5)
            for n in range(3)
        ]
        probe = await aio_pika.connect(broker.url)
        try:
            for beat in beats:
                await beat.start()
            await first_leader(beats)
            channel = await probe.channel()
            most_ready = 0
            while sum(beat.stats.acked for beat in beats) < 20:  # ~5 s of refreshes
                assert sum(beat.is_leader() for beat in beats) == 1
                assert sum(beat.stats.holds_token for beat in beats) == 1
                most_ready = max(most_ready, await ready_count(channel, beats[0].queue))
                await asyncio.sleep(0.05)  # sampling, not synchronisation
            for beat in beats:
                await beat.stop()
            # The stopped leader's token comes back; so may token publishes that the
            # stops interrupted after the broker took them.
            deadline = time.monotonic() + 5
            while (left := await ready_count(channel, beats[0].queue)) < 1:
                assert time.monotonic() < deadline, "the held token did not come back"
                await asyncio.sleep(0.02)
            return most_ready, left, sum(beat.stats.published for beat in beats)
        finally:
            for beat in beats:
                await beat.stop()
            await probe.close()

    most_ready, left, published = asyncio.run(scenario())
    print(f"\n{published} tokens published; at most {most_ready} ready; {left} left after stop")
    assert published >= 20
    assert most_ready <= 3  # one publish in flight per beat at most
    assert left <= 1 + 3


@pytest.mark.also_on_rabbitmq_4
def test_the_queue_is_a_durable_quorum_queue_with_single_active_consumer(
    broker: Broker, namespace: str, leader_objects: str, connection: pika.BlockingConnection
) -> None:
    async def lead_once() -> str:
        async with Leadership(broker.url, namespace, "beat-0") as beat:
            assert await beat.wait_until_leader(PATIENCE)
            return beat.queue

    name = asyncio.run(lead_once())
    assert name == f"{namespace}.beat.leader"
    arguments = {"x-queue-type": "quorum", "x-single-active-consumer": True}
    connection.channel().queue_declare(name, passive=True)
    connection.channel().queue_declare(name, durable=True, arguments=arguments)  # equal: ok
    connection.channel().exchange_declare(name, "fanout", durable=True)
    for different in (
        {"x-queue-type": "quorum"},
        {"x-queue-type": "classic", "x-single-active-consumer": True},
    ):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="PRECONDITION_FAILED"):
            connection.channel().queue_declare(name, durable=True, arguments=different)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="RESOURCE_LOCKED"):
        connection.channel().basic_get(name)  # SAC quorum queue: no basic.get


@pytest.mark.also_on_rabbitmq_4
def test_a_deleted_queue_costs_the_leadership_until_it_is_declared_again(
    broker: Broker, namespace: str, leader_objects: str
) -> None:
    changes: list[bool] = []

    async def scenario() -> None:
        lost = asyncio.Event()

        def on_change(leader: bool) -> None:
            changes.append(leader)
            if not leader:
                lost.set()

        async with Leadership(broker.url, namespace, "beat-0", on_change=on_change) as beat:
            assert await beat.wait_until_leader(PATIENCE)
            channel = await beat.connection.channel()
            await channel.queue_delete(beat.queue)
            await channel.close()
            await asyncio.wait_for(lost.wait(), PATIENCE)  # the broker cancelled the consumer
            assert not beat.is_leader()
            assert await beat.wait_until_leader(PATIENCE)

    asyncio.run(scenario())
    assert changes == [True, False, True, False]


def test_a_stalled_event_loop_stands_down_at_once_and_rejoins(
    broker: Broker, namespace: str, leader_objects: str
) -> None:
    changes: list[bool] = []

    async def scenario() -> None:
        async with Leadership(
            broker.url, namespace, "beat-0", heartbeat=2, on_change=changes.append
        ) as beat:
            assert await beat.wait_until_leader(PATIENCE)
            elected = beat.elected_at
            time.sleep(1.2)  # blocks the loop longer than heartbeat / 2
            assert not beat.is_leader()
            assert changes == [True, False]
            assert await beat.wait_until_leader(PATIENCE)
            assert beat.elected_at != elected

    asyncio.run(scenario())


def test_an_emitter_error_closes_its_channel_not_the_leadership(
    broker: Broker, namespace: str, leader_objects: str
) -> None:
    async def scenario() -> None:
        async with Leadership(broker.url, namespace, "beat-0", heartbeat=2) as beat:
            assert await beat.wait_until_leader(PATIENCE)
            broken = beat.channel
            with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
                await broken.get_exchange(f"{namespace}.missing", ensure=True)
            assert beat.is_leader()
            with pytest.raises(BrokerConnectionError, match="reopening"):
                _ = beat.channel
            while True:  # the session loop opens another at once
                with contextlib.suppress(BrokerConnectionError):
                    if beat.channel is not broken:
                        break
                await asyncio.sleep(0.01)
            await beat.channel.default_exchange.publish(
                aio_pika.Message(b"x"), routing_key=leader_objects
            )
            assert beat.is_leader()
            assert beat.stats.elections == 1

    asyncio.run(scenario())


def test_a_forced_leader_leads_beside_the_elected_one_without_a_token(
    broker: Broker, namespace: str, leader_objects: str
) -> None:
    async def scenario() -> None:
        async with (
            Leadership(broker.url, namespace, "forced", force_leader=True) as forced,
            Leadership(broker.url, namespace, "elected") as elected,
        ):
            assert await forced.wait_until_leader(PATIENCE)
            assert await elected.wait_until_leader(PATIENCE)
            assert forced.is_leader()
            assert not forced.stats.holds_token
            assert forced.stats.published == 0
        assert not forced.is_leader()

    asyncio.run(scenario())


# -- no broker, bad settings ---------------------------------------------------------


def test_an_unreachable_broker_is_retried_quietly_with_the_password_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free, and nothing listens on it
    url = f"amqp://guest:sup3rsecret@127.0.0.1:{port}/"

    async def scenario() -> None:
        beat = Leadership(url, "tnobroker", "beat-0")
        await beat.start()
        assert not await beat.wait_until_leader(1.0)
        assert not beat.connected
        with pytest.raises(BrokerConnectionError, match=r"guest:\*\*\*@"):
            _ = beat.channel
        await beat.stop()

    with caplog.at_level(logging.WARNING, logger="scheduler.leadership"):
        asyncio.run(scenario())
    assert "retrying in" in caplog.text
    assert "guest:***@" in caplog.text
    assert "sup3rsecret" not in caplog.text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"namespace": "bad.name"}, "invalid namespace"),
        ({"identity": ""}, "identity"),
        ({"heartbeat": 0}, "heartbeat"),
        ({"heartbeat": 1.5}, "heartbeat"),
        ({"refresh_every": 0}, "refresh_every"),
        ({"url": "http://localhost/"}, "unsupported broker URL"),
    ],
)
def test_bad_settings_are_refused_with_our_error(options: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {
        "url": "amqp://guest:guest@localhost/",
        "namespace": "jobs",
        "identity": "beat-0",
        **options,
    }
    with pytest.raises(ConfigurationError, match=message):
        Leadership(**arguments)  # type: ignore[arg-type]
