"""The JSON API under /api/: the pages' data as documents (times ISO 8601 UTC,
durations in seconds), for scripts and for the pages' own tests."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from broker_jobs.dashboard import queries
from broker_jobs.dashboard.filters import JobFilter, LetterFilter, page_number
from broker_jobs.dashboard.pages import history_range, known_task, settings_of
from broker_jobs.dashboard.safety import Refused
from broker_jobs.ops.documents import (
    encode_cursor,
    execution_document,
    follow_ups_document,
    payload_document,
    record_document,
    result_document,
)


async def overview(request: Request) -> JSONResponse:
    found = await run_in_threadpool(queries.overview, settings_of(request))
    return JSONResponse(found.document())


async def task(request: Request) -> JSONResponse:
    settings = settings_of(request)
    name = known_task(settings, request.path_params["task"])
    view = await run_in_threadpool(queries.task_view, settings, name)
    return JSONResponse(view.document())


async def jobs(request: Request) -> JSONResponse:
    chosen = JobFilter.read(request.query_params)
    listed = await run_in_threadpool(queries.jobs, settings_of(request), chosen)
    page = listed.page
    return JSONResponse(
        {
            "jobs": [record_document(record) for record in page.records],
            "next": encode_cursor(page.after) if page.after else None,
            "matching": listed.matching,
            "order": chosen.order,
        }
    )


async def job(request: Request) -> JSONResponse:
    ref = request.path_params["ref"]
    view = await run_in_threadpool(queries.job_view, settings_of(request), ref)
    if view is None:
        raise Refused(404, f"no job with key or id {ref!r} in the ledger")
    return JSONResponse(
        {
            "job": record_document(view.record),
            "payload": payload_document(view.kept_payload),  # the ledger's; None: not kept
            "result": result_document(view.output),
            "follow_ups": follow_ups_document(view.output),
            "executions": [execution_document(run) for run in view.executions],
            "dead_letter": view.dead_letter.to_json() if view.dead_letter else None,
            "dead_letter_problem": view.dead_letter_problem,
        }
    )


async def dead_letters(request: Request) -> JSONResponse:
    chosen = LetterFilter.read(request.query_params)
    view = await run_in_threadpool(
        queries.letters_view, settings_of(request), chosen, page_number(request.query_params)
    )
    return JSONResponse(view.document())


async def schedules(request: Request) -> JSONResponse:
    return JSONResponse(await run_in_threadpool(queries.schedules, settings_of(request)))


async def history(request: Request) -> JSONResponse:
    view = await run_in_threadpool(queries.history, settings_of(request), history_range(request))
    return JSONResponse(view.document())


async def workers(request: Request) -> JSONResponse:
    view = await run_in_threadpool(queries.workers, settings_of(request))
    return JSONResponse(view.document())
