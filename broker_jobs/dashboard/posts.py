"""The actions (POST only): each first answers with a confirmation page whose form
posts the same fields again with ``confirm=yes``; only that second post acts, and
shows a result page with counts: a bulk one (a selection of dead letters, or all
that match) runs in the background and redirects to its progress page
(broker_jobs.dashboard.operations), which ends with the same result. Every post is
CSRF-checked and refused (403) on a read-only dashboard; the confirmed one also needs
the token when one is set."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from broker_jobs.dashboard import actions
from broker_jobs.dashboard.filters import LetterFilter
from broker_jobs.dashboard.operations import operations_of
from broker_jobs.dashboard.pages import known_task, settings_of
from broker_jobs.dashboard.queries import dead_letter_queues
from broker_jobs.dashboard.safety import (
    CSRF_FIELD,
    TOKEN_FIELD,
    Form,
    Refused,
    check_post,
    check_token,
    field,
    read_form,
    who,
)
from broker_jobs.dashboard.settings import DashboardSettings
from broker_jobs.dashboard.views import render

SCOPES = ("one", "selected", "matching")
SEE_OTHER = 303


async def cancel(request: Request) -> Response:
    settings = settings_of(request)
    form = await _checked_form(request, settings)
    ref = field(form, "ref").strip()
    if not ref:
        raise Refused(400, "ref: name the job to cancel")

    async def question() -> str:
        record = await run_in_threadpool(settings.store.lookup, ref)
        if record is None:
            raise Refused(404, f"no job with key or id {ref!r} in the ledger")
        return (
            f"Cancel job {record.idempotency_key!r} ({record.task}, {record.status.value})?"
            " It will not run; a running job is not interrupted."
        )

    actor = who(request, settings)
    return await _ask_then_act(
        request,
        settings,
        form,
        "cancel",
        question=question,
        act=lambda: actions.cancel(settings, ref, actor),
    )


async def pause(request: Request) -> Response:
    return await _task_control(request, "pause")


async def resume(request: Request) -> Response:
    return await _task_control(request, "resume")


async def _task_control(request: Request, action: str) -> Response:
    """Pause or resume one task of the dashboard's."""
    settings = settings_of(request)
    form = await _checked_form(request, settings)
    task = known_task(settings, field(form, "task").strip())

    async def question() -> str:
        if action == "pause":
            return (
                f"Pause task {task!r}? Every worker stops starting its jobs within a few"
                " seconds; running jobs finish; new jobs wait in its queue until it is resumed."
            )
        return f"Resume task {task!r}? Every worker consumes it again within a few seconds."

    act = actions.pause if action == "pause" else actions.resume
    actor = who(request, settings)
    return await _ask_then_act(
        request, settings, form, action, question=question, act=lambda: act(settings, task, actor)
    )


async def _ask_then_act(
    request: Request,
    settings: DashboardSettings,
    form: Form,
    action: str,
    *,
    question: Callable[[], Awaitable[str]],
    act: Callable[[], actions.Result],
) -> Response:
    """An action on one thing in its two steps: without ``confirm=yes`` the confirmation
    page asking ``question()``; with it the token's check, then ``act()`` (in a thread:
    it talks to the broker and the ledger) and its result page."""
    if field(form, "confirm") != "yes":
        return _confirm(
            request,
            settings,
            f"/actions/{action}",
            action=action,
            question=await question(),
            form=form,
        )
    check_token(request, form, settings)
    result = await run_in_threadpool(act)
    return render(request, settings, "result.html", {"result": result})


async def replay(request: Request) -> Response:
    return await _dead_letters(request, "replay")


async def purge(request: Request) -> Response:
    return await _dead_letters(request, "purge")


async def _dead_letters(request: Request, action: str) -> Response:
    settings = settings_of(request)
    form = await _checked_form(request, settings)
    scope = field(form, action) or field(form, "scope")
    if scope not in SCOPES:
        raise Refused(400, f"{action}: one of {', '.join(SCOPES)}")
    chosen = LetterFilter.read({name: values[0] for name, values in form.items() if values})
    tasks = chosen.tasks(settings.tasks)
    refs = frozenset(ref for ref in form.get("ref", []) if ref)
    if scope != "matching" and not refs:
        raise Refused(400, f"{action}: select at least one dead letter")
    if scope == "matching":
        refs = frozenset()
    if field(form, "confirm") != "yes":
        depths = await run_in_threadpool(_depths, settings, tasks)
        what = (
            f"{len(refs)} selected dead letter(s): {', '.join(sorted(refs))}"
            if refs
            else "every dead letter matching "
            + (", ".join(f"{k}={v!r}" for k, v in chosen.fields().items()) or "no filter (all)")
        )
        held = ", ".join(f"{task}: {count}" for task, count in depths.items())
        verb = "Replay (publish again)" if action == "replay" else "Delete for good"
        question = f"{verb} {what}? The queues hold {held}."
        fields = {**form, "scope": [scope]}
        return _confirm(
            request, settings, f"/actions/{action}", action=action, question=question, form=fields
        )
    check_token(request, form, settings)
    act = actions.replay if action == "replay" else actions.purge
    actor = who(request, settings)
    selection = actions.Selection(chosen, refs)
    # In the background even for one dead letter: the pass goes through its whole
    # queue (42 s for one of 20,000 held the request, past a proxy's 30 s timeout).
    operation = operations_of(request).start(
        action, actor, lambda progress: act(settings, selection, actor, progress)
    )
    # See Other: the browser GETs the page, so a reload there does not post again.
    return RedirectResponse(f"/operations/{operation.id}", status_code=SEE_OTHER)


def _depths(settings: DashboardSettings, tasks: tuple[str, ...]) -> dict[str, int]:
    with dead_letter_queues(settings, tasks) as dlq:
        return dlq.depths()


async def _checked_form(request: Request, settings: DashboardSettings) -> Form:
    form = await read_form(request)
    check_post(request, form, settings)
    return form


def _confirm(
    request: Request,
    settings: DashboardSettings,
    target: str,
    *,
    action: str,
    question: str,
    form: Form,
) -> Response:
    """The confirmation step: the same fields again, and the confirm button."""
    skip = {CSRF_FIELD, TOKEN_FIELD, "confirm", action}
    hidden = [
        (name, value) for name, values in form.items() if name not in skip for value in values
    ]
    return render(
        request,
        settings,
        "confirm.html",
        {"target": target, "action": action, "question": question, "hidden": hidden},
    )
