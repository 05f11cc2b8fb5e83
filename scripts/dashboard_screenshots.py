"""Screenshots of the dashboard's main pages, for docs/dashboard.md.

Sets up demo data (a broker: ``--url`` or ``$BROKER_JOBS_URL``, else a throwaway
RabbitMQ node from the installed ``rabbitmq-server``; a temporary SQLite ledger): jobs
published to two tasks and run by a worker (most succeed, some after a retry, a few
fail for good and are dead-lettered, one with a retry still due), a few left queued
and one scheduled; then serves the dashboard (uvicorn, in-process, actions allowed)
and takes PNG screenshots with headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium) into ``docs/images/dashboard-*.png``.

    .venv/bin/python scripts/dashboard_screenshots.py
    .venv/bin/python scripts/dashboard_screenshots.py --url amqp://guest:guest@localhost/
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402

from bench.dashboard import serving  # noqa: E402
from broker_jobs import App, Job, JobRequest, Publisher, mask_url  # noqa: E402
from broker_jobs.dashboard import DashboardSettings, create_app  # noqa: E402
from broker_jobs.observe.heartbeat import process_record  # noqa: E402
from broker_jobs.retry import PermanentError, RetryPolicy  # noqa: E402
from broker_jobs.store.base import Status  # noqa: E402
from broker_jobs.store.processes import ProcessKind, ProcessRecord, RunningJob  # noqa: E402
from broker_jobs.store.sqlite import SQLiteStore  # noqa: E402
from broker_jobs.testing.rabbit_node import RabbitNode  # noqa: E402
from broker_jobs.urls import BrokerURLs  # noqa: E402
from broker_jobs.worker import Worker, WorkerSettings  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
OUT = ROOT / "docs" / "images"
SIZE = (1280, 860)


class Email(BaseModel):
    to: str
    subject: str
    fail_times: int = 0


class Resize(BaseModel):
    url: str
    width: int


class Flaky:
    """Fails a job's first ``fail_times`` runs (then it succeeds)."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    def send(self, payload: Email) -> None:
        done = self.runs.get(payload.to, 0)
        self.runs[payload.to] = done + 1
        if done < payload.fail_times:
            raise ConnectionError(
                f"SMTP server smtp.example.com:587 not answering (run {done + 1})"
            )


def resize(payload: Resize) -> None:
    if payload.width <= 0:
        raise PermanentError(f"width must be positive, got {payload.width}")


def demo_app() -> App:
    app = App(namespace=f"shots{uuid.uuid4().hex[:6]}")
    flaky = Flaky()
    fast = RetryPolicy(max_attempts=3, base_delay=0.2, max_delay=0.5)
    app.task("email.send", retry=fast)(flaky.send)
    app.task("image.resize", retry=RetryPolicy(max_attempts=1))(resize)
    return app


def fill(url: str, app: App, store: SQLiteStore) -> None:
    """Jobs of every kind: run by a burst worker, then some left waiting."""
    run = [
        *(JobRequest("email.send", {"to": f"user{i}@example.com", "subject": "Welcome"})
          for i in range(14)),
        JobRequest("email.send", {"to": "flaky@example.com", "subject": "Receipt",
                                  "fail_times": 1}),
        JobRequest("email.send", {"to": "down@example.com", "subject": "Invoice",
                                  "fail_times": 9}),
        *(JobRequest("image.resize", {"url": f"https://cdn.example.com/p/{i}.png",
                                      "width": 320}) for i in range(9)),
        JobRequest("image.resize", {"url": "https://cdn.example.com/p/broken.png",
                                    "width": 0}),
        JobRequest("image.resize", {"url": "https://cdn.example.com/p/<b>odd</b>.png",
                                    "width": -1}),
    ]  # fmt: skip
    with Publisher(url, app, ledger=store) as publisher:
        publisher.publish_many(run)
    asyncio.run(Worker(url, app, store, WorkerSettings(burst=True)).run())
    waiting = [
        *(JobRequest("email.send", {"to": f"later{i}@example.com", "subject": "Digest"})
          for i in range(4)),
        JobRequest("image.resize", {"url": "https://cdn.example.com/p/new.png", "width": 640}),
        JobRequest("email.send", {"to": "tomorrow@example.com", "subject": "Reminder"},
                   delay=3600),
    ]  # fmt: skip
    with Publisher(url, app, ledger=store) as publisher:
        publisher.publish_many(waiting)
    demo_heartbeats(app, store)
    demo_history(app, store)


