"""The web dashboard in a real browser: headless Chromium (Debian's chromium and
chromium-driver) driven by Selenium, against the dashboard served by uvicorn on a free
port, a real broker and an SQLite ledger. What a user sees and clicks: the overview's
counts after publishing, a dead job replayed from its page until it succeeds, a bulk
replay followed on its progress page to its result, a cancel from the jobs list, a
read-only dashboard without buttons that refuses a POST, and a payload and an error
holding markup shown as text (no script runs).

Waits are on conditions (WebDriverWait), never fixed sleeps."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from starlette.applications import Starlette

from broker_jobs import App, JobRequest, Publisher
from broker_jobs.dashboard import DashboardSettings, create_app
from broker_jobs.dashboard.actions import Progress, Result
from broker_jobs.retry import PermanentError
from broker_jobs.store.base import Status, Store
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.urls import BrokerURLs
from tests.support import Broker, run_burst_worker, single_attempt_app, unavailable

pytestmark = pytest.mark.broker

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TASK = "browser.job"
OTHER = "browser.other"
#: Markup that would run if a page inserted it as HTML.
SCRIPT = "<script>window.__xss = 'script'</script>"
IMAGE = "<img src=x onerror=window.__xss='img'>"  # no double quote: JSON would escape it
#: Seconds a wait for the page gives up after.
WAIT = 15


class Item(BaseModel):
    key: str
    note: str = ""
    fail: bool = False


class Handlers:
    """Fails a job with ``fail`` set (permanently: straight to its dead letters, with
    markup in the error) until ``fixed``."""

    def __init__(self) -> None:
        self.fixed = False

    def run(self, item: Item) -> None:
        if item.fail and not self.fixed:
            raise PermanentError(f"refused {SCRIPT} {IMAGE}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (each test opens its own pages)."""
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        unavailable("no Chromium: apt-get install chromium chromium-driver")
    try:
        from selenium import webdriver  # noqa: PLC0415
        from selenium.webdriver.chrome.service import Service  # noqa: PLC0415
    except ImportError:
        unavailable("no selenium: pip install -e '.[dev]'")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root (a container, CI)
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console's lines
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
def app(make_app: Callable[[], App], handlers: Handlers) -> App:
    return single_attempt_app(make_app, (TASK, OTHER), handlers.run)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serving(settings: DashboardSettings) -> contextlib.AbstractContextManager[str]:
    """The dashboard served by uvicorn on a free port in a thread; its base URL."""
    return serving_app(create_app(settings))


