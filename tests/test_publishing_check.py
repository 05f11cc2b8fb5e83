"""``status``'s question to the broker: does it take publishes now? (The answer under
a memory alarm is tested in tests/test_faults.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from broker_jobs.ops.publishing_check import Publishing, PublishingWatch, check_publishing
from tests.support import Broker, wait_until
from tests.test_topology_command import user, with_credentials

__all__ = ["user"]  # the fixture, used below by name


def test_a_broker_that_takes_publishes_says_so(broker: Broker) -> None:
    assert check_publishing(broker.url) == Publishing(accepted=True)


def test_a_user_who_may_not_publish_gets_not_known_not_an_error(
    broker: Broker, user: Callable[[], tuple[str, str]]
) -> None:
    name, password = user()
    broker.controllable().ctl("set_permissions", "-p", "/", name, "^$", "^$", ".*")
    found = check_publishing(with_credentials(broker.url, name, password))
    assert found.accepted is None
    assert found.why is not None
    assert "write on amq.default" in found.why


def test_a_watch_whose_connection_the_broker_closed_asks_again_on_a_new_one(
    broker: Broker,
) -> None:
    """The exporter's watch keeps its connection between polls; one closed meanwhile
    (missed heartbeats over a long --interval, an operator's close) is opened anew at
    the next check, not reported as "not known"."""
    name = f"test watch {uuid.uuid4().hex[:8]}"
    watch = PublishingWatch(broker.url, connection_name=name)
    try:
        assert watch.check() == Publishing(accepted=True)
        node = broker.controllable()
        rows = node.ctl("list_connections", "-q", "pid", "client_properties").splitlines()
        [pid] = [row.split("\t")[0] for row in rows if name in row]  # its connection_name
        node.ctl("close_connection", pid, "closed by the test")
        # The broker closes it and waits for the client's close-ok, which the idle
        # watch gives at its next check.
        wait_until(
            lambda: not any(row.endswith("running") for row in _connections(name, broker)),
            within=10,
            what="the broker closing the connection",
        )
        assert watch.check() == Publishing(accepted=True)
    finally:
        watch.close()


def _connections(name: str, broker: Broker) -> list[str]:
    """The rows (client properties, state) of the connections named ``name``."""
    rows = broker.controllable().ctl("list_connections", "-q", "client_properties", "state")
    return [row for row in rows.splitlines() if name in row]
