"""The web dashboard against a real broker and ledger (starlette's TestClient): the
pages' figures, the jobs list's filters and paging, a job's executions, actions that
confirm first and need the CSRF token (and the token when set), read-only refusals,
and that a job's payload and error are shown as text, never as markup."""

from __future__ import annotations

import html
import logging
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pika
import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from starlette.testclient import TestClient

from broker_jobs import App, Job, JobRequest, Publisher
from broker_jobs.cli import main
from broker_jobs.dashboard import DashboardSettings, create_app
from broker_jobs.dashboard.actions import Progress, Result
from broker_jobs.dashboard.operations import Operations, Work
from broker_jobs.errors import BrokerConnectionError, ConfigurationError
from broker_jobs.retry import PermanentError
from broker_jobs.store.base import Status, Store
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.urls import BrokerURLs
from tests.support import Broker, run_burst_worker, single_attempt_app, wait_until

pytestmark = pytest.mark.broker

TASK = "dash.job"
OTHER = "dash.other"
SCRIPT = "<script>alert('x')</script>"
ESCAPED = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"


class Item(BaseModel):
    key: str
    note: str = ""
    fail: bool = False


class Handlers:
    """Fails a job with ``fail`` set (permanently: straight to its dead letters)
    until ``fixed``; counts the runs."""

    def __init__(self) -> None:
        self.fixed = False
        self.runs: dict[str, int] = {}
        self._lock = threading.Lock()

    def run(self, item: Item) -> None:
        with self._lock:
            self.runs[item.key] = self.runs.get(item.key, 0) + 1
        if item.fail and not self.fixed:
            raise PermanentError(f"refused {SCRIPT}")


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
def app(make_app: Callable[[], App], handlers: Handlers) -> App:
    return single_attempt_app(make_app, (TASK, OTHER), handlers.run)


Dashboard = Callable[..., TestClient]


@pytest.fixture
def dashboard(broker: Broker, app: App, ledger: SQLiteStore) -> Iterator[Dashboard]:
    clients: list[TestClient] = []

    def make(store: Store | None = None, **options: Any) -> TestClient:
        options.setdefault("allowed_hosts", ("testserver",))  # TestClient's Host
        settings = DashboardSettings(
            store=store or ledger,
            urls=BrokerURLs.parse(broker.url),
            names=app.names,
            tasks=(TASK, OTHER),
            app=app,
            **options,
        )
        client = TestClient(create_app(settings))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def publish(broker: Broker, app: App, store: Store, *items: Item, task: str = TASK) -> None:
    """Publish with the ledger: each job is QUEUED before any worker sees it."""
    with Publisher(broker.url, app, ledger=store) as publisher:
        publisher.publish_many(
            [JobRequest(task, item.model_dump(), idempotency_key=item.key) for item in items]
        )


def without_broker(app: App, ledger: Store) -> DashboardSettings:
    """A dashboard's settings whose broker never answers (the ledger's pages only)."""
    return DashboardSettings(
        store=ledger,
        urls=BrokerURLs.parse("amqp://guest:guest@127.0.0.1:1/"),  # nothing answers there
        names=app.names,
        tasks=(TASK, OTHER),
        app=app,
        allowed_hosts=("testserver",),
    )


def csrf_of(client: TestClient) -> str:
    """The CSRF token of the client's cookie, as a page's forms carry it."""
    page = client.get("/jobs")
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
    assert found, "a page carries the CSRF token"
    return found.group(1)


def hidden_fields(page: str) -> list[tuple[str, str]]:
    """The hidden fields of a confirmation page's form."""
    return [
        (html.unescape(name), html.unescape(value))
        for name, value in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', page)
    ]