@contextlib.contextmanager
def serving_app(web: Starlette) -> Iterator[str]:
    """``web`` (a dashboard app) served by uvicorn on a free port in a thread."""
    import uvicorn  # noqa: PLC0415

    server = uvicorn.Server(
        uvicorn.Config(
            web,
            host="127.0.0.1",
            port=free_port(),
            log_level="warning",
            lifespan="off",
        )
    )
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:  # uvicorn sets it once it listens: no event to await
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("the dashboard's server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


Dashboard = Callable[..., contextlib.AbstractContextManager[str]]


@pytest.fixture
def dashboard(broker: Broker, app: App, ledger: SQLiteStore) -> Dashboard:
    def make(**options: Any) -> contextlib.AbstractContextManager[str]:
        settings = DashboardSettings(
            store=ledger,
            urls=BrokerURLs.parse(broker.url),
            names=app.names,
            tasks=(TASK, OTHER),
            app=app,
            **options,
        )
        return serving(settings)

    return make


def publish(broker: Broker, app: App, store: Store, *items: Item, task: str = TASK) -> None:
    """Publish with the ledger: each job is QUEUED before any worker sees it."""
    with Publisher(broker.url, app, ledger=store) as publisher:
        publisher.publish_many(
            [JobRequest(task, item.model_dump(), idempotency_key=item.key) for item in items]
        )


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415

    return WebDriverWait(driver, WAIT).until(condition, message=what)


#: Times an element replaced by the page's live refresh between finding it and
#: reading it is found again (a busy machine widens that gap).
STALE_READS = 5


def text_of(driver: Any, css: str) -> str:
    """The text of the element at ``css``, found again if the page's live refresh
    replaced it while it was read."""
    from selenium.common.exceptions import StaleElementReferenceException  # noqa: PLC0415
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    for _ in range(STALE_READS - 1):
        try:
            return str(driver.find_element(By.CSS_SELECTOR, css).text)
        except StaleElementReferenceException:
            continue
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def shows(css: str, text: str) -> Callable[[Any], bool]:
    """The element at ``css`` shows exactly ``text`` (stripped)."""
    from selenium.common.exceptions import NoSuchElementException  # noqa: PLC0415

    def check(driver: Any) -> bool:
        try:
            return text_of(driver, css).strip() == text
        except NoSuchElementException:
            return False

    return check


def click(driver: Any, css: str) -> None:
    """Click the element at ``css`` once it is there, and wait for the next page."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.support import expected_conditions as ec  # noqa: PLC0415

    element = wait_for(driver, ec.element_to_be_clickable((By.CSS_SELECTOR, css)), css)
    element.click()
    wait_for(driver, lambda _: is_stale(element), f"the page after clicking {css}")


#: What chromedriver answers, instead of a stale element reference, for an element of a
#: page being replaced at that moment (the node is gone from the new document).
NODE_GONE = "does not belong to the document"


def is_stale(element: Any) -> bool:
    """Whether ``element`` left the document (selenium's staleness_of, plus
    chromedriver's other word for it during a navigation)."""
    from selenium.common.exceptions import (  # noqa: PLC0415
        StaleElementReferenceException,
        WebDriverException,
    )

    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if NODE_GONE in str(error):
            return True
        raise
    return False


def action_buttons(driver: Any) -> list[Any]:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    return list(driver.find_elements(By.CSS_SELECTOR, "form[method=post] button"))


def test_the_overview_shows_the_counts_after_publishing(
    browser: Any, broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="a"), Item(key="b"), Item(key="c"))
    publish(broker, app, ledger, Item(key="d"), task=OTHER)
    with dashboard() as base:
        browser.get(f"{base}/")
        row = f"tr[data-task='{TASK}']"
        other = f"tr[data-task='{OTHER}']"
        wait_for(browser, shows(f"{row} [data-field=ready]", "3"), "3 ready in the queue")
        assert text_of(browser, f"{row} [data-field=queued]") == "3"
        assert text_of(browser, f"{other} [data-field=ready]") == "1"
        assert text_of(browser, f"{other} [data-field=queued]") == "1"
        assert text_of(browser, f"{row} [data-field=consumers]") == "0"
        # Published after the page was loaded: its live refresh shows them.
        publish(broker, app, ledger, Item(key="e"), Item(key="f"))
        wait_for(browser, shows(f"{row} [data-field=ready]", "5"), "5 ready after a refresh")
        wait_for(browser, shows(f"{row} [data-field=queued]", "5"), "5 queued after a refresh")
        # Nothing on the page failed to load (a favicon.ico 404 once did) or raised.
        errors = [line for line in browser.get_log("browser") if line["level"] == "SEVERE"]
        assert not errors, errors


def test_a_dead_job_is_replayed_from_its_page_and_then_succeeds(
    browser: Any,
    broker: Broker,
    app: App,
    ledger: SQLiteStore,
    dashboard: Dashboard,
    handlers: Handlers,
) -> None:
    publish(broker, app, ledger, Item(key="bad-1", fail=True))
    run_burst_worker(broker, app, ledger)
    handlers.fixed = True
    with dashboard(allow_actions=True) as base:
        browser.get(f"{base}/jobs/bad-1")
        wait_for(browser, shows("#state", "dead"), "the job is dead")
        click(browser, "button[name=replay]")
        wait_for(browser, shows("h1", "Confirm: replay"), "the confirmation page")
        assert "bad-1" in text_of(browser, "#question")
        click(browser, "button[name=confirm]")
        wait_for(browser, shows("[data-count=replayed]", "1"), "one dead letter replayed")
        run_burst_worker(broker, app, ledger)
        browser.get(f"{base}/jobs/bad-1")
        wait_for(browser, shows("#state", "succeeded"), "the job succeeded")
        cells = browser.find_elements("css selector", "#executions td.outcome")
        assert [cell.text.strip() for cell in cells] == ["dead", "succeeded"]
    record = ledger.get("bad-1")
    assert record is not None
    assert record.status is Status.SUCCEEDED


def test_a_bulk_replay_lands_on_its_progress_page_and_ends_with_the_counts(
    browser: Any,
    broker: Broker,
    app: App,
    ledger: SQLiteStore,
    dashboard: Dashboard,
    handlers: Handlers,
) -> None:
    publish(broker, app, ledger, *(Item(key=f"bulk-{n}", fail=True) for n in range(3)))
    run_burst_worker(broker, app, ledger)
    handlers.fixed = True
    with dashboard(allow_actions=True) as base:
        browser.get(f"{base}/dead-letters")
        click(browser, "#matching button[name=replay]")
        wait_for(browser, shows("h1", "Confirm: replay"), "the confirmation page")
        click(browser, "button[name=confirm]")
        assert "/operations/" in browser.current_url
        # Finished on arrival, or later: then the script reloads the page.
        wait_for(browser, shows("[data-count=replayed]", "3"), "three dead letters replayed")
        assert text_of(browser, "[data-count=scanned]") == "3"
        assert browser.execute_script("return window.__xss === undefined")
    run_burst_worker(broker, app, ledger)
    for n in range(3):
        record = ledger.get(f"bulk-{n}")
        assert record is not None
        assert record.status is Status.SUCCEEDED


def test_the_progress_page_moves_its_bar_and_shows_the_result_when_done(
    browser: Any, broker: Broker, app: App, ledger: SQLiteStore
) -> None:
    """An operation the test holds at each step, so the page is seen while it runs."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    settings = DashboardSettings(
        store=ledger, urls=BrokerURLs.parse(broker.url), names=app.names, tasks=(TASK,), app=app
    )
    web = create_app(settings)
    halfway, end = threading.Event(), threading.Event()

    def work(progress: Progress) -> Result:
        halfway.wait(WAIT)
        progress(2, 4)
        end.wait(WAIT)
        progress(4, 4)
        return Result("purge", "purged 4 dead letter(s)", {"purged": 4})

    with serving_app(web) as base:
        operation = web.state.operations.start("purge", "tester", work)
        browser.get(f"{base}/operations/{operation.id}")
        wait_for(browser, shows("#running", "purge: running…"), "the running page")
        bar = browser.find_element(By.CSS_SELECTOR, "#progress")
        assert bar.get_attribute("value") in {None, "0"}  # indeterminate: no total yet
        halfway.set()
        wait_for(browser, shows("[data-field=done]", "2"), "2 looked at, shown by the script")
        assert text_of(browser, "[data-field=total]") == "4"
        assert bar.get_attribute("value") == "2"
        assert bar.get_attribute("max") == "4"
        end.set()
        wait_for(browser, shows("[data-count=purged]", "4"), "the result once finished")
        assert text_of(browser, "#result") == "purged 4 dead letter(s)"


def test_a_job_is_cancelled_from_the_jobs_list(
    browser: Any, broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="keep"), Item(key="drop"))
    with dashboard(allow_actions=True) as base:
        browser.get(f"{base}/jobs?state=queued")
        wait_for(browser, shows("tr[data-key=drop] .state", "queued"), "the job in the list")
        click(browser, "tr[data-key=drop] a")
        wait_for(browser, shows("#state", "queued"), "the job's page")
        click(browser, "button[name=cancel]")
        wait_for(browser, shows("h1", "Confirm: cancel"), "the confirmation page")
        click(browser, "button[name=confirm]")
        browser.get(f"{base}/jobs")
        wait_for(browser, shows("tr[data-key=drop] .state", "cancelled"), "cancelled in the list")
        assert text_of(browser, "tr[data-key=keep] .state") == "queued"
    dropped, kept = ledger.get("drop"), ledger.get("keep")
    assert dropped is not None
    assert dropped.status is Status.CANCELLED
    assert kept is not None
    assert kept.status is Status.QUEUED


def test_a_read_only_dashboard_has_no_action_buttons_and_refuses_a_post(
    browser: Any, broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="waiting"), Item(key="bad-2", fail=True))
    with dashboard() as base:
        for path in ("/", "/jobs", "/jobs/waiting", "/dead-letters", f"/tasks/{TASK}"):
            browser.get(f"{base}{path}")
            wait_for(browser, lambda driver: driver.find_elements("css selector", "h1"), path)
            assert action_buttons(browser) == [], f"{path} has no action buttons"
        # A form posted anyway (with the page's CSRF token) is refused.
        browser.get(f"{base}/jobs/waiting")
        status = browser.execute_async_script(
            """
            const done = arguments[arguments.length - 1];
            const token = document.querySelector('meta[name="csrf-token"]').content;
            const form = new URLSearchParams({csrf_token: token, ref: 'waiting', confirm: 'yes'});
            fetch('/actions/cancel', {method: 'POST', body: form})
                .then(answer => done(answer.status), error => done(String(error)));
            """
        )
        assert status == 403
    record = ledger.get("waiting")
    assert record is not None
    assert record.status is Status.QUEUED


def test_markup_in_a_payload_and_an_error_is_shown_as_text(
    browser: Any, broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(broker, app, ledger, Item(key="xss", note=f"{SCRIPT} {IMAGE}", fail=True))
    run_burst_worker(broker, app, ledger)
    with dashboard(allow_actions=True) as base:
        browser.get(f"{base}/jobs/xss")
        wait_for(browser, shows("#state", "dead"), "the job is dead")
        assert SCRIPT in text_of(browser, "#payload")
        assert IMAGE in text_of(browser, "#payload")
        assert SCRIPT in text_of(browser, "#last-error")
        for path in ("/jobs/xss", "/jobs", "/dead-letters", f"/tasks/{TASK}"):
            browser.get(f"{base}{path}")
            wait_for(browser, lambda driver: driver.find_elements("css selector", "h1"), path)
            assert "<script>window.__xss" in browser.find_element("css selector", "main").text
            assert browser.execute_script("return window.__xss === undefined"), path
            assert browser.find_elements("css selector", "main script, main img") == [], path


def test_the_workers_page_follows_a_worker_from_running_a_job_to_stopped(
    browser: Any,
    broker: Broker,
    make_app: Callable[[], App],
    ledger: SQLiteStore,
    dashboard: Dashboard,
) -> None:
    import asyncio  # noqa: PLC0415

    from broker_jobs import Worker, WorkerSettings  # noqa: PLC0415

    app = make_app()
    started, release = threading.Event(), threading.Event()

    @app.task(TASK)
    def hold(payload: Item) -> None:
        started.set()
        release.wait(WAIT * 4)

    publish(broker, app, ledger, Item(key="held-job"))
    settings = WorkerSettings(
        tasks=(TASK,), concurrency=2, heartbeat_every=0.2, worker_id="w-browser"
    )
    worker = Worker(broker.url, app, ledger, settings)
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(asyncio.run(worker.run())))
    thread.start()
    try:
        assert started.wait(WAIT * 2), "the worker started the job"
        with dashboard(refresh_seconds=1) as base:
            browser.get(f"{base}/workers")
            row = "tr[data-id='w-browser']"
            wait_for(browser, shows(f"{row} td.state", "alive"), "the worker alive")
            wait_for(browser, shows("tr[data-job-id] td a", "held-job"), "its running job listed")
            worker.stop()
            release.set()
            # The page's live refresh follows the worker to its last heartbeat.
            wait_for(browser, shows(f"{row} td.state", "stopped"), "the worker stopped")
            wait_for(browser, shows("#running-jobs td.muted", "none"), "no job running")
    finally:
        worker.stop()
        release.set()
        thread.join(WAIT * 2)
    assert outcome, "the worker returned"


def test_a_table_is_sorted_by_its_headers_and_stays_sorted_when_refreshed(
    browser: Any, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    from dataclasses import replace  # noqa: PLC0415
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from selenium.common.exceptions import StaleElementReferenceException  # noqa: PLC0415
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.common.keys import Keys  # noqa: PLC0415

    from broker_jobs.observe.heartbeat import process_record  # noqa: PLC0415
    from broker_jobs.store.processes import ProcessKind  # noqa: PLC0415

    now = datetime.now(UTC)
    record = process_record(ProcessKind.WORKER, "w", app.namespace, tasks=[TASK], concurrency=4)
    # The server lists them most recently seen first: a, b, c.
    for n, (name, pid, started) in enumerate((("w-a", 9, 30), ("w-b", 100, 5), ("w-c", 10, 120))):
        ledger.record_process(
            replace(
                record,
                id=name,
                pid=pid,
                started_at=now - timedelta(minutes=started),
                seen_at=now - timedelta(seconds=n),
                every=3600.0,  # alive for the whole test
            )
        )

    # Read and pressed in one script each: the page's live refresh (every second)
    # replaces the table, so an element found by one call may be gone at the next.
    def order() -> list[str]:
        rows = "#workers tbody tr"
        found = browser.execute_script(
            f"return [...document.querySelectorAll('{rows}')].map(r => r.dataset.id)"
        )
        return list(found)

    def sorted_by() -> str | None:
        """The header the table is sorted by, and its aria-sort."""
        found = browser.execute_script(
            "const th = document.querySelector('#workers th[aria-sort]');"
            " return th && [th.textContent, th.getAttribute('aria-sort')];"
        )
        return None if not found else f"{found[0].strip(' ▲▼')}: {found[1]}"

    def press(column: int, key: str | None = None) -> None:
        """Click the header button of ``column``, or send it ``key`` (the keyboard)."""
        button = f"#workers th button[data-focus='sort:workers:{column}']"
        for _ in range(STALE_READS):
            try:
                element = browser.find_element(By.CSS_SELECTOR, button)
                if key is None:
                    element.click()
                else:
                    element.send_keys(key)
            except StaleElementReferenceException:
                continue
            else:
                return
        pytest.fail(f"the header button {button} kept being replaced")

    with dashboard(refresh_seconds=1) as base:
        browser.get(f"{base}/workers")
        pid, started = 4, 9  # the columns
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "th button.sort"), "buttons")
        assert order() == ["w-a", "w-b", "w-c"]
        assert sorted_by() is None
        press(pid)
        assert order() == ["w-a", "w-c", "w-b"]  # 9, 10, 100: numbers, not text
        assert sorted_by() == "pid: ascending"
        press(pid, Keys.ENTER)  # the keyboard
        assert order() == ["w-b", "w-c", "w-a"]
        assert sorted_by() == "pid: descending"
        press(started)
        assert order() == ["w-c", "w-a", "w-b"]  # by time, not by "2h00m" < "5m00s"
        assert sorted_by() == "started: ascending"
        # The live refresh replaces the table: sorted again, the focus kept.
        before = browser.execute_script("return document.querySelector('#live').dataset.refreshed")
        wait_for(
            browser,
            lambda d: (
                d.execute_script("return document.querySelector('#live').dataset.refreshed")
                != before
            ),
            "a live refresh",
        )
        assert order() == ["w-c", "w-a", "w-b"]
        assert sorted_by() == "started: ascending"
        focused = browser.execute_script("return document.activeElement.dataset.focus")
        assert focused == f"sort:workers:{started}"


def test_a_task_is_paused_and_resumed_from_its_page(
    browser: Any, broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    with dashboard(allow_actions=True) as base:
        browser.get(f"{base}/tasks/{TASK}")
        wait_for(browser, shows("#paused", "no"), "the task not paused")
        click(browser, "#task-pause")
        wait_for(browser, shows("h1", "Confirm: pause"), "the confirmation page")
        click(browser, "button[name=confirm]")
        assert list(ledger.pauses(app.namespace)) == [TASK]
        browser.get(f"{base}/")
        row = f"tr[data-task='{TASK}']"
        wait_for(browser, shows(f"{row} [data-field=paused]", "paused"), "the overview's badge")
        browser.get(f"{base}/tasks/{TASK}")
        wait_for(browser, lambda d: text_of(d, "#paused").startswith("paused since"), "paused")
        click(browser, "#task-resume")
        wait_for(browser, shows("h1", "Confirm: resume"), "the confirmation page")
        click(browser, "button[name=confirm]")
        assert ledger.pauses(app.namespace) == {}
        browser.get(f"{base}/tasks/{TASK}")
        wait_for(browser, shows("#paused", "no"), "the task resumed")


def test_the_history_page_draws_the_charts_of_each_range(
    browser: Any, broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    publish(broker, app, ledger, Item(key="ok-1"), Item(key="ok-2"), Item(key="bad", fail=True))
    run_burst_worker(broker, app, ledger)
    with dashboard() as base:
        browser.get(f"{base}/history?range=1h")
        overall = "section[data-task='all tasks']"
        wait_for(browser, shows(f"{overall} .totals", "2 ok / 1 failed"), "the hour's totals")
        rects = browser.find_elements(By.CSS_SELECTOR, f"{overall} svg rect")
        kinds = sorted({rect.get_attribute("class") for rect in rects})
        assert kinds == ["failed", "ok"]
        assert all(rect.size["height"] > 0 for rect in rects)  # drawn, not empty
        chart = browser.find_element(By.CSS_SELECTOR, f"{overall} svg")
        assert chart.size["width"] == 840
        click(browser, "#ranges a[href='/history?range=7d']")
        wait_for(browser, shows("#ranges strong", "last 7 days, per hour"), "the week")
        assert text_of(browser, f"{overall} .totals") == "2 ok / 1 failed"


#: The pages the layout test opens (a job's page is added with a real key).
LAYOUT_PAGES = ("/", f"/tasks/{TASK}", "/jobs", "/dead-letters", "/history", "/workers",
                "/schedules")  # fmt: skip
#: The times in tables whose text takes more than one line (a <time> in a cell gives
#: a rectangle for itself and one for its text on the same line: lines are counted).
FOLDED_TIMES = """
return [...document.querySelectorAll('td.time')].filter(td => {
  const range = document.createRange(); range.selectNodeContents(td);
  const lines = new Set([...range.getClientRects()].map(rect => Math.round(rect.top)));
  return lines.size > 1;
}).map(td => td.textContent);
"""


def test_no_page_scrolls_sideways_at_900_px_and_no_time_folds(
    browser: Any, broker: Broker, app: App, ledger: SQLiteStore, dashboard: Dashboard
) -> None:
    publish(
        broker, app, ledger, *(Item(key=f"tenant-{n}/invoice-{n}", fail=n == 0) for n in range(3))
    )
    run_burst_worker(broker, app, ledger)
    pages = [*LAYOUT_PAGES, "/jobs/tenant-0%2Finvoice-0"]
    try:
        with dashboard(allow_actions=True) as base:
            for width in (900, 1400):
                browser.set_window_size(width, 900)
                for path in pages:
                    browser.get(f"{base}{path}")
                    wait_for(browser, lambda d: d.find_elements("css selector", "h1"), path)
                    sideways = browser.execute_script(
                        "return document.documentElement.scrollWidth - window.innerWidth"
                    )
                    assert sideways <= 0, f"{path} at {width} px scrolls sideways by {sideways} px"
                    assert browser.execute_script(FOLDED_TIMES) == [], f"{path} at {width} px"
    finally:
        browser.set_window_size(1280, 900)
