"""``status``'s question to the broker: does it take publishes now? (The answer under
a memory alarm is tested in tests/test_faults.py.)"""

from __future__ import annotations

from collections.abc import Callable

from broker_jobs.ops.publishing_check import Publishing, check_publishing
from tests.support import Broker
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
