"""The compose deployment's example publisher: one job of the demo app every few seconds.

    python compose/publisher.py --every 5 [--count N]

It publishes with the ledger (so ``broker-jobs jobs list`` knows each job before a
worker claims it) a mix of the demo's jobs (examples/demo/tasks.py), so that the
metrics and alerts have something to show: mostly jobs that succeed, every 5th an
email that fails once and is retried, every 20th a resize with ``width 0``, which
fails permanently and is dead-lettered (with a job every 5 s, one dead letter every
100 s: BrokerJobsDeadLetters fires after about 80 minutes, at 50).

The broker and the ledger are ``$BROKER_JOBS_URL`` and ``$BROKER_JOBS_STORE``, as for
the CLI. A failed publish (the broker restarting) is logged and the next one tried.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import uuid

log = logging.getLogger("compose.publisher")

APP_PATH = "examples.demo.tasks:app"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Publish one job of the demo app every few seconds (the compose example)."
    )
    parser.add_argument("--every", type=float, default=5.0, help="seconds between jobs (default 5)")
    parser.add_argument(
        "--count", type=int, default=0, help="stop after this many jobs (default 0: never)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    # Imported after parsing, so --help answers without a broker or the app. load_app
    # imports the app from the current directory (the image's /app), like the CLI.
    from broker_jobs import Publisher  # noqa: PLC0415
    from broker_jobs.app_loader import load_app  # noqa: PLC0415
    from broker_jobs.store import open_store  # noqa: PLC0415

    app = load_app(APP_PATH)
    from examples.demo.tasks import Email, Resize  # noqa: PLC0415

    url = os.environ.get("BROKER_JOBS_URL", "amqp://guest:guest@localhost:5672/")
    store_url = os.environ.get("BROKER_JOBS_STORE", "sqlite:///broker-jobs.db")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    with (
        open_store(store_url) as ledger,
        Publisher(url, app, ledger=ledger, connection_name="compose publisher") as publisher,
    ):
        number = 0
        while not stop.is_set() and (args.count == 0 or number < args.count):
            number += 1
            try:
                if number % 20 == 0:
                    job = publisher.publish(
                        "image.resize", Resize(url=f"https://example.com/{number}.png", width=0)
                    )
                elif number % 5 == 0:
                    job = publisher.publish(
                        "email.send",
                        Email(
                            to=f"user{number}@example.com",
                            subject="Flaky",
                            fail_times=1,
                            attempt_key=str(uuid.uuid4()),
                        ),
                    )
                elif number % 2 == 0:
                    job = publisher.publish(
                        "image.resize", Resize(url=f"https://example.com/{number}.png", width=128)
                    )
                else:
                    job = publisher.publish(
                        "email.send", Email(to=f"user{number}@example.com", subject="Hello")
                    )
                log.info("published %s job %s", job.task, job.id)
            except Exception as error:  # the broker restarting: log, try the next one
                log.warning("publish failed: %s: %s", type(error).__name__, error)
            stop.wait(args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
