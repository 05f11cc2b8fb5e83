"""The Starlette app: routes, static files, and how a refusal or a failure of the
broker or the store is answered (a page, or JSON under /api/)."""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from broker_jobs.dashboard import api, operations, pages, posts
from broker_jobs.dashboard.headers import SecurityHeaders
from broker_jobs.dashboard.operations import Operations, masked
from broker_jobs.dashboard.safety import Refused
from broker_jobs.dashboard.settings import DashboardSettings
from broker_jobs.dashboard.views import render
from broker_jobs.errors import BrokerJobsError

logger = logging.getLogger("broker_jobs.dashboard")
UNAVAILABLE = 503


def create_app(settings: DashboardSettings) -> Starlette:
    """The dashboard over ``settings`` (whose store the caller opens and closes)."""
    routes = [
        Route("/", pages.overview_page),
        Route("/tasks/{task}", pages.task_page),
        Route("/jobs", pages.jobs_page),
        Route("/jobs/{ref:path}", pages.job_page),
        Route("/job", pages.job_page),  # ?ref=: a key no path can carry (views.job_href)
        Route("/dead-letters", pages.dead_letters_page),
        Route("/schedules", pages.schedules_page),
        Route("/workers", pages.workers_page),
        Route("/history", pages.history_page),
        Route("/api/overview", api.overview),
        Route("/api/tasks/{task}", api.task),
        Route("/api/jobs", api.jobs),
        Route("/api/jobs/{ref:path}", api.job),
        Route("/api/dead-letters", api.dead_letters),
        Route("/api/schedules", api.schedules),
        Route("/api/workers", api.workers),
        Route("/api/history", api.history),
        Route("/operations/{id}", operations.operation_page),
        Route("/api/operations/{id}", operations.operation_api),
        Route("/actions/cancel", posts.cancel, methods=["POST"]),
        Route("/actions/replay", posts.replay, methods=["POST"]),
        Route("/actions/purge", posts.purge, methods=["POST"]),
        Route("/actions/pause", posts.pause, methods=["POST"]),
        Route("/actions/resume", posts.resume, methods=["POST"]),
        Mount(
            "/static", StaticFiles(packages=[("broker_jobs.dashboard", "static")]), name="static"
        ),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(SecurityHeaders),  # outermost: the Host check's refusals get them too
            Middleware(TrustedHostMiddleware, allowed_hosts=list(settings.served_hosts())),
        ],
        exception_handlers={Refused: _refused, BrokerJobsError: _failed},
    )
    app.state.settings = settings
    app.state.operations = Operations()  # the bulk actions running, and the last finished
    return app


def _answer(request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    settings: DashboardSettings = request.app.state.settings
    return render(request, settings, "error.html", {"status": status, "message": message}, status)


async def _refused(request: Request, error: Exception) -> Response:
    assert isinstance(error, Refused)
    if error.status in {401, 403}:
        client = request.client.host if request.client else "unknown client"
        logger.warning(
            "dashboard refused %s %s from %s: %s",
            request.method,
            request.url.path,
            client,
            error.reason,
        )
    return _answer(request, error.status, error.reason)


async def _failed(request: Request, error: Exception) -> Response:
    """The broker or the store failed: the page says so (a status is most wanted when
    something is wrong), passwords masked."""
    message = masked(error)
    logger.warning("dashboard %s failed: %s", request.url.path, message)
    return _answer(request, UNAVAILABLE, message)
