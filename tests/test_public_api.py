"""The public surface is what ``__all__`` says, and every name in it exists."""

from __future__ import annotations

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