def demo_history(app: App, store: SQLiteStore) -> None:
    """A day of executions and of sampled queue depths, as a busy day would leave them:
    a morning rush the workers drain, a handful of failures in the afternoon."""
    now = datetime.now(UTC)
    for hours_ago in range(24, 0, -1):
        at = now - timedelta(hours=hours_ago)
        rush = max(0, 12 - abs(hours_ago - 14)) * 9  # around 14 hours ago
        store.record_depths(app.namespace, {"image.resize": rush * 3, "email.send": 2}, now=at)
        for n in range(rush // 3 + 4):
            key = f"history-{hours_ago}-{n}"
            job = Job(id=f"id-{key}", task="image.resize", idempotency_key=key)
            store.claim(job, "gpu-1:771:9bd2", 60, now=at)
            if hours_ago in (6, 7) and n < 3:
                store.dead(key, "gpu-1:771:9bd2", "TimeoutError: upstream", now=at)
            else:
                store.succeed(key, "gpu-1:771:9bd2", now=at)


def demo_heartbeats(app: App, store: SQLiteStore) -> None:
    """Beside the burst worker's own (stopped): two live workers, one running a job,
    a lost one, a leading beat and an exporter, as their heartbeats would say."""
    now = datetime.now(UTC)
    ns = app.namespace

    def worker(id: str, host: str, task: str) -> ProcessRecord:
        made = process_record(ProcessKind.WORKER, id, ns, tasks=[task], concurrency=8, processes=2)
        return replace(made, host=host, started_at=now - timedelta(hours=3, minutes=12))

    running = RunningJob("4f1c9a", "image.resize", "resize-p-7", 1, now - timedelta(seconds=42))
    records = [
        replace(worker("web-1:2211:a3f9", "web-1", "email.send"), in_flight=0),
        replace(worker("gpu-1:771:9bd2", "gpu-1", "image.resize"), in_flight=1, running=(running,)),
        replace(worker("gpu-2:802:11ce", "gpu-2", "image.resize"),
                seen_at=now - timedelta(minutes=4)),
        replace(process_record(ProcessKind.BEAT, "ops-1:90:beat", ns), role="leading"),
        process_record(ProcessKind.EXPORTER, "ops-1:91:exporter", ns, every=15.0),
    ]  # fmt: skip
    for record in records:
        store.record_process(record)


@contextlib.contextmanager
def broker(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    if not RabbitNode.available():
        raise SystemExit("no --url, no $BROKER_JOBS_URL and no local rabbitmq-server")
    node = RabbitNode.create()
    try:
        node.start()
        yield node.url
    finally:
        node.cleanup()


def chromium() -> Any:
    from selenium import webdriver  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        f"--window-size={SIZE[0]},{SIZE[1]}",
        "--hide-scrollbars",
    ):
        options.add_argument(argument)  # fmt: skip
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def shoot(driver: Any, base: str, pages: dict[str, str], out: Path) -> list[Path]:
    from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415

    taken = []
    for name, path in pages.items():
        driver.get(base + path)
        WebDriverWait(driver, 15).until(
            lambda d: d.execute_script("return document.readyState") == "complete"
        )
        # Tracebacks name files by where this checkout lies: shown relative to it, so
        # the pictures in the repo hold no path of the machine they were taken on.
        driver.execute_script(
            "for (const el of document.querySelectorAll('pre')) {"
            " el.textContent = el.textContent.split(arguments[0]).join(''); }",
            f"{ROOT}/",
        )
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(SIZE[0], max(SIZE[1], min(int(height) + 40, 2400)))
        target = out / f"dashboard-{name}.png"
        driver.save_screenshot(str(target))
        driver.set_window_size(*SIZE)
        taken.append(target)
        print(f"  {target.relative_to(ROOT)}  ({path})")
    return taken


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("BROKER_JOBS_URL"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with broker(args.url) as url, tempfile.TemporaryDirectory() as work:
        print(f"broker {mask_url(url)}; demo data in a temporary SQLite ledger")
        app = demo_app()
        with SQLiteStore(Path(work) / "ledger.db") as store:
            fill(url, app, store)
            dead = store.find(status=Status.DEAD, task="image.resize", limit=1)
            ref = dead[0].idempotency_key if dead else ""
            settings = DashboardSettings(
                store=store,
                urls=BrokerURLs.parse(url),
                names=app.names,
                tasks=("email.send", "image.resize"),
                app=app,
                allow_actions=True,
            )
            pages = {
                "overview": "/",
                "task": "/tasks/email.send",
                "jobs": "/jobs",
                "job": f"/jobs/{ref}",
                "dead-letters": "/dead-letters",
                "workers": "/workers",
                "history": "/history",
            }
            driver = chromium()
            try:
                with serving(create_app(settings)) as base:
                    shoot(driver, base, pages, args.out)
            finally:
                driver.quit()
                with contextlib.suppress(Exception):
                    delete_topology(url, app)
    return 0


def delete_topology(url: str, app: App) -> None:
    import pika  # noqa: PLC0415

    topology = app.topology()
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as conn:
        channel = conn.channel()
        for queue in topology.queues:
            channel.queue_delete(queue.name)
        for exchange in topology.exchanges:
            channel.exchange_delete(exchange.name)


if __name__ == "__main__":
    sys.exit(main())
