"""The bulk actions that run in the background: the confirmed POST starts one in a
thread and answers at once with a redirect to its page (``/operations/{id}``), which
follows its progress through ``/api/operations/{id}``; both are read-only GETs.

The registry lives on the app (``app.state.operations``), never in this module, so
two apps (the tests make many) share nothing. It keeps every running operation and
the last :data:`KEEP_FINISHED` finished ones: an older finished page answers 404.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from broker_jobs.dashboard.actions import Progress, Result
from broker_jobs.dashboard.pages import settings_of
from broker_jobs.dashboard.safety import Refused
from broker_jobs.dashboard.views import render
from broker_jobs.errors import BrokerJobsError
from broker_jobs.store.base import mask_dsn
from broker_jobs.urls import mask_text

logger = logging.getLogger("broker_jobs.dashboard")

#: How many finished operations stay readable (their pages and API documents).
KEEP_FINISHED = 50

#: The blocking work of an operation: the action, told where to report progress.
Work = Callable[[Progress], Result]


def masked(error: Exception) -> str:
    """An error as one line, passwords masked (the broker's URLs, the store's DSN)."""
    return mask_dsn(mask_text(" ".join(str(error).split())))


@dataclass
class Operation:
    """One bulk action: who started it, how far it got, and what came of it.

    The worker thread writes, the request handlers read: every access goes through
    the lock, and readers take a :meth:`snapshot`."""

    id: str
    action: str
    who: str
    started_at: datetime
    done: int = 0
    total: int | None = None  #: None until the action knows the queues' depth
    finished: bool = False
    result: Result | None = None
    error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def progressed(self, done: int, total: int) -> None:
        with self._lock:
            self.done, self.total = done, max(total, done)

    def succeeded(self, result: Result) -> None:
        with self._lock:
            self.result, self.finished = result, True

    def failed(self, message: str) -> None:
        with self._lock:
            self.error, self.finished = message, True

    def is_finished(self) -> bool:
        with self._lock:
            return self.finished

    def snapshot(self) -> Operation:
        """A copy that no thread changes, for a page or a JSON document."""
        with self._lock:
            return Operation(
                self.id,
                self.action,
                self.who,
                self.started_at,
                self.done,
                self.total,
                self.finished,
                self.result,
                self.error,
            )

    def to_json(self) -> dict[str, Any]:
        """The document of ``/api/operations/{id}`` (take it from a snapshot)."""
        result = self.result
        return {
            "id": self.id,
            "action": self.action,
            "who": self.who,
            "started_at": self.started_at.isoformat(),
            "done": self.done,
            "total": self.total,
            "finished": self.finished,
            "result": None
            if result is None
            else {
                "title": result.title,
                "counts": dict(result.counts),
                "notes": list(result.notes),
                "job": result.job,
            },
            "error": self.error,
        }


class Operations:
    """The app's bulk operations, by id (random: a URL that cannot be guessed)."""

    def __init__(self, keep_finished: int = KEEP_FINISHED) -> None:
        self._keep_finished = keep_finished
        self._by_id: OrderedDict[str, Operation] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def start(self, action: str, who: str, work: Work) -> Operation:
        """Run ``work`` in a new thread; the operation that follows it."""
        operation = Operation(secrets.token_urlsafe(16), action, who, datetime.now(UTC))
        with self._lock:
            self._by_id[operation.id] = operation
            self._forget_old()
        # A daemon: stopping the dashboard must not wait for a long purge. A replay
        # killed midway loses nothing (the ledger first, the dead letter acked last).
        thread = threading.Thread(
            target=self._run,
            args=(operation, work),
            name=f"dashboard {action} {operation.id[:6]}",
            daemon=True,
        )
        thread.start()
        return operation

    def get(self, operation_id: str) -> Operation | None:
        """A snapshot of the operation, None when unknown (or forgotten)."""
        with self._lock:
            operation = self._by_id.get(operation_id)
        return operation.snapshot() if operation else None

    def _run(self, operation: Operation, work: Work) -> None:
        try:
            result = work(operation.progressed)
        except BrokerJobsError as error:  # the broker or the store: say so, as a page does
            message = masked(error)
            logger.warning("dashboard %s %s failed: %s", operation.action, operation.id, message)
            operation.failed(message)
        except Exception as error:  # a bug: logged in full, and the page must still end
            logger.exception("dashboard %s %s failed", operation.action, operation.id)
            operation.failed(f"unexpected error ({type(error).__name__}): {masked(error)}")
        else:
            operation.succeeded(result)
        with self._lock:
            self._forget_old()

    def _forget_old(self) -> None:
        """Drop the oldest finished operations beyond the bound (call with the lock)."""
        finished = [key for key, operation in self._by_id.items() if operation.is_finished()]
        for key in finished[: max(len(finished) - self._keep_finished, 0)]:
            del self._by_id[key]


# -- the routes ---------------------------------------------------------------------------


def operations_of(request: Request) -> Operations:
    operations: Operations = request.app.state.operations
    return operations


def _known(request: Request) -> Operation:
    operation_id = request.path_params["id"]
    operation = operations_of(request).get(operation_id)
    if operation is None:
        raise Refused(404, f"no operation {operation_id!r} (finished long ago, or never)")
    return operation


async def operation_page(request: Request) -> Response:
    """Its progress until it ends (the script polls the API, a browser without
    scripts reloads), then its result as the result page shows it."""
    operation = _known(request)
    return render(request, settings_of(request), "operation.html", {"operation": operation})


async def operation_api(request: Request) -> Response:
    # No caching: a poll must see the progress of now, not of the last answer.
    return JSONResponse(_known(request).to_json(), headers={"cache-control": "no-store"})