def confirmed(client: TestClient, path: str, fields: dict[str, Any], **extra: str) -> Any:
    """Post an action, check it asks first, confirm it; the answer (not followed: a
    TestClient response, of httpx or httpx2 by starlette's version)."""
    form = {"csrf_token": csrf_of(client), **fields}
    asked = client.post(path, data=form)
    assert asked.status_code == 200, asked.text
    assert 'name="confirm"' in asked.text
    again = [*hidden_fields(asked.text), ("confirm", "yes"), *extra.items()]
    return client.post(
        path,
        content="&".join(f"{_q(k)}={_q(v)}" for k, v in again),
        headers={"content-type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )


def act(client: TestClient, path: str, fields: dict[str, Any], **extra: str) -> str:
    """An action on one job or dead letter: confirmed, its result page at once."""
    done = confirmed(client, path, fields, **extra)
    assert done.status_code == 200, done.text
    text: str = done.text
    return text


def act_in_background(
    client: TestClient, path: str, fields: dict[str, Any], **extra: str
) -> tuple[str, dict[str, Any]]:
    """A bulk action: confirmed, it redirects to its operation's page; once its API
    document says finished, that page and the document."""
    started = confirmed(client, path, fields, **extra)
    assert started.status_code == 303, started.text
    location = started.headers["location"]
    assert re.fullmatch(r"/operations/[\w-]{20,}", location), location
    document = finished(client, location.removeprefix("/operations/"))
    page = client.get(location)
    assert page.status_code == 200
    return page.text, document


def finished(client: TestClient, operation_id: str) -> dict[str, Any]:
    """The operation's API document once it says finished."""
    document: dict[str, Any] = wait_until(
        lambda: _finished(client.get(f"/api/operations/{operation_id}").json()),
        within=20,
        what=f"operation {operation_id} finished",
    )
    return document


def _finished(document: dict[str, Any]) -> dict[str, Any] | None:
    return document if document["finished"] else None


def _q(text: str) -> str:
    from urllib.parse import quote  # noqa: PLC0415

    return quote(text, safe="")


def count_on(page: str, name: str) -> int:
    found = re.search(rf'data-count="{re.escape(name)}">(\d+)<', page)
    assert found, f"{name} on the result page"
    return int(found.group(1))


# -- reading ------------------------------------------------------------------------


def test_the_overview_counts_what_was_published(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, *(Item(key=f"o{n}") for n in range(3)))
    client = dashboard()
    document = client.get("/api/overview").json()
    row = {task["task"]: task for task in document["tasks"]}[TASK]
    assert row["queue"]["messages"] == 3
    assert row["ledger"]["counts"]["queued"] == 3
    assert row["ledger"]["oldest_waiting"] is not None
    assert row["ledger"]["last_hour_buckets"] == [[0, 0]] * 12  # nothing ran yet
    assert row["ledger"]["last_hour_bucket_seconds"] == 300
    assert document["beat_leader"] is None
    page = client.get("/")
    assert page.status_code == 200
    cells = re.search(rf'<tr data-task="{TASK}">(.*?)</tr>', page.text, re.S)
    assert cells
    assert re.search(r'data-field="ready">3<', cells.group(1))
    assert re.search(r'data-field="queued">3<', cells.group(1))
    assert "<svg" in cells.group(1)
    fragment = client.get("/?fragment=1")  # what the live refresh fetches
    assert 'data-field="queued">3<' in fragment.text
    assert "<html" not in fragment.text
    assert 'data-refresh="/?fragment=1"' in page.text
    assert client.get("/static/refresh.js").status_code == 200


def test_the_overview_charts_the_last_hour_in_buckets(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    items = [Item(key="ok-1"), Item(key="ok-2"), Item(key="ok-3"), Item(key="bad", fail=True)]
    publish(broker, app, ledger, *items)
    run_burst_worker(broker, app, ledger)
    client = dashboard()

    rows = {task["task"]: task["ledger"] for task in client.get("/api/overview").json()["tasks"]}

    ran = rows[TASK]
    assert ran["last_hour_bucket_seconds"] == 300
    # The newest bucket ends at the time of the figures: the runs just now are in it.
    assert ran["last_hour_buckets"] == [[0, 0]] * 11 + [[3, 1]]
    assert (ran["succeeded_last_hour"], ran["failed_last_hour"]) == (3, 1)
    assert rows[OTHER]["last_hour_buckets"] == [[0, 0]] * 12
    cells = re.search(rf'<tr data-task="{TASK}">(.*?)</tr>', client.get("/").text, re.S)
    assert cells
    svg = re.search(r"<svg[^>]*>(.*?)</svg>", cells.group(1), re.S)
    assert svg
    title = "last hour: 3 succeeded, 1 failed (5-minute buckets)"
    assert f"<title>{title}</title>" in svg.group(1)
    # Stacked: 3 of the page's largest bucket of 4 below, 1 above them.
    assert '<rect class="ok" x="132" y="6" width="10" height="18">' in svg.group(1)
    assert '<rect class="failed" x="132" y="0" width="10" height="6">' in svg.group(1)
    assert svg.group(1).count("<rect") == 2
    assert re.search(r'data-field="last-hour">3 ok / 1 failed<', cells.group(1))


@pytest.mark.parametrize("kit", ["sqlite", "postgres"], indirect=True)
def test_the_jobs_list_filters_and_pages(
    broker: Broker, app: App, store: Store, dashboard: Dashboard
) -> None:
    publish(broker, app, store, *(Item(key=f"alpha-{n}") for n in range(5)))
    publish(broker, app, store, Item(key="beta-1"), task=OTHER)
    client = dashboard(store)

    def keys(query: str) -> tuple[list[str], str | None]:
        document = client.get(f"/api/jobs?{query}").json()
        return [job["idempotency_key"] for job in document["jobs"]], document["next"]

    assert sorted(keys("key=alpha")[0]) == [f"alpha-{n}" for n in range(5)]
    assert keys(f"task={OTHER}")[0] == ["beta-1"]
    assert keys("state=succeeded")[0] == []
    assert keys("since=2999-01-01T00:00:00Z")[0] == []
    assert len(keys("until=2999-01-01T00:00")[0]) == 6  # no zone: UTC
    seen: list[str] = []
    page, cursor = keys(f"task={TASK}&state=queued&limit=2")
    seen += page
    while cursor:
        page, cursor = keys(f"task={TASK}&state=queued&limit=2&after={cursor}")
        assert len(page) <= 2
        seen += page
    assert sorted(seen) == [f"alpha-{n}" for n in range(5)]
    # The HTML list pages the same way, keeping its filters in the Next link.
    first = client.get(f"/jobs?task={TASK}&limit=2")
    assert first.text.count("<tr data-key=") == 2
    link = re.search(r'id="next" rel="next" href="([^"]+)"', first.text)
    assert link
    assert "task=dash.job" in html.unescape(link.group(1))
    second = client.get(html.unescape(link.group(1)))
    assert second.text.count("<tr data-key=") == 2
    assert set(re.findall(r'data-key="([^"]+)"', first.text)).isdisjoint(
        re.findall(r'data-key="([^"]+)"', second.text)
    )
    assert client.get("/jobs?state=nonsense").status_code == 400
    assert client.get("/api/jobs?after=garbage").status_code == 400
    assert client.get("/jobs?since=yesterday").status_code == 400
    assert client.get("/jobs?since=0001-01-01T00:00:00%2B14:00").status_code == 400
    assert client.get("/api/jobs?until=9999-12-31T23:59:59-14:00").status_code == 400


#: The jobs list's "updated" header: its aria-sort, and its link to the other order.
ORDER_HEADER = r'<th aria-sort="(\w+)"><a id="order-updated" href="([^"]+)"'


def matching_on(page: str) -> int:
    """How many jobs the jobs list says match its filters."""
    found = re.search(r'<span id="matching" data-count="(\d+)">([\d,]+)</span> matching', page)
    assert found, "the jobs list says how many match"
    assert found.group(2).replace(",", "") == found.group(1)
    return int(found.group(1))


def _listed(ledger: Store) -> list[str]:
    """Seven jobs of TASK and two of OTHER published a minute apart (two of TASK at
    the same moment); TASK's keys oldest updated first (ties by key ascending)."""
    from datetime import timedelta  # noqa: PLC0415

    start = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    moments = {"t0": 0, "t1": 1, "t2a": 2, "t2b": 2, "t3": 3, "t4": 4, "t5": 5}
    for key, minute in moments.items():
        job = Job(id=f"id-{key}", task=TASK, idempotency_key=key)
        ledger.record_published([job], now=start + timedelta(minutes=minute))
    for key, minute in {"o1": 1, "o9": 9}.items():
        job = Job(id=f"id-{key}", task=OTHER, idempotency_key=key)
        ledger.record_published([job], now=start + timedelta(minutes=minute))
    return list(moments)


def test_the_jobs_list_says_how_many_match_and_pages_in_either_order(
    app: App, ledger: SQLiteStore
) -> None:
    oldest = _listed(ledger)
    with TestClient(create_app(without_broker(app, ledger))) as client:

        def listed(query: str) -> tuple[list[str], int]:
            keys: list[str] = []
            after = ""
            for _ in range(10):
                document = client.get(f"/api/jobs?{query}{after}").json()
                assert document["matching"] == len(oldest)  # every page: all that match
                keys += [job["idempotency_key"] for job in document["jobs"]]
                if document["next"] is None:
                    return keys, document["matching"]
                after = f"&after={document['next']}"
            raise AssertionError("more pages than jobs")

        everything = client.get("/api/jobs").json()
        assert (everything["matching"], everything["order"]) == (9, "newest")
        assert client.get("/api/jobs?state=succeeded").json()["matching"] == 0
        assert client.get("/api/jobs?key=t2").json()["matching"] == 2
        assert client.get(f"/api/jobs?task={OTHER}&order=oldest").json()["order"] == "oldest"
        for limit in (1, 2, 3, 7):
            assert listed(f"task={TASK}&limit={limit}")[0] == oldest[::-1]
            assert listed(f"task={TASK}&limit={limit}&order=oldest")[0] == oldest
        assert listed(f"task={TASK}&order=OLDEST&limit=2")[0] == oldest  # any case

        # The page: how many match, the order in the form, the Next link keeping both.
        first = client.get(f"/jobs?task={TASK}&order=oldest&limit=3")
        assert first.status_code == 200
        assert '<span id="matching" data-count="7">7</span> matching, oldest updated first' in (
            first.text
        )
        assert '<option value="oldest" selected>oldest updated first</option>' in first.text
        assert re.findall(r'<tr data-key="([^"]+)"', first.text) == oldest[:3]
        link = re.search(r'id="next" rel="next" href="([^"]+)"', first.text)
        assert link
        assert "order=oldest" in link.group(1)
        assert "task=dash.job" in link.group(1)
        second = client.get(html.unescape(link.group(1)))
        assert re.findall(r'<tr data-key="([^"]+)"', second.text) == oldest[3:6]
        assert matching_on(second.text) == 7
        back = re.search(r'id="first" href="([^"]+)"', second.text)
        assert back
        assert "order=oldest" in back.group(1)
        assert "after=" not in back.group(1)
        # The "updated" header says the order and links to the other one's first page.
        header = re.search(ORDER_HEADER, second.text)
        assert header
        assert header.group(1) == "ascending"
        newest = client.get(html.unescape(header.group(2)))
        assert re.findall(r'<tr data-key="([^"]+)"', newest.text) == oldest[::-1][:3]
        assert "after=" not in header.group(2)
        assert "limit=3" in header.group(2)
        assert "task=dash.job" in header.group(2)
        header = re.search(ORDER_HEADER, newest.text)
        assert header
        assert header.group(1) == "descending"
        assert "order=oldest" in header.group(2)
        assert matching_on(client.get("/jobs").text) == 9
        assert matching_on(client.get("/jobs?state=dead").text) == 0
        assert "no jobs match" in client.get("/jobs?state=dead").text

        for path in ("/jobs?order=sideways", "/api/jobs?order=sideways"):
            refused = client.get(path)
            assert refused.status_code == 400, path
            message = html.unescape(refused.text)
            assert "order: 'sideways' is not an order: newest or oldest" in message, message


def test_every_other_table_is_sorted_in_the_browser_by_the_dashboards_own_script(
    app: App, ledger: SQLiteStore
) -> None:
    from broker_jobs.dashboard.views import SECURITY_HEADERS  # noqa: PLC0415
    from broker_jobs.dead_letter import dead_letter_from  # noqa: PLC0415

    _listed(ledger)
    letter = dead_letter_from(TASK, {"bj-dead-reason": "exhausted"}, {"message_id": "j1"}, b"{}")
    ledger.index_dead_letters([letter])
    sortable = {
        "/": '<table id="overview" data-sortable>',
        f"/tasks/{TASK}": '<table class="jobs" data-sortable>',
        "/workers": '<table id="running-jobs" data-sortable>',
        "/dead-letters": '<table class="letters" data-sortable>',
        "/schedules": '<table id="schedules" data-sortable>',
    }
    with TestClient(create_app(without_broker(app, ledger))) as client:
        for path, table in sortable.items():
            page = client.get(path)
            assert page.status_code == 200, path
            assert table in page.text, path
            assert '<script src="/static/sort.js" defer></script>' in page.text
            for name, value in SECURITY_HEADERS.items():
                assert page.headers[name] == value
        assert '<table id="workers" data-sortable>' in client.get("/workers").text
        # The jobs list is sorted by the server (its "updated" header is a link).
        jobs = client.get("/jobs").text
        assert '<table class="jobs">' in jobs
        script = client.get("/static/sort.js")
        assert script.status_code == 200
        assert "javascript" in script.headers["content-type"]
        assert "aria-sort" in script.text


def test_a_dead_job_shows_its_executions_escaped_and_replays_until_it_succeeds(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard, handlers: Handlers
) -> None:
    publish(broker, app, ledger, Item(key="bad-1", note=SCRIPT, fail=True))
    run_burst_worker(broker, app, ledger)
    assert ledger.get("bad-1").status is Status.DEAD  # type: ignore[union-attr]
    client = dashboard(allow_actions=True)
    page = client.get("/jobs/bad-1")
    assert page.status_code == 200
    assert 'id="state"><span class="badge state-dead">dead<' in page.text
    assert page.text.count('class="outcome">dead<') == 1
    # The payload (from its dead letter) and the error are text, never markup.
    assert "<script>alert" not in page.text
    payload = re.search(r'<pre id="payload">(.*?)</pre>', page.text, re.S)
    assert payload
    assert ESCAPED in payload.group(1)
    error = re.search(r'<pre id="last-error">(.*?)</pre>', page.text, re.S)
    assert error
    assert ESCAPED in error.group(1)
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert 'name="replay"' in page.text
    assert 'name="cancel"' not in page.text  # a dead job cannot be cancelled
    letters = client.get("/dead-letters")
    assert "<script>alert" not in letters.text
    assert f"{TASK}: permanent (1)" in letters.text
    api = client.get("/api/jobs/bad-1")
    detail = api.json()
    assert detail["dead_letter"]["payload"]["note"] == SCRIPT
    # Every response has the headers: the API (text from messages), a 404, a file.
    for response in (api, client.get("/no/such/page"), client.get("/static/dashboard.css")):
        assert response.headers["x-content-type-options"] == "nosniff", response.url
        assert response.headers["content-security-policy"].startswith("default-src 'self'")

    handlers.fixed = True
    result, _ = act_in_background(
        client, "/actions/replay", {"ref": "bad-1", "task": TASK, "replay": "one"}
    )
    assert count_on(result, "replayed") == 1
    assert count_on(result, "ledger reset") == 1
    run_burst_worker(broker, app, ledger)
    page = client.get("/jobs/bad-1")
    assert 'id="state"><span class="badge state-succeeded">succeeded<' in page.text
    outcomes = re.findall(r'class="outcome">(\w+)<', page.text)
    assert outcomes == ["dead", "succeeded"]
    assert handlers.runs["bad-1"] == 2


def test_cancel_of_a_queued_job_confirms_first_and_is_logged(
    broker: Broker,
    app: App,
    ledger: SQLiteStore,
    dashboard: Dashboard,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publish(broker, app, ledger, Item(key="later-1"))
    client = dashboard(allow_actions=True)
    page = client.get("/jobs/later-1")
    assert 'name="cancel"' in page.text
    asked = client.post("/actions/cancel", data={"csrf_token": csrf_of(client), "ref": "later-1"})
    assert 'name="confirm"' in asked.text
    assert ledger.get("later-1").status is Status.QUEUED  # type: ignore[union-attr]  # asked only
    with caplog.at_level(logging.INFO, logger="broker_jobs.dashboard.audit"):
        result = act(client, "/actions/cancel", {"ref": "later-1"})
    assert "cancel: cancelled" in result
    assert ledger.get("later-1").status is Status.CANCELLED  # type: ignore[union-attr]
    assert client.get("/api/jobs/later-1").json()["job"]["state"] == "cancelled"
    lines = [r.getMessage() for r in caplog.records if r.name == "broker_jobs.dashboard.audit"]
    assert lines == ["dashboard action cancel by testclient: job 'later-1' (1): cancelled"]


def test_a_read_only_dashboard_shows_no_actions_and_refuses_posts(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="ro-1"))
    client = dashboard()
    page = client.get("/jobs/ro-1")
    assert "<button" not in page.text
    assert "read-only" in page.text
    token = csrf_of(client)
    for path, fields in [
        ("/actions/cancel", {"ref": "ro-1"}),
        ("/actions/replay", {"replay": "matching"}),
        ("/actions/purge", {"purge": "matching"}),
    ]:
        answer = client.post(path, data={"csrf_token": token, "confirm": "yes", **fields})
        assert answer.status_code == 403, path
    assert ledger.get("ro-1").status is Status.QUEUED  # type: ignore[union-attr]
    assert client.get("/actions/cancel").status_code == 405  # POST only


def test_a_post_without_the_csrf_token_is_refused(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="csrf-1"))
    client = dashboard(allow_actions=True)
    token = csrf_of(client)
    fields = {"ref": "csrf-1", "confirm": "yes"}
    assert client.post("/actions/cancel", data=fields).status_code == 403
    wrong = {**fields, "csrf_token": "x" * 43}
    assert client.post("/actions/cancel", data=wrong).status_code == 403
    other_site = {"origin": "https://evil.example"}
    signed = {**fields, "csrf_token": token}
    answer = client.post("/actions/cancel", data=signed, headers=other_site)
    assert answer.status_code == 403
    fresh = TestClient(client.app)  # no cookie: a form from elsewhere
    assert fresh.post("/actions/cancel", data=signed).status_code == 403
    assert ledger.get("csrf-1").status is Status.QUEUED  # type: ignore[union-attr]


def test_a_loopback_dashboard_answers_loopback_host_names_only(
    app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    client = dashboard(allowed_hosts=None)  # bound to 127.0.0.1
    assert client.get("/jobs", headers={"host": "127.0.0.1:8080"}).status_code == 200
    assert client.get("/jobs", headers={"host": "localhost:8080"}).status_code == 200
    # A page of a host name pointed at 127.0.0.1 (DNS rebinding) gets nothing.
    assert client.get("/jobs", headers={"host": "rebind.example:8080"}).status_code == 400


def test_actions_on_another_address_need_a_token(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard, tmp_path: Path
) -> None:
    with pytest.raises(ConfigurationError, match="add --token"):
        dashboard(allow_actions=True, host="0.0.0.0")
    dashboard(host="0.0.0.0")  # read-only: no token needed
    result = CliRunner().invoke(
        main,
        [
            "dashboard",
            "--namespace",
            app.namespace,
            "--task",
            TASK,
            "--store",
            f"sqlite:///{tmp_path / 'ledger.db'}",
            "--host",
            "0.0.0.0",
            "--allow-actions",
        ],
        env={"BROKER_JOBS_DASHBOARD_TOKEN": ""},
    )
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "add --token TOKEN (or set BROKER_JOBS_DASHBOARD_TOKEN)" in result.stderr

    publish(broker, app, ledger, Item(key="tok-1"))
    client = dashboard(allow_actions=True, host="0.0.0.0", token="s3cret")
    form = {"csrf_token": csrf_of(client), "ref": "tok-1"}
    asked = client.post("/actions/cancel", data=form)
    assert 'type="password" name="token"' in asked.text
    refused = client.post("/actions/cancel", data={**form, "confirm": "yes", "token": "guess"})
    assert refused.status_code == 401
    assert ledger.get("tok-1").status is Status.QUEUED  # type: ignore[union-attr]
    assert "cancel: cancelled" in act(client, "/actions/cancel", {"ref": "tok-1"}, token="s3cret")
    assert "s3cret" not in repr(client.app.state.settings)  # type: ignore[attr-defined]


def test_dead_letters_purge_a_selection_then_all_matching(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, *(Item(key=f"p{n}", fail=True) for n in range(3)))
    run_burst_worker(broker, app, ledger)
    client = dashboard(allow_actions=True)
    page = client.get(f"/dead-letters?task={TASK}")
    assert page.text.count('type="checkbox" form="selection" name="ref"') == 3
    selection = {"ref": ["p0", "p2"], "task": TASK, "purge": "selected"}
    result, document = act_in_background(client, "/actions/purge", selection)
    assert count_on(result, "purged") == 2
    assert document["result"]["counts"] == {"purged": 2}
    # A selection is looked for in the whole queue: all 3 looked at, 2 deleted.
    assert (document["done"], document["total"], document["error"]) == (3, 3, None)
    left = client.get("/api/dead-letters").json()
    assert [letter["idempotency_key"] for g in left["groups"] for letter in g["dead_letters"]] == [
        "p1"
    ]
    result, document = act_in_background(
        client, "/actions/purge", {"reason": "permanent", "purge": "matching"}
    )
    assert count_on(result, "purged") == 1
    assert (document["done"], document["total"]) == (1, 1)
    wait_until(
        lambda: client.get("/api/dead-letters").json()["depths"] == {TASK: 0, OTHER: 0},
        within=5,
        what="empty dead-letter queues",
    )
    assert ledger.get("p1").status is Status.DEAD  # type: ignore[union-attr]  # the ledger keeps it


def test_a_purge_of_all_without_a_filter_reports_what_the_broker_emptied(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, *(Item(key=f"e{n}", fail=True) for n in range(2)))
    publish(broker, app, ledger, Item(key="e-other", fail=True), task=OTHER)
    run_burst_worker(broker, app, ledger)
    client = dashboard(allow_actions=True)
    wait_until(
        lambda: client.get("/api/dead-letters").json()["depths"] == {TASK: 2, OTHER: 1},
        within=5,
        what="three dead letters",
    )
    # No filter: the broker empties the queues in one step, and progress says so once.
    result, document = act_in_background(client, "/actions/purge", {"purge": "matching"})
    assert count_on(result, "purged") == 3
    assert (document["done"], document["total"], document["finished"]) == (3, 3, True)
    assert client.get("/api/dead-letters").json()["depths"] == {TASK: 0, OTHER: 0}


def test_a_bulk_replay_runs_in_the_background_and_its_page_follows_it(
    broker: Broker,
    app: App,
    ledger: SQLiteStore,
    dashboard: Dashboard,
    handlers: Handlers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publish(broker, app, ledger, *(Item(key=f"r{n}", fail=True) for n in range(3)))
    run_burst_worker(broker, app, ledger)
    handlers.fixed = True
    client = dashboard(allow_actions=True)
    with caplog.at_level(logging.INFO, logger="broker_jobs.dashboard.audit"):
        page, document = act_in_background(
            client, "/actions/replay", {"reason": "permanent", "replay": "matching"}
        )
    counts = {
        "scanned": 3,
        "replayed": 3,
        "skipped": 0,
        "ledger reset": 3,
        "ledger unchanged": 0,
        "ledger unknown": 0,
    }
    assert document["result"]["counts"] == counts
    assert document["result"]["title"] == "replayed 3 dead letter(s)"
    assert (document["action"], document["who"], document["error"]) == (
        "replay",
        "testclient",
        None,
    )
    assert document["done"] == counts["scanned"] == document["total"]
    assert document["started_at"].endswith("+00:00")
    # The finished page is the result page's content, and stops reloading itself.
    assert {name: count_on(page, name) for name in counts} == counts
    assert 'id="result">replayed 3 dead letter(s)<' in page
    assert 'data-finished="yes"' in page
    assert 'http-equiv="refresh"' not in page
    assert "<progress" not in page
    lines = [r.getMessage() for r in caplog.records if r.name == "broker_jobs.dashboard.audit"]
    assert len(lines) == 1
    assert lines[0].startswith("dashboard action replay by testclient: every dead letter matching")
    assert "(3): scanned 3, replayed 3" in lines[0]
    run_burst_worker(broker, app, ledger)
    assert all(ledger.get(f"r{n}").status is Status.SUCCEEDED for n in range(3))  # type: ignore[union-attr]


def test_an_operation_page_shows_its_progress_until_it_finishes(
    app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    """A running operation, held by the test: the page a browser without scripts
    reloads, the progress bar, the JSON the script polls."""
    client = dashboard(allow_actions=True)
    release = threading.Event()

    def work(progress: Progress) -> Result:
        progress(1, 4)
        release.wait(20)
        progress(4, 4)
        return Result("purge", "purged 4 dead letter(s)", {"purged": 4})

    operation = client.app.state.operations.start("purge", "tester", work)  # type: ignore[attr-defined]
    running = wait_until(
        lambda: _done_once(client.get(f"/api/operations/{operation.id}").json(), 1),
        within=5,
        what="progress reported",
    )
    assert (running["total"], running["finished"], running["result"]) == (4, False, None)
    page = client.get(f"/operations/{operation.id}").text
    assert '<noscript><meta http-equiv="refresh" content="2"></noscript>' in page
    assert '<progress id="progress" value="1" max="4">' in page
    assert f'data-operation="/api/operations/{operation.id}" data-finished="no"' in page
    assert f'<a href="/operations/{operation.id}" id="reload">' in page
    release.set()
    document = finished(client, operation.id)
    assert (document["done"], document["result"]["counts"]) == (4, {"purged": 4})
    assert "http-equiv" not in client.get(f"/operations/{operation.id}").text


def _done_once(document: dict[str, Any], done: int) -> dict[str, Any] | None:
    return document if document["done"] == done else None


def test_a_failed_operation_says_why_with_passwords_masked(
    app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    client = dashboard(allow_actions=True)

    def work(progress: Progress) -> Result:
        progress(2, 5)
        raise BrokerConnectionError("lost amqp://bj:hunter2@rabbit:5672/ midway")

    operation = client.app.state.operations.start("replay", "tester", work)  # type: ignore[attr-defined]
    document = finished(client, operation.id)
    assert document["result"] is None
    assert "hunter2" not in document["error"]
    assert "lost amqp://bj:" in document["error"]
    assert document["done"] == 2
    page = client.get(f"/operations/{operation.id}").text
    assert 'id="result">replay: failed<' in page
    assert "hunter2" not in page


def test_an_unknown_operation_is_404(dashboard: Dashboard) -> None:
    client = dashboard()
    page = client.get("/operations/no-such-operation")
    assert page.status_code == 404
    assert "no operation &#39;no-such-operation&#39;" in page.text
    missing = client.get("/api/operations/no-such-operation")
    assert (missing.status_code, list(missing.json())) == (404, ["error"])


def test_only_the_last_finished_operations_are_kept() -> None:
    operations = Operations(keep_finished=2)

    def titled(title: str) -> Work:
        return lambda _progress: Result("purge", title)

    ids = []
    for n in range(4):
        operation_id = operations.start("purge", "tester", titled(f"purged {n}")).id
        wait_until(
            partial(_has_finished, operations, operation_id),
            within=5,
            what=f"operation {n} finished",
        )
        ids.append(operation_id)
    kept = [operations.get(operation_id) for operation_id in ids]
    titles = [
        operation.result.title if operation and operation.result else None for operation in kept
    ]
    assert titles == [None, None, "purged 2", "purged 3"]


def _has_finished(operations: Operations, operation_id: str) -> bool:
    operation = operations.get(operation_id)
    return operation is not None and operation.finished


def test_a_key_with_dot_segments_links_to_its_own_page(
    app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    """A browser removes ``..`` segments from a link before it asks: a key such as
    ``tenant/../../dead-letters`` linked as a path led to another page."""
    # (No "%" in them: starlette's TestClient decodes a path twice, a server once.)
    keys = ["tenant/../../dead-letters", "..", ".", "a b/c?d#e", "./x"]
    ledger.record_published(
        [Job(id=f"id-{n}", task=TASK, idempotency_key=key) for n, key in enumerate(keys)]
    )
    client = dashboard()
    rows = re.findall(r'<td><a href="([^"]+)">([^<]*)</a></td>', client.get("/jobs").text)
    links = {html.unescape(key): html.unescape(href) for href, key in rows}
    assert set(links) == set(keys), rows
    for key, href in links.items():
        resolved = urljoin("http://testserver/jobs", href)  # as a browser resolves it
        page = client.get(resolved)
        assert page.status_code == 200, (key, href, resolved)
        (title,) = re.findall(r"<h1>([^<]*)</h1>", page.text)
        assert html.unescape(title) == f"Job {key}", (href, resolved)


def test_the_operation_page_shows_a_dead_letter_key_as_text(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="esc-1", fail=True))
    run_burst_worker(broker, app, ledger)  # declares the queues, one dead letter
    connection = broker.connection("dashboard test poison")
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            "",
            app.names.dead_letter_queue(TASK),
            b"{not json",
            pika.BasicProperties(content_type="application/json", message_id=SCRIPT, type=TASK),
        )
    finally:
        connection.close()
    client = dashboard(allow_actions=True)
    page, document = act_in_background(
        client, "/actions/replay", {"task": TASK, "replay": "matching"}
    )
    assert document["result"]["counts"]["skipped"] == 1
    assert any(SCRIPT in note for note in document["result"]["notes"])  # JSON: as it is
    assert "<script>alert" not in page
    assert ESCAPED in page


def test_every_api_endpoint_answers_json(
    broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    app.schedule("nightly", TASK, cron="0 3 * * *", timezone="Europe/Paris", payload={"key": "n"})
    publish(broker, app, ledger, Item(key="api-1", fail=True))
    run_burst_worker(broker, app, ledger)
    client = dashboard(schedules=tuple(_schedules(app)))
    for path in [
        "/api/overview",
        f"/api/tasks/{TASK}",
        "/api/jobs",
        "/api/jobs/api-1",
        "/api/dead-letters",
        "/api/schedules",
        "/api/workers",
    ]:
        answer = client.get(path)
        assert answer.status_code == 200, path
        assert answer.headers["content-type"] == "application/json"
        assert isinstance(answer.json(), dict)
    missing = client.get("/api/jobs/nope")
    assert (missing.status_code, list(missing.json())) == (404, ["error"])
    schedule = client.get("/api/schedules").json()["schedules"][0]
    assert (schedule["name"], schedule["catch_up"]) == ("nightly", "all")
    assert "Europe/Paris" in schedule["when"]
    assert len(schedule["next_fires"]) == 3
    for path in ["/schedules", f"/tasks/{TASK}", "/dead-letters", "/jobs/api-1", "/workers"]:
        assert client.get(path).status_code == 200, path
    assert client.get("/tasks/not.shown").status_code == 404


def test_the_schedules_page_says_how_the_leaders_schedules_differ(
    app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    from scheduler.digests import schedule_digests  # noqa: PLC0415

    app.schedule("nightly", TASK, cron="0 3 * * *", payload={"key": "n"})
    app.schedule("hourly", TASK, cron="0 * * * *", payload={"key": "h"})
    ours = schedule_digests(_schedules(app))
    theirs = {"nightly": ours["nightly"], "hourly": "0" * 12, "<b>gone</b>": "1" * 12}
    ledger.record_leader(app.namespace, "beat-a", datetime.now(UTC), schedules=theirs)
    client = dashboard(schedules=tuple(_schedules(app)))

    page = client.get("/schedules").text
    assert "The leader runs other schedules than these" in page
    assert "only on the leader: &lt;b&gt;gone&lt;/b&gt;; defined differently: hourly." in page
    assert "<b>gone" not in page
    mismatch = client.get("/api/schedules").json()["mismatch"]
    assert mismatch == {
        "only_here": [],
        "only_on_leader": ["<b>gone</b>"],
        "defined_differently": ["hourly"],
    }

    ledger.record_leader(app.namespace, "beat-a", datetime.now(UTC), schedules=ours)
    assert "schedules-mismatch" not in client.get("/schedules").text


def _schedules(app: App) -> list[Any]:
    from scheduler.config import load_schedules  # noqa: PLC0415

    return load_schedules(app)


def test_dead_letters_and_a_dead_job_are_read_from_the_ledger_without_the_broker(
    broker: Broker, app: App, ledger: SQLiteStore, connection: pika.BlockingConnection
) -> None:
    publish(broker, app, ledger, *(Item(key=f"d{n}", fail=True) for n in range(3)))
    run_burst_worker(broker, app, ledger)
    settings = without_broker(app, ledger)
    with TestClient(create_app(settings)) as client:
        document = client.get("/api/dead-letters").json()
        assert document["depths"] == {TASK: 3, OTHER: 0}
        assert document["matching"] == 3
        keys = [x["idempotency_key"] for g in document["groups"] for x in g["dead_letters"]]
        assert sorted(keys) == ["d0", "d1", "d2"]
        page = client.get("/dead-letters?reason=permanent")
        assert page.status_code == 200
        assert "Showing 3 of 3 matching" in page.text
        job = client.get("/jobs/d1")
        assert job.status_code == 200
        assert "PermanentError" in job.text
        assert "dead-lettered" in job.text  # its dead letter on the timeline
    queue = app.names.dead_letter_queue(TASK)
    channel = connection.channel()
    assert channel.queue_declare(queue, passive=True).method.message_count == 3
    channel.close()


def test_every_state_has_a_badge_colour() -> None:
    import broker_jobs.dashboard  # noqa: PLC0415

    css = (Path(broker_jobs.dashboard.__file__).parent / "static" / "dashboard.css").read_text()
    missing = [status.value for status in Status if f".state-{status.value}" not in css]
    assert missing == [], f"states without a badge colour in dashboard.css: {missing}"


def test_dead_letters_come_in_pages_of_200(app: App, ledger: SQLiteStore) -> None:
    from broker_jobs.dead_letter import dead_letter_from  # noqa: PLC0415

    ledger.index_dead_letters(
        [
            dead_letter_from(
                TASK,
                {"bj-dead-reason": "exhausted", "bj-dead-error": f"Boom {n}"},
                {"message_id": f"job-{n:03d}"},
                b"{}",
            )
            for n in range(450)
        ]
    )
    settings = without_broker(app, ledger)
    with TestClient(create_app(settings)) as client:
        third = client.get("/api/dead-letters?page=3").json()
        assert (third["page"], third["pages"], third["matching"]) == (3, 3, 450)
        ids = [x["job_id"] for g in third["groups"] for x in g["dead_letters"]]
        assert ids == [f"job-{n:03d}" for n in range(400, 450)]
        second = client.get("/dead-letters?reason=exhausted&page=2")
        assert "numbers 201 to 400" in second.text
        assert 'href="/dead-letters?reason=exhausted&amp;page=3">Next page' in second.text
        assert 'href="/dead-letters?reason=exhausted&amp;page=1">Previous page' in second.text
        assert "Next page" not in client.get("/dead-letters?page=3").text
        for wrong in ("0", "x", "-1"):
            answer = client.get(f"/dead-letters?page={wrong}")
            assert answer.status_code == 400, wrong
            assert "not a page number" in answer.text


def test_the_workers_page_shows_every_heartbeat_escaped_without_the_broker(
    app: App, ledger: SQLiteStore
) -> None:
    from dataclasses import replace  # noqa: PLC0415
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from broker_jobs.observe.heartbeat import process_record  # noqa: PLC0415
    from broker_jobs.store.processes import ProcessKind, RunningJob  # noqa: PLC0415

    now = datetime.now(UTC)
    alive = replace(
        process_record(ProcessKind.WORKER, "<b>w1</b>", app.namespace, tasks=[TASK], concurrency=4),
        host="<script>alert(1)</script>",
        in_flight=1,
        running=(RunningJob("job-1", TASK, "tenant/../../dead-letters", 2, now),),
        held="publishes unconfirmed <img src=x>",
    )
    lost = replace(alive, id="w2", seen_at=now - timedelta(minutes=3), running=())
    ledger.record_process(alive)
    ledger.record_process(lost)
    ledger.record_process(replace(alive, id="elsewhere", namespace="other-namespace"))
    settings = without_broker(app, ledger)
    with TestClient(create_app(settings)) as client:
        page = client.get("/workers")
        assert page.status_code == 200
        assert "<script>alert(1)</script>" not in page.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
        assert 'data-state="alive"' in page.text
        assert 'data-state="lost"' in page.text
        assert "elsewhere" not in page.text
        assert 'href="/jobs/tenant%2F..%2F..%2Fdead-letters"' in page.text
        # Why the live worker holds its deliveries; the lost one's last reason is old.
        assert page.text.count("held: publishes unconfirmed &lt;img src=x&gt;") == 1
        document = client.get("/api/workers").json()
        assert [(p["id"], p["state"]) for p in document["processes"]] == [
            ("<b>w1</b>", "alive"),
            ("w2", "lost"),
        ]
        assert document["processes"][0]["running"][0]["key"] == "tenant/../../dead-letters"
        assert [p["held"] for p in document["processes"]] == [
            "publishes unconfirmed <img src=x>",
            None,
        ]
        fragment = client.get("/workers?fragment=1")
        assert "<html" not in fragment.text
        assert 'id="workers"' in fragment.text


def test_every_liveness_has_a_badge_colour() -> None:
    import broker_jobs.dashboard  # noqa: PLC0415
    from broker_jobs.ops.processes import Liveness  # noqa: PLC0415

    css = (Path(broker_jobs.dashboard.__file__).parent / "static" / "dashboard.css").read_text()
    missing = [state.value for state in Liveness if f".process-{state.value}" not in css]
    assert missing == [], f"liveness states without a badge colour in dashboard.css: {missing}"


def test_a_task_is_paused_and_resumed_from_its_page_only_when_actions_are_allowed(
    app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    read_only = dashboard()
    assert "Pause this task" not in read_only.get(f"/tasks/{TASK}").text
    refused = read_only.post(
        "/actions/pause", data={"csrf_token": csrf_of(read_only), "task": TASK}
    )
    assert refused.status_code == 403
    assert ledger.pauses(app.namespace) == {}

    client = dashboard(allow_actions=True)
    assert 'id="task-pause"' in client.get(f"/tasks/{TASK}").text
    unknown = client.post("/actions/pause", data={"csrf_token": csrf_of(client), "task": "nope"})
    assert unknown.status_code == 404
    done = act(client, "/actions/pause", {"task": TASK})
    assert f"pause: {TASK} paused" in done
    [pause] = ledger.pauses(app.namespace).values()
    assert (pause.task, pause.by.startswith("dashboard: ")) == (TASK, True)
    assert 'data-field="paused"' in client.get("/").text
    assert client.get(f"/api/tasks/{TASK}").json()["paused"]["by"] == pause.by
    page = client.get(f"/tasks/{TASK}").text
    assert 'id="task-resume"' in page
    assert "workers start none of its jobs" in page

    assert "resume: " in act(client, "/actions/resume", {"task": TASK})
    assert ledger.pauses(app.namespace) == {}
    assert 'data-field="paused"' not in client.get("/").text


def test_with_the_broker_down_the_overview_and_task_pages_show_the_ledger_with_a_banner(
    broker: Broker, app: App, ledger: SQLiteStore
) -> None:
    publish(broker, app, ledger, Item(key="waits-1"), Item(key="waits-2"))
    with TestClient(create_app(without_broker(app, ledger))) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert page.text.count('class="banner warn"') == 1
        assert 'id="broker-down"' in page.text
        row = re.search(rf'<tr data-task="{re.escape(TASK)}">.*?</tr>', page.text, re.S)
        assert row is not None
        assert '<td class="num" data-field="queued">2</td>' in row.group(0)  # the ledger's
        assert '<td class="num" data-field="ready">?</td>' in row.group(0)  # the broker's
        document = client.get("/api/overview").json()
        assert document["broker_unreachable"]
        assert document["tasks"][0]["ledger"]["counts"]["queued"] == 2
        task = client.get(f"/tasks/{TASK}")
        assert task.status_code == 200
        assert 'id="broker-down"' in task.text
        assert client.get(f"/api/tasks/{TASK}").json()["broker_unreachable"]
        jobs = client.get("/jobs")  # a ledger page: the banner of the last look
        assert 'id="broker-unreachable"' in jobs.text
        assert "waits-1" in jobs.text


def test_the_history_page_charts_each_range_from_the_executions(
    app: App, ledger: SQLiteStore
) -> None:
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from broker_jobs import Job  # noqa: PLC0415

    now = datetime.now(UTC)

    def finished(key: str, task: str, minutes_ago: float, *, ok: bool) -> None:
        moment = now - timedelta(minutes=minutes_ago)
        ledger.claim(Job(id=f"id-{key}", task=task, idempotency_key=key), "w1", 60, now=moment)
        if ok:
            ledger.succeed(key, "w1", now=moment)
        else:
            ledger.dead(key, "w1", "PermanentError: no", now=moment)

    finished("h1", TASK, 10, ok=True)
    finished("h2", TASK, 10.2, ok=False)
    finished("h3", OTHER, 30, ok=True)
    finished("d1", TASK, 60 * 5, ok=True)  # five hours ago: in the day, not the hour
    finished("w1", TASK, 60 * 24 * 3, ok=False)  # three days ago: in the week only
    with TestClient(create_app(without_broker(app, ledger))) as client:
        hour = client.get("/api/history?range=1h").json()
        assert (hour["range"], hour["bucket_seconds"], len(hour["overall"])) == ("1h", 60, 60)
        assert [
            sum(ok for ok, _ in hour["tasks"][TASK]),
            sum(f for _, f in hour["tasks"][TASK]),
        ] == [1, 1]
        assert sum(ok for ok, _ in hour["tasks"][OTHER]) == 1
        day = client.get("/api/history").json()  # 24h by default
        assert (day["range"], len(day["overall"])) == ("24h", 24)
        assert [sum(ok for ok, _ in day["overall"]), sum(f for _, f in day["overall"])] == [3, 1]
        week = client.get("/api/history?range=7d").json()
        assert len(week["overall"]) == 168
        assert [sum(ok for ok, _ in week["overall"]), sum(f for _, f in week["overall"])] == [3, 2]
        page = client.get("/history?range=7d")
        assert page.status_code == 200
        assert page.text.count('class="chart history-chart"') == 3  # all tasks, then each
        assert "last 7 days, per hour: 3 succeeded, 2 failed" in page.text
        assert 'rect class="failed"' in page.text
        assert client.get("/history?range=1y").status_code == 400


def test_times_in_lists_are_relative_with_the_absolute_time_on_hover(
    app: App, ledger: SQLiteStore
) -> None:
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from broker_jobs import Job  # noqa: PLC0415
    from broker_jobs.dashboard.views import environment  # noqa: PLC0415
    from broker_jobs.ops.readable import when  # noqa: PLC0415

    three_hours_ago = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    ledger.claim(Job(id="id-r1", task=TASK, idempotency_key="r1"), "w1", 60, now=three_hours_ago)
    ledger.succeed("r1", "w1", now=three_hours_ago)
    with TestClient(create_app(without_broker(app, ledger))) as client:
        page = client.get("/jobs").text
    absolute = when(three_hours_ago)
    assert re.search(rf'<time datetime="{absolute}" title="{absolute}">3h0\dm ago</time>', page)
    moment = environment.filters["moment"]
    assert str(moment(datetime.now(UTC) + timedelta(hours=2, seconds=30))).endswith(
        ">in 2h00m</time>"
    )
    assert str(moment(None)) == "-"


def test_the_history_page_charts_the_sampled_queue_depths(app: App, ledger: SQLiteStore) -> None:
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    with TestClient(create_app(without_broker(app, ledger))) as client:
        page = client.get("/history?range=1h").text
        assert 'id="no-depths"' in page  # says how to get them
        assert "depth-chart" not in page
        now = datetime.now(UTC)
        ledger.record_depths(app.namespace, {TASK: 7}, now=now - timedelta(minutes=30))
        ledger.record_depths(app.namespace, {TASK: 40}, now=now - timedelta(minutes=29))
        ledger.record_depths("another", {TASK: 999}, now=now)  # another namespace's
        hour = client.get("/api/history?range=1h").json()
        assert sorted(v for v in hour["depths"][TASK] if v is not None) == [7, 40]
        assert hour["depths"][OTHER] == [None] * 60
        day = client.get("/api/history?range=24h").json()
        # Each hour's largest: [40], or [7, 40] when an hour began between the samples.
        assert [v for v in day["depths"][TASK] if v is not None] in ([40], [7, 40])
        page = client.get("/history?range=1h").text
        assert 'id="no-depths"' not in page
        assert page.count('class="chart depth-chart"') == 1  # the sampled task's only
        assert "at most 40; 2 of 60 buckets sampled" in page
        assert page.count('rect class="depth"') == 2
