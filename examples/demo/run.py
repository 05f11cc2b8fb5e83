"""The end-to-end demo: ``python -m examples.demo.run`` (or ``./scripts/demo``).

1. A broker: ``$BROKER_JOBS_URL``, or a throwaway RabbitMQ node started from the
   installed ``rabbitmq-server`` (stopped and deleted at the end).
2. ``broker-jobs topology apply`` for the app in :mod:`examples.demo.tasks`.
3. Two worker daemons (``broker-jobs worker``), one per task type, sharing one
   SQLite ledger file.
4. A publisher sends immediate, delayed (``delay`` and ``eta``), failing-then-
   succeeding, exhausted and permanently failing jobs, and two poison messages.
5. Waits (at most ``DEADLINE`` seconds) until the ledger shows every job finished
   and the poison messages reached the dead-letter queues, stops the workers with
   SIGTERM, prints the report and checks every expectation: exit 0 when all hold.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

from broker_jobs import Job, Publisher, encode, mask_url
from broker_jobs.store import open_store
from broker_jobs.store.base import TERMINAL, JobRecord, Status, Store
from broker_jobs.testing.rabbit_node import RabbitNode, RabbitNodeError
from broker_jobs.worker.dead_letters import HEADER_ATTEMPTS, HEADER_ERROR, HEADER_REASON

ROOT = Path(__file__).resolve().parents[2]
APP_PATH = "examples.demo.tasks:app"
TASKS = ("email.send", "image.resize")
#: Seconds to wait for every job to finish before giving up.
DEADLINE = 90.0
#: Seconds the workers get to finish on SIGTERM (they are idle by then).
GRACE = 10.0


def short_id(job_id: str) -> str:
    """The part of a job id that differs between jobs: ids are UUID 7, whose first
    digits are the time (the same for every job made within a minute)."""
    return "…" + job_id[-8:]


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, ``…`` where it was cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def say(text: str = "") -> None:
    print(text, flush=True)


@dataclass
class Expected:
    """A published job and how it should end."""

    label: str
    job: Job
    status: Status
    attempts: int
    dead_reason: str | None = None  # the bj-dead-reason of its dead letter


@dataclass
class Poison:
    """A message the workers cannot decode or validate: dead-lettered with ``reason``."""

    label: str
    task: str
    message_id: str
    reason: str


@dataclass
class DeadLetter:
    task: str
    message_id: str | None
    reason: str
    error: str
    attempts: Any


@dataclass
class Checks:
    results: list[tuple[bool, str]] = field(default_factory=list)

    def check(self, ok: bool, text: str) -> None:
        self.results.append((ok, text))

    @property
    def passed(self) -> bool:
        return all(ok for ok, _ in self.results)


class Demo:
    def __init__(self, url: str, work: Path) -> None:
        from examples.demo.tasks import app  # noqa: PLC0415 - after $DEMO_NAMESPACE is set

        self.app = app
        self.url = url
        self.work = work
        self.db = work / "ledger.db"
        self.store_url = f"sqlite:///{self.db}"  # absolute path: sqlite:////tmp/...
        self.env = {
            **os.environ,
            "BROKER_JOBS_URL": url,
            "DEMO_NAMESPACE": app.namespace,
            "DEMO_STATE_DIR": str(work),
        }
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.expected: list[Expected] = []
        self.poison: list[Poison] = []
        self.dead_letters: list[DeadLetter] = []
        self.dead_baseline: dict[str, int] = {}
        self.worker_summaries: dict[str, str] = {}

    # --- steps --------------------------------------------------------------------

    def apply_topology(self) -> None:
        command = [broker_jobs_command(), "topology", "apply", "--app", APP_PATH]
        result = subprocess.run(
            command, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode != 0:
            raise DemoError(
                f"topology apply exited {result.returncode}:\n{result.stdout}{result.stderr}"
            )
        objects = len(self.app.topology().queues) + len(self.app.topology().exchanges)
        say(
            f"  topology apply: ok ({objects} exchanges and queues in namespace"
            f" {self.app.namespace!r})"
        )
        self.dead_baseline = self.queue_depths(dead=True)

    def start_workers(self) -> None:
        for task in TASKS:
            log = (self.work / f"worker-{task}.log").open("wb")
            self.workers[task] = subprocess.Popen(
                [
                    broker_jobs_command(),
                    "worker",
                    APP_PATH,
                    "--task",
                    task,
                    "--store",
                    self.store_url,
                    "--concurrency",
                    "4",
                    "--grace",
                    str(GRACE),
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            say(f"  worker for {task}: pid {self.workers[task].pid}")

    def publish(self) -> None:
        now = datetime.now(UTC)
        flaky_id, exhausted_id = str(uuid.uuid4()), str(uuid.uuid4())
        with Publisher(self.url, self.app, connection_name="broker-jobs demo") as publisher:

            def expect(
                label: str, status: Status, attempts: int, job: Job, reason: str | None = None
            ) -> None:
                self.expected.append(Expected(label, job, status, attempts, reason))

            from examples.demo.tasks import Email, Resize  # noqa: PLC0415

            email, resize = "email.send", "image.resize"
            expect(
                "immediate",
                Status.SUCCEEDED,
                1,
                publisher.publish(email, Email(to="ada@example.com", subject="Welcome")),
            )
            expect(
                "immediate",
                Status.SUCCEEDED,
                1,
                publisher.publish(
                    email,
                    Email(to="bob@example.com", subject="Your receipt"),
                    idempotency_key="receipt-bob-1",
                ),
            )
            expect(
                "immediate",
                Status.SUCCEEDED,
                1,
                publisher.publish(resize, Resize(url="https://example.com/a.png", width=128)),
            )
            expect(
                "immediate",
                Status.SUCCEEDED,
                1,
                publisher.publish(resize, Resize(url="https://example.com/b.png", width=640)),
            )
            expect(
                "delay=3 s",
                Status.SUCCEEDED,
                1,
                publisher.publish(email, Email(to="cy@example.com", subject="Reminder"), delay=3),
            )
            expect(
                "eta=+5 s",
                Status.SUCCEEDED,
                1,
                publisher.publish(
                    resize,
                    Resize(url="https://example.com/c.png", width=64),
                    eta=now + timedelta(seconds=5),
                ),
            )
            expect(
                "fails twice",
                Status.SUCCEEDED,
                3,
                publisher.publish(
                    email,
                    Email(
                        to="dee@example.com",
                        subject="Flaky SMTP",
                        fail_times=2,
                        attempt_key=flaky_id,
                    ),
                    job_id=flaky_id,
                ),
            )
            expect(
                "always fails",
                Status.DEAD,
                4,
                publisher.publish(
                    email,
                    Email(
                        to="eve@example.com",
                        subject="Never works",
                        fail_times=99,
                        attempt_key=exhausted_id,
                    ),
                    job_id=exhausted_id,
                ),
                "exhausted",
            )
            expect(
                "width=0",
                Status.DEAD,
                1,
                publisher.publish(resize, Resize(url="https://example.com/d.png", width=0)),
                "permanent",
            )
        say(f"  published {len(self.expected)} jobs (confirmed by the broker)")
        self.publish_poison()

    def publish_poison(self) -> None:
        """Raw pika, like a buggy foreign publisher: a body that is not JSON, and a
        well-formed envelope whose payload fails the task's model."""
        names = self.app.names
        not_json = Poison("not JSON", "email.send", str(uuid.uuid4()), "json")
        bad_job = Job(
            task="image.resize", payload={"url": "https://example.com/e.png", "width": "very wide"}
        )
        schema = Poison("bad payload", "image.resize", bad_job.id, "schema")
        wire = encode(bad_job)
        messages = [
            (
                not_json,
                b"<html>this is not JSON</html>",
                pika.BasicProperties(
                    content_type="application/json",
                    message_id=not_json.message_id,
                    type=not_json.task,
                    delivery_mode=2,
                ),
            ),
            (
                schema,
                wire.body,
                pika.BasicProperties(
                    content_type=wire.content_type,
                    message_id=wire.message_id,
                    type=wire.type,
                    headers=dict(wire.headers),
                    timestamp=wire.timestamp,
                    delivery_mode=2,
                ),
            ),
        ]
        with contextlib.closing(self.connection("poison")) as conn:
            channel = conn.channel()
            channel.confirm_delivery()
            for poison, body, properties in messages:
                channel.basic_publish(
                    names.work_exchange,
                    names.routing_key(poison.task),
                    body,
                    properties,
                    mandatory=True,
                )
                self.poison.append(poison)
        say(f"  published {len(self.poison)} poison messages (raw pika)")

    def wait(self, store: Store) -> None:
        deadline = time.monotonic() + DEADLINE
        want_dead = Counter(p.task for p in self.poison)
        want_dead.update(e.job.task for e in self.expected if e.dead_reason)
        while True:
            records = [self.record(store, e.job) for e in self.expected]
            pending = [
                e
                for e, r in zip(self.expected, records, strict=True)
                if r is None or r.status not in TERMINAL
            ]
            depths = self.queue_depths(dead=True)
            short = {
                task: want_dead[task] - (depths[task] - self.dead_baseline.get(task, 0))
                for task in TASKS
            }
            if not pending and all(n <= 0 for n in short.values()):
                return
            for task, proc in self.workers.items():
                if proc.poll() is not None:
                    raise DemoError(
                        f"the {task} worker exited early ({proc.returncode})"
                        + self.worker_log(task)
                    )
            if time.monotonic() > deadline:
                raise DemoError(
                    f"not finished after {DEADLINE:.0f} s: jobs not final: "
                    + (", ".join(f"{e.label} {short_id(e.job.id)}" for e in pending) or "none")
                    + "; dead letters missing: "
                    + (", ".join(f"{t}: {n}" for t, n in short.items() if n > 0) or "none")
                    + "".join(self.worker_log(task) for task in self.workers)
                )
            time.sleep(0.5)

    def stop_workers(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for task, proc in self.workers.items():
            try:
                code = proc.wait(timeout=GRACE + 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            lines = (self.work / f"worker-{task}.log").read_text(errors="replace").splitlines()
            self.worker_summaries[task] = f"exit {code}; outcomes: {lines[-1] if lines else '?'}"

    def read_dead_letters(self) -> None:
        """Every message in the dead-letter queues, read with basic_get and left there
        (never acked: closing the channel returns them)."""
        with contextlib.closing(self.connection("dead letters")) as conn:
            for task in TASKS:
                channel = conn.channel()
                queue = self.app.names.dead_letter_queue(task)
                depth = channel.queue_declare(queue, passive=True).method.message_count or 0
                for _ in range(depth):
                    method, properties, _body = channel.basic_get(queue, auto_ack=False)
                    if method is None or properties is None:
                        break
                    headers = properties.headers or {}
                    self.dead_letters.append(
                        DeadLetter(
                            task,
                            properties.message_id,
                            text(headers.get(HEADER_REASON)),
                            text(headers.get(HEADER_ERROR)),
                            headers.get(HEADER_ATTEMPTS),
                        )
                    )
                channel.close()

    # --- the report ---------------------------------------------------------------

    def report(self, store: Store) -> Checks:
        checks = Checks()
        say()
        say("== jobs, from the ledger (SQLite: the workers' idempotency store)")
        say(f"  {'task':<13} {'job':<9} {'published as':<13} {'status':<10} {'att':>3}  last error")
        labels = self.labels()
        for row in sorted(store.find(limit=1000), key=lambda row: row.created_at):
            error = cut((row.last_error or "-").splitlines()[0], 60)
            say(
                f"  {row.task:<13} {short_id(row.job_id):<9} {labels.get(row.job_id, '?'):<13}"
                f" {row.status.value:<10} {row.attempts:>3}  {error}"
            )
        for e in self.expected:
            r = self.record(store, e.job)
            ok = r is not None and r.status is e.status and r.attempts == e.attempts
            checks.check(
                ok,
                f"{e.label} {e.job.task} job {short_id(e.job.id)} ended {e.status.value}"
                f" after {e.attempts} attempt(s)",
            )
            if r is not None and e.job.due_at is not None:
                early = (e.job.due_at - r.updated_at).total_seconds()
                checks.check(
                    early <= 0.05,
                    f"{e.label} job ran at or after its due time ({-early:+.1f} s after)",
                )
        counts = store.counts()
        say("  ledger totals: " + ", ".join(f"{s.value} {n}" for s, n in counts.items()))
        checks.check(
            counts[Status.RUNNING] == 0 and counts[Status.RETRYING] == 0,
            "no job left running or retrying in the ledger",
        )
        # Informational: whether the worker records poison messages in the ledger
        # (under their message id) depends on the broker-jobs version.
        recorded = sum(1 for p in self.poison if store.get_by_job_id(p.message_id))
        say(f"  poison messages with a ledger record: {recorded} of {len(self.poison)}")

        say()
        say("== dead-letter queues (read with basic_get, left in place)")
        for task in TASKS:
            letters = [d for d in self.dead_letters if d.task == task]
            reasons = Counter(d.reason for d in letters)
            say(
                f"  {self.app.names.dead_letter_queue(task)}: {len(letters)} message(s)"
                + (
                    " (" + ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items())) + ")"
                    if letters
                    else ""
                )
            )
            for d in letters:
                what = labels.get(d.message_id or "", "earlier run")
                attempts = "-" if d.attempts is None else d.attempts
                job = short_id(str(d.message_id))
                error = cut(d.error.splitlines()[0], 60) if d.error else "-"
                say(f"    {d.reason:<10} {job:<9} {what:<13} attempts {attempts}  {error}")
        by_id = {d.message_id: d for d in self.dead_letters}
        for e in self.expected:
            if e.dead_reason:
                got = by_id.get(e.job.id)
                checks.check(
                    got is not None and got.reason == e.dead_reason,
                    f"{e.label} job {short_id(e.job.id)} dead-lettered as {e.dead_reason!r}",
                )
        for p in self.poison:
            got = by_id.get(p.message_id)
            checks.check(
                got is not None and got.reason == p.reason and got.task == p.task,
                f"poison message ({p.label}) dead-lettered from {p.task} as {p.reason!r}",
            )
        depths = self.queue_depths(dead=False)
        checks.check(
            all(n == 0 for n in depths.values()),
            "task queues empty: " + ", ".join(f"{t} {n}" for t, n in depths.items()),
        )

        say()
        say("== workers (stopped with SIGTERM)")
        for task, summary in self.worker_summaries.items():
            say(f"  {task}: {summary}")
            checks.check(summary.startswith("exit 0;"), f"{task} worker stopped gracefully")
        return checks

    # --- helpers ------------------------------------------------------------------

    def labels(self) -> dict[str, str]:
        """How each message of this run was published, by job (message) id."""
        found = {e.job.id: e.label for e in self.expected}
        found.update({p.message_id: p.label for p in self.poison})
        return found

    @staticmethod
    def record(store: Store, job: Job) -> JobRecord | None:
        records = store.get_by_job_id(job.id)
        return records[0] if records else None

    def connection(self, purpose: str) -> pika.BlockingConnection:
        parameters = pika.URLParameters(self.url)
        parameters.client_properties = {"connection_name": f"broker-jobs demo ({purpose})"}
        return pika.BlockingConnection(parameters)

    def queue_depths(self, *, dead: bool) -> dict[str, int]:
        names = self.app.names
        with contextlib.closing(self.connection("depths")) as conn:
            channel = conn.channel()
            return {
                task: channel.queue_declare(
                    names.dead_letter_queue(task) if dead else names.task_queue(task),
                    passive=True,
                ).method.message_count
                or 0
                for task in TASKS
            }

    def worker_log(self, task: str) -> str:
        path = self.work / f"worker-{task}.log"
        lines = path.read_text(errors="replace").splitlines()[-15:] if path.exists() else []
        return f"\n--- last lines of the {task} worker's log ---\n" + "\n".join(lines)

    def kill_workers(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class DemoError(Exception):
    """The demo could not run to the end; the message says where it stopped."""


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def broker_jobs_command() -> str:
    """The ``broker-jobs`` script of this interpreter's environment (the venv's)."""
    beside = Path(sys.executable).parent / "broker-jobs"
    return str(beside) if beside.exists() else shutil.which("broker-jobs") or "broker-jobs"


def run(url: str, work: Path) -> int:
    demo = Demo(url, work)
    say(f"== broker {mask_url(url)}, namespace {demo.app.namespace!r}, ledger {demo.db}")
    try:
        demo.apply_topology()
        demo.start_workers()
        demo.publish()
        say("  waiting for every job to finish (retries 0.5-2 s apart, delays 3 and 5 s)...")
        with open_store(demo.store_url) as store:
            demo.wait(store)
            demo.stop_workers()
            demo.read_dead_letters()
            checks = demo.report(store)
    except DemoError as error:
        say(f"\nFAILED: {error}")
        return 1
    finally:
        demo.kill_workers()
    say()
    say("== expectations")
    for ok, line in checks.results:
        say(f"  [{'ok' if ok else 'FAIL'}] {line}")
    return 0 if checks.passed else 1


def main() -> int:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="broker-jobs-demo-"))
    node: RabbitNode | None = None
    try:
        url = os.environ.get("BROKER_JOBS_URL")
        if not url:
            if not RabbitNode.available():
                say("no broker: set BROKER_JOBS_URL or apt-get install rabbitmq-server")
                return 1
            say("== starting a throwaway RabbitMQ node (own ports and data dir)")
            node = RabbitNode.create(work / "rabbit")
            node.start()
            url = node.url
            say(f"  up in {time.monotonic() - started:.1f} s")
        code = run(url, work)
    except (pika.exceptions.AMQPError, OSError, RabbitNodeError) as error:
        say(f"\nFAILED: {type(error).__name__}: {error}")
        code = 1
    finally:
        if node is not None:
            node.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    say(f"\n{'PASSED' if code == 0 else 'FAILED'} in {time.monotonic() - started:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
