"""Who may act, and how a POST proves it came from one of our pages.

CSRF: a random token in a cookie (``SameSite=Strict``, ``HttpOnly``) that every
form repeats in a hidden field (double submit). A page on another site can make a
browser send the cookie's request, but can neither read the cookie nor the form, so
it cannot repeat the value. An ``Origin`` header naming another host is refused too.

Actions: none unless started with ``--allow-actions``; with a token set, every
action must carry it (the confirmation form's ``token`` field, or ``Authorization:
Bearer``).
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request

from broker_jobs.dashboard.settings import DashboardSettings

CSRF_COOKIE = "bj_csrf"
CSRF_FIELD = "csrf_token"
TOKEN_FIELD = "token"
#: A form larger than this is refused: a selection of dead letters is a few KiB.
MAX_FORM_BYTES = 1 << 20

Form = dict[str, list[str]]


class Refused(Exception):
    """A request that must not be served: ``status`` and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def csrf_value(request: Request) -> tuple[str, bool]:
    """The browser's CSRF token, and whether it is new (then set the cookie)."""
    known = request.cookies.get(CSRF_COOKIE)
    if known and len(known) >= 32:
        return known, False
    return secrets.token_urlsafe(32), True


async def read_form(request: Request) -> Form:
    """The URL-encoded body of a POST (our forms send nothing else)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise Refused(413, "the form is too large")
    try:
        return parse_qs(body.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise Refused(400, "the form is not UTF-8") from None


def field(form: Form, name: str) -> str:
    """A form field's first value ('' when absent)."""
    values = form.get(name)
    return values[0] if values else ""


def check_post(request: Request, form: Form, settings: DashboardSettings) -> None:
    """Actions allowed, same origin, the CSRF token repeated: or :class:`Refused`."""
    if not settings.allow_actions:
        raise Refused(
            403, "this dashboard is read-only: start it with --allow-actions to act on jobs"
        )
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
        raise Refused(403, "the request came from another site's page (Origin)")
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = field(form, CSRF_FIELD)
    if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
        raise Refused(403, "missing or wrong CSRF token: reload the page and submit its form again")


def check_token(request: Request, form: Form, settings: DashboardSettings) -> None:
    """The action token, when one is set: or :class:`Refused` (401)."""
    if not settings.token:
        return
    given = field(form, TOKEN_FIELD)
    header = request.headers.get("authorization", "")
    if not given and header.lower().startswith("bearer "):
        given = header[len("bearer ") :].strip()
    if not given or not hmac.compare_digest(given.encode(), settings.token.encode()):
        raise Refused(401, "this action needs the dashboard's token: enter it and confirm again")


def who(request: Request, settings: DashboardSettings) -> str:
    """Who acted, for the audit log: the client address, and "token holder" when a
    token was required (and so given)."""
    client = request.client.host if request.client else "unknown client"
    return f"{client} (token holder)" if settings.token else client
