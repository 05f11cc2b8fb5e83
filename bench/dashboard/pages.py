"""The dashboard over HTTP: served by uvicorn in-process (a thread), on a namespace
whose queues are declared, each page and JSON endpoint timed."""

from __future__ import annotations

import contextlib
import importlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bench.common import Admin
from bench.dashboard.timing import Timing, deep_cursor, timed
from broker_jobs.store import Store
from broker_jobs.store.base import Status


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serving(app: Any, port: int | None = None) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    import uvicorn  # noqa: PLC0415

    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the dashboard's server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def dashboard_settings(store: Store, url: str, namespace: str, tasks: Sequence[str]) -> Any:
    from broker_jobs.dashboard.settings import DashboardSettings  # noqa: PLC0415
    from broker_jobs.urls import BrokerURLs  # noqa: PLC0415
    from topology.names import Names  # noqa: PLC0415

    return DashboardSettings(
        store=store, urls=BrokerURLs.parse(url), names=Names(namespace), tasks=tuple(tasks)
    )


def declare_topology(url: str, namespace: str, tasks: Sequence[str]) -> Callable[[], None]:
    """The namespace's queues and exchanges (so the overview reads real queues); returns
    what deletes them."""
    from pydantic import BaseModel  # noqa: PLC0415

    from broker_jobs import App  # noqa: PLC0415

    class Payload(BaseModel):
        pass

    app = App(namespace=namespace)
    for task in tasks:
        app.declare(task, Payload)
    topology = app.topology()
    with Admin(url) as admin:
        admin.declare(topology)

    def delete() -> None:
        with Admin(url) as admin:
            admin.delete(topology)

    return delete


def http_client_module() -> Any:
    """httpx's module: ``httpx2`` (what the test extras install, for starlette's
    TestClient) or ``httpx``, whichever is there; both have ``Client``."""
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ModuleNotFoundError):
            return importlib.import_module(name)
    raise SystemExit(
        "bench.dashboard needs an HTTP client: pip install -e '.[test]' (httpx2) or httpx"
    )


def page_timings(base: str, store: Store, requests: int, depth: int) -> list[Timing]:
    """Each page and JSON endpoint, ``requests`` times over one keep-alive connection."""
    httpx = http_client_module()

    from broker_jobs.ops.documents import encode_cursor  # noqa: PLC0415

    dead = store.find(status=Status.DEAD, limit=1) or store.find(limit=1)
    ref = dead[0].idempotency_key
    cursor = deep_cursor(store, depth)
    deep = f"after={encode_cursor(cursor)}" if cursor else ""
    oldest = deep_cursor(store, depth, oldest_first=True)
    deep_oldest = f"order=oldest&after={encode_cursor(oldest)}" if oldest else "order=oldest"
    task = "email.send"
    paths = {
        "/": "/",
        "/api/overview": "/api/overview",
        f"/tasks/{task}": f"/tasks/{task}",
        f"/api/tasks/{task}": f"/api/tasks/{task}",
        "/jobs": "/jobs",
        f"/jobs (page at record {depth})": f"/jobs?{deep}",
        "/jobs?order=oldest": "/jobs?order=oldest",
        f"/jobs?order=oldest (page at record {depth})": f"/jobs?{deep_oldest}",
        "/jobs?state=failed": "/jobs?state=failed",
        "/jobs?state=succeeded": "/jobs?state=succeeded",
        f"/jobs?task={task}": f"/jobs?task={task}",
        f"/jobs?task={task}&state=dead": f"/jobs?task={task}&state=dead",
        f"/jobs?task={task}&state=succeeded": f"/jobs?task={task}&state=succeeded",
        "/jobs?key=<prefix of one key>": f"/jobs?key={ref[:13]}",
        "/api/jobs": "/api/jobs",
        f"/api/jobs (page at record {depth})": f"/api/jobs?{deep}",
        "/api/jobs?order=oldest": "/api/jobs?order=oldest",
        "/jobs/{ref} (dead)": f"/jobs/{ref}",
        "/api/jobs/{ref}": f"/api/jobs/{ref}",
        "/dead-letters": "/dead-letters",
        f"/dead-letters?task={task}&reason=schema": f"/dead-letters?task={task}&reason=schema",
        "/dead-letters?error=refused": "/dead-letters?error=refused",
        "/api/dead-letters": "/api/dead-letters",
        "/schedules": "/schedules",
        "/api/schedules": "/api/schedules",
        "/history?range=1h": "/history?range=1h",
        "/history (24h)": "/history",
        "/history?range=7d": "/history?range=7d",
        "/api/history?range=7d": "/api/history?range=7d",
        "/workers": "/workers",
    }
    timings = []
    with httpx.Client(base_url=base, timeout=60) as client:
        for name, path in paths.items():

            def get(path: str = path) -> None:
                answer = client.get(path)
                if answer.status_code != 200:
                    raise RuntimeError(f"GET {path}: {answer.status_code} {answer.text[:300]}")

            timings.append(timed(name, get, requests))
    return timings
