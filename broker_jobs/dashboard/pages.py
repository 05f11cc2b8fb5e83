"""The HTML pages (GET). Each reads in a worker thread and renders a template."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from broker_jobs.dashboard import queries
from broker_jobs.dashboard.chart import HISTORY_RANGES, HistoryRange
from broker_jobs.dashboard.filters import ORDERS, JobFilter, LetterFilter, page_number
from broker_jobs.dashboard.safety import Refused
from broker_jobs.dashboard.settings import DashboardSettings
from broker_jobs.dashboard.views import render
from broker_jobs.store.base import Status
from broker_jobs.store.records import CANCELLABLE


def settings_of(request: Request) -> DashboardSettings:
    settings: DashboardSettings = request.app.state.settings
    return settings


def known_task(settings: DashboardSettings, task: str) -> str:
    if task not in settings.tasks:
        raise Refused(404, f"no task {task!r} on this dashboard")
    return task


async def overview_page(request: Request) -> Response:
    settings = settings_of(request)
    overview = await run_in_threadpool(queries.overview, settings)
    template = "_overview.html" if request.query_params.get("fragment") else "overview.html"
    return render(request, settings, template, {"overview": overview})


async def task_page(request: Request) -> Response:
    settings = settings_of(request)
    task = known_task(settings, request.path_params["task"])
    view = await run_in_threadpool(queries.task_view, settings, task)
    template = "_task.html" if request.query_params.get("fragment") else "task.html"
    return render(request, settings, template, {"view": view, "task": task})


async def jobs_page(request: Request) -> Response:
    settings = settings_of(request)
    chosen = JobFilter.read(request.query_params)
    listed = await run_in_threadpool(queries.jobs, settings, chosen)
    page = listed.page
    return render(
        request,
        settings,
        "jobs.html",
        {
            "page": page,
            "matching": listed.matching,
            "filter": chosen,
            "states": [status.value for status in Status],
            "orders": ORDERS,
            "next_query": chosen.query(page.after) if page.after else None,
            "first_query": chosen.query() if chosen.after else None,
            # the "updated" header: the first page of the other order
            "reorder_query": chosen.query(order="newest" if chosen.oldest_first else "oldest"),
        },
    )


async def job_page(request: Request) -> Response:
    settings = settings_of(request)
    ref = request.path_params.get("ref") or request.query_params.get("ref", "")
    view = await run_in_threadpool(queries.job_view, settings, ref)
    if view is None:
        raise Refused(404, f"no job with key or id {ref!r} in the ledger")
    cancellable = view.record.waiting_status in CANCELLABLE
    return render(
        request,
        settings,
        "job.html",
        {
            "view": view,
            "record": view.record,
            "cancellable": cancellable,
            "replayable": view.dead_letter is not None and view.record.task in settings.tasks,
        },
    )


async def dead_letters_page(request: Request) -> Response:
    settings = settings_of(request)
    chosen = LetterFilter.read(request.query_params)
    view = await run_in_threadpool(
        queries.letters_view, settings, chosen, page_number(request.query_params)
    )
    return render(request, settings, "dead_letters.html", {"view": view, "filter": chosen})


async def schedules_page(request: Request) -> Response:
    settings = settings_of(request)
    document = await run_in_threadpool(queries.schedules, settings)
    return render(request, settings, "schedules.html", {"document": document})


def history_range(request: Request) -> HistoryRange:
    """``?range=`` (1h, 24h, 7d; default 24h); anything else is a 400."""
    name = request.query_params.get("range", "24h")
    if name not in HISTORY_RANGES:
        raise Refused(400, f"range={name!r}: one of {', '.join(HISTORY_RANGES)}")
    return HISTORY_RANGES[name]


async def history_page(request: Request) -> Response:
    settings = settings_of(request)
    view = await run_in_threadpool(queries.history, settings, history_range(request))
    return render(request, settings, "history.html", {"view": view, "ranges": HISTORY_RANGES})


async def workers_page(request: Request) -> Response:
    settings = settings_of(request)
    view = await run_in_threadpool(queries.workers, settings)
    template = "_workers.html" if request.query_params.get("fragment") else "workers.html"
    return render(request, settings, template, {"view": view})
