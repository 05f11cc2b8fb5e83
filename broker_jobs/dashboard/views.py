"""The Jinja2 environment of the pages (autoescape on: every value from a job is
text, never markup) and the one way a page is rendered."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse

from broker_jobs.dashboard.safety import CSRF_COOKIE, CSRF_FIELD, TOKEN_FIELD, csrf_value
from broker_jobs.dashboard.settings import DashboardSettings
from broker_jobs.ops.readable import first_line, span, when

#: Sent with every page: no script but our own file, no framing (clickjacking of the
#: action buttons), no sniffing.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def _age(moment: datetime | None, now: datetime | None = None) -> str:
    if moment is None:
        return "-"
    return span((now or datetime.now(moment.tzinfo)) - moment)


def _seconds(duration: timedelta | None) -> str:
    return span(duration)


def _depth(value: int | None, exists: bool = True) -> str:
    """A queue's figure from the broker: ``missing`` for a queue that does not exist,
    ``?`` when the broker could not be asked."""
    if not exists:
        return "missing"
    return "?" if value is None else str(value)


def _moment(moment: datetime | None) -> Markup:
    """A time as people read it in a list, relative (``3m05s ago``, ``in 2h00m``), the
    absolute UTC time on hover and in the ``datetime`` attribute (for scripts)."""
    if moment is None:
        return Markup("-")
    absolute = when(moment)
    offset = moment - datetime.now(moment.tzinfo)
    said = f"in {span(offset)}" if offset.total_seconds() > 0 else f"{span(-offset)} ago"
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(absolute, said)


def _pretty(value: Any) -> str:
    """JSON for people; a plain string, so autoescape makes its markup text (Jinja's
    tojson would show ``<`` as ``\\u003c``)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _ref(value: str) -> str:
    """A task name in a URL path."""
    return quote(value, safe="/")


#: Keys a path cannot carry: a browser removes a "." or ".." segment, encoded or not.
_DOT_SEGMENTS = frozenset({".", ".."})


def job_href(ref: str) -> str:
    """The link to a job's page by key or id. Everything but letters, digits and
    ``-._~`` is encoded, slashes included, so a key is one path segment and a
    ``tenant/../../dead-letters`` cannot lead the browser to another page (the
    routes decode it back); a key that is itself a dot segment goes in the query."""
    if ref in _DOT_SEGMENTS:
        return "/job?ref=" + quote(ref, safe="")
    return "/jobs/" + quote(ref, safe="")


environment = Environment(
    loader=PackageLoader("broker_jobs.dashboard", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.filters.update(
    when=when,
    span=_seconds,
    age=_age,
    first_line=first_line,
    ref=_ref,
    job_href=job_href,
    pretty=_pretty,
    depth=_depth,
    moment=_moment,
)


def render(
    request: Request,
    settings: DashboardSettings,
    template: str,
    context: dict[str, Any],
    status: int = 200,
) -> HTMLResponse:
    """A page; a new CSRF token becomes the browser's cookie (see safety)."""
    csrf, new = csrf_value(request)
    page = environment.get_template(template).render(
        request=request,
        settings=settings,
        csrf_field=CSRF_FIELD,
        csrf=csrf,
        token_field=TOKEN_FIELD,
        actions=settings.allow_actions,
        **context,
    )
    response = HTMLResponse(page, status_code=status, headers=SECURITY_HEADERS)
    if new:
        response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict", path="/")
    return response
