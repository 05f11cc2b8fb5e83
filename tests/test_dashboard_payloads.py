"""The job page and its API document show the payload the ledger keeps: a job
published with the ledger, and one kept after a failure; as text, never markup. The
fixtures are the dashboard tests' (a real broker, an SQLite ledger)."""

from __future__ import annotations

import html
import re

import pytest

from broker_jobs import App, Job, JobRequest, Publisher
from broker_jobs.store.base import MAX_PAYLOAD_BYTES, Output, Status, json_text
from broker_jobs.store.sqlite import SQLiteStore
from tests import test_dashboard as _dashboard_tests
from tests.support import Broker, run_burst_worker
from tests.test_dashboard import ESCAPED, SCRIPT, TASK, Dashboard, Item, publish

pytestmark = pytest.mark.broker

# The dashboard tests' fixtures.
handlers = _dashboard_tests.handlers
app = _dashboard_tests.app
dashboard = _dashboard_tests.dashboard


def payload_of(page: str) -> str:
    found = re.search(r'<pre id="payload">(.*?)</pre>', page, re.S)
    assert found, "the page shows a payload"
    return found.group(1)


def test_a_job_published_with_the_ledger_shows_its_payload_as_text(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="kept-1", note=SCRIPT))
    client = dashboard()

    page = client.get("/jobs/kept-1")
    assert page.status_code == 200
    shown = payload_of(page.text)
    assert ESCAPED in shown  # escaped: the markup is text
    assert SCRIPT not in page.text
    assert html.unescape(shown).startswith('{\n  "key": "kept-1",')  # pretty-printed
    assert "Kept by the ledger" in page.text

    document = client.get("/api/jobs/kept-1").json()
    assert document["payload"]["payload"] == {"key": "kept-1", "note": SCRIPT, "fail": False}
    assert document["payload"]["too_large"] is False
    assert document["dead_letter"] is None


def test_a_dead_jobs_page_shows_its_dead_letter_first_and_the_api_the_ledgers_too(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="bad-1", note=SCRIPT, fail=True))
    run_burst_worker(broker, app, ledger)
    record = ledger.get("bad-1")
    assert record is not None
    assert record.status is Status.DEAD
    client = dashboard()

    page = client.get("/jobs/bad-1")
    assert "From its dead letter" in page.text
    assert "Kept by the ledger" not in page.text
    assert ESCAPED in payload_of(page.text)
    document = client.get("/api/jobs/bad-1").json()
    assert document["payload"]["payload"]["note"] == SCRIPT
    assert document["dead_letter"]["payload"]["note"] == SCRIPT


def test_a_payload_kept_by_a_failure_is_in_the_jobs_document(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    """Published without the ledger: the worker keeps the payload when the job dies."""
    item = Item(key="fails-1", note=SCRIPT, fail=True)
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many([JobRequest(TASK, item.model_dump(), idempotency_key=item.key)])
    run_burst_worker(broker, app, ledger)

    assert ledger.payload("fails-1") == item.model_dump()
    document = dashboard().get("/api/jobs/fails-1").json()
    assert document["job"]["state"] == "dead"
    assert document["payload"]["payload"] == item.model_dump()


def test_a_job_without_a_kept_payload_says_when_one_is_kept(
    ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    ledger.claim(Job(id="plain-1", task=TASK, idempotency_key="plain-1"), "w", 30)
    page = dashboard().get("/jobs/plain-1")
    assert '<pre id="payload">' not in page.text
    assert "kept when published with the ledger or after a failure" in page.text
    assert dashboard().get("/api/jobs/plain-1").json()["payload"] is None


def test_a_payload_too_large_to_keep_says_so(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="big-1", note="x" * MAX_PAYLOAD_BYTES))
    page = dashboard().get("/jobs/big-1")
    assert '<pre id="payload">' not in page.text
    assert "Too large to keep" in page.text
    assert dashboard().get("/api/jobs/big-1").json()["payload"]["too_large"] is True


def test_a_succeeded_jobs_page_and_api_show_its_result_and_follow_ups_as_text(
    ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    parent = Job(task=TASK, idempotency_key="tenant/../../dead-letters")
    follow_up = Job(task=TASK, idempotency_key=f"{parent.idempotency_key}>1")
    ledger.claim(parent, "w", 60)
    ledger.succeed(
        parent.idempotency_key,
        "w",
        output=Output(json_text({"note": SCRIPT}), (follow_up,)),
    )
    client = dashboard()

    page = client.get(f"/jobs/{parent.id}")
    assert page.status_code == 200
    shown = re.search(r'<pre id="result">(.*?)</pre>', page.text, re.S)
    assert shown
    assert ESCAPED in shown.group(1)
    assert SCRIPT not in page.text
    assert "Recorded, not confirmed yet" in page.text
    assert follow_up.id in page.text
    document = client.get(f"/api/jobs/{parent.id}").json()
    assert document["result"]["value"] == {"note": SCRIPT}
    assert document["follow_ups"]["jobs"] == [
        {
            "job_id": follow_up.id,
            "task": TASK,
            "idempotency_key": follow_up.idempotency_key,
            "due_at": None,
        }
    ]
    assert document["follow_ups"]["sent_at"] is None
