"""The app of the beat tests; beat subprocesses load it as ``tests.beat_app:app``
with their namespace in ``BROKER_JOBS_TEST_NAMESPACE``."""

from __future__ import annotations

import os
from collections.abc import Callable

from pydantic import BaseModel

from broker_jobs import App

TASK = "beat.tick"


class Tick(BaseModel):
    label: str = "tick"


def build_app(namespace: str, on_tick: Callable[[Tick], None] | None = None) -> App:
    app = App(namespace=namespace)

    @app.task(TASK)
    def tick(payload: Tick) -> None:
        if on_tick is not None:
            on_tick(payload)

    return app


app = build_app(os.environ.get("BROKER_JOBS_TEST_NAMESPACE", "beat-test"))
