"""No silent options: every publish entry point and every declaration refuses a keyword
it does not know, naming it and, where one is close, the right one.

``Publisher.publish(..., **options)`` takes its options as a ``TypedDict``: a static
checker refuses ``countdown=5``, but at run time such a keyword would be accepted and
ignored, and the job would run at once. Habits from Celery and Dramatiq get their
equivalent named (:data:`EQUIVALENTS`); other typos the closest accepted name.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Keywords of Celery, Dramatiq and RQ -> what broker-jobs calls them.
EQUIVALENTS: dict[str, str] = {
    "countdown": "delay",
    "delay_seconds": "delay",
    "delay_ms": "delay",  # Dramatiq's send_with_options(delay=ms)
    "run_at": "eta",
    "scheduled_at": "eta",
    "task_id": "job_id",
    "id": "job_id",
    "message_id": "job_id",
    "key": "idempotency_key",
    "unique_key": "idempotency_key",
    "dedup_key": "idempotency_key",
    "max_retries": "retry",
    "retries": "retry",
    "autoretry_for": "retry",
    "retry_backoff": "retry",
    "soft_time_limit": "time_limit",
    "timeout": "time_limit",
    "time_limit_ms": "time_limit",
    "queue_name": "queue",
    "args": "payload",
    "kwargs": "payload",
}


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice ``name`` was most likely a typo of, if one is close enough."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.7)
    return close[0] if close else None


def check_keywords(where: str, given: Iterable[str], accepted: Collection[str]) -> None:
    """Raise ``TypeError`` for the first keyword in ``given`` that ``accepted`` lacks."""
    for name in given:
        if name in accepted:
            continue
        hint = EQUIVALENTS.get(name)
        if hint not in accepted:
            hint = closest(name, accepted)
        suggestion = f"; did you mean {hint!r}?" if hint else ""
        known = ", ".join(sorted(accepted))
        raise TypeError(
            f"{where}() got an unexpected keyword argument {name!r}{suggestion}"
            f" (it takes: {known})"
        )


def refuse_unknown_keywords(*extra: Any, where: str | None = None) -> Callable[[F], F]:
    """Decorate a function (``**options`` typed as the ``TypedDict`` classes in
    ``extra``): a keyword that is neither a parameter nor a key of ``extra`` is a
    ``TypeError`` naming ``where`` (default: the function's name)."""

    def decorate(function: F) -> F:
        parameters = inspect.signature(function).parameters
        accepted = frozenset(
            name
            for name, parameter in parameters.items()
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
            and name != "self"
        ).union(*(typed.__required_keys__ | typed.__optional_keys__ for typed in extra))
        name = where or function.__qualname__

        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def checked_async(*args: Any, **kwargs: Any) -> Any:
                check_keywords(name, kwargs, accepted)
                return await function(*args, **kwargs)

            return checked_async  # type: ignore[return-value]

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            check_keywords(name, kwargs, accepted)
            return function(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate
