"""The public surface is what ``__all__`` says, and every name in it exists."""

from __future__ import annotations

import importlib
import sys

import pytest

import broker_jobs
import topology


def test_all_names_exist_and_nothing_public_is_unlisted() -> None:
    for module in (broker_jobs, topology):
        assert all(hasattr(module, name) for name in module.__all__)
        exported = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and not isinstance(value, type(broker_jobs))
        }
        assert exported - {"annotations"} <= set(module.__all__) | {"__version__"}


def test_every_error_derives_from_the_root() -> None:
    errors = [
        getattr(broker_jobs, name)
        for name in broker_jobs.__all__
        if name.endswith("Error") and isinstance(getattr(broker_jobs, name), type)
    ]
    assert len(errors) >= 10
    assert all(issubclass(error, broker_jobs.BrokerJobsError) for error in errors)


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("broker_jobs.publisher", "broker_jobs.publish.publisher", "Publisher"),
        ("broker_jobs.async_publisher", "broker_jobs.publish.async_publisher", "AsyncPublisher"),
        ("broker_jobs.dead_letter_queue", "broker_jobs.ops.dead_letters", "DeadLetterQueues"),
    ],
)
def test_an_old_module_path_warns_and_gives_the_moved_module(old: str, new: str, name: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_a_nack_says_the_job_was_not_stored_and_names_a_failover_not_a_full_queue() -> None:
    message = str(broker_jobs.NackedError("order.ship", "job-1"))
    assert "not stored" in message
    # A nack is one queue's refusal: a queue an operator bound beside the task's may
    # hold the job (a tester's "not stored" job was in the task's queue).
    assert "another queue bound beside the task's may hold it" in message
    assert "no leader" in message  # the usual cause in a cluster: a failover
    assert "same idempotency key is safe" in message
    assert "may be full" not in message


def test_a_busy_publisher_names_a_silent_network_beside_a_broker_alarm() -> None:
    """Threads held behind a publish that waits: a broker alarm, or a network that
    stopped carrying (a tester's black hole read as "a memory or disk alarm")."""
    message = str(broker_jobs.PublisherBusyError("order.ship", "job-1", 10))
    assert "rabbitmq-diagnostics alarms" in message
    assert "the network to it stopped carrying" in message
    assert "Nothing was stored" in message
