"""The demo's app: two task types with short retry delays, so the demo ends fast.

- ``email.send`` succeeds, unless its payload asks it to fail first: ``fail_times``
  failures (``ConnectionError``, retried by the policy) counted per ``attempt_key``
  in a small file under ``$DEMO_STATE_DIR``, then success. A ``fail_times`` above
  the policy's attempts exhausts the job, which is dead-lettered.
- ``image.resize`` succeeds, or raises ``PermanentError`` for ``width <= 0``: dead at
  once, no retry.

The namespace comes from ``$DEMO_NAMESPACE`` (default ``demo``), so a test can run
the demo next to anything else on a shared broker.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel

from broker_jobs import App, PermanentError, RetryPolicy

log = logging.getLogger("examples.demo")

app = App(namespace=os.environ.get("DEMO_NAMESPACE", "demo"))

#: 4 runs at most, 1 to 2 s apart (with jitter, at least 0.5 s).
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=2.0)


class Email(BaseModel):
    to: str
    subject: str
    #: Fail this many runs (ConnectionError) before succeeding; 0 = never fail.
    fail_times: int = 0
    #: Names the counter of runs for ``fail_times`` (one per job; the job id is fine).
    attempt_key: str = ""


class Resize(BaseModel):
    url: str
    width: int


def state_dir() -> Path:
    """Where flaky jobs count their runs (the demo sets ``$DEMO_STATE_DIR``)."""
    return Path(os.environ.get("DEMO_STATE_DIR") or tempfile.gettempdir())


@app.task("email.send", retry=FAST_RETRY, time_limit=10)
def send_email(payload: Email) -> None:
    if payload.fail_times > 0:
        counter = state_dir() / f"runs-{payload.attempt_key or payload.to}.txt"
        with counter.open("a+") as runs:
            runs.seek(0)
            done = len(runs.readlines())
            runs.write("run\n")
        if done < payload.fail_times:
            raise ConnectionError(
                f"SMTP server not answering (simulated, run {done + 1} of"
                f" {payload.fail_times} failing)"
            )
    log.info("sent %r to %s", payload.subject, payload.to)


@app.task("image.resize", retry=FAST_RETRY, time_limit=10)
def resize_image(payload: Resize) -> None:
    if payload.width <= 0:
        raise PermanentError(f"width must be positive, got {payload.width}")
    log.info("resized %s to width %d", payload.url, payload.width)
