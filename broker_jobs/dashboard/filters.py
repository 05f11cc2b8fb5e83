"""The filters of the jobs list and of the dead-letter view, read from a query string
or a form, and written back into links (the next page keeps the filters)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from broker_jobs.dashboard.safety import Refused
from broker_jobs.errors import BrokerJobsError
from broker_jobs.ops.dead_letters import DeadLetter, DeadLetterFilter
from broker_jobs.ops.documents import CursorError, decode_cursor, encode_cursor
from broker_jobs.store.base import Status

PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
#: The jobs list's orders (``?order=``), the first the default: whether each is
#: oldest updated first, and how the page says it.
ORDERS = {"newest": (False, "newest updated first"), "oldest": (True, "oldest updated first")}


def moment(text: str, name: str) -> datetime | None:
    """An ISO 8601 time; one without a zone is UTC (a browser's datetime-local field
    sends none, and the page says its times are UTC)."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise Refused(400, f"{name}: {text!r} is not a time (ISO 8601)") from None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)  # in range: the stores compare it in UTC
    except OverflowError:
        raise Refused(400, f"{name}: {text!r} is out of range (year 1 to 9999 in UTC)") from None


@dataclass(frozen=True)
class JobFilter:
    """The jobs list's filters (Store.page's), its order and its position."""

    task: str = ""
    state: str = ""
    key: str = ""
    since: str = ""
    until: str = ""
    after: str = ""  # the cursor of jobs_cli.encode_cursor (a place in ``order``)
    limit: int = PAGE_SIZE
    order: str = "newest"  # a key of ORDERS

    @classmethod
    def read(cls, query: Mapping[str, str]) -> JobFilter:
        state = query.get("state", "").strip().lower()
        if state and state not in {status.value for status in Status}:
            raise Refused(400, f"state: {state!r} is not a job state")
        try:
            limit = int(query.get("limit") or PAGE_SIZE)
        except ValueError:
            raise Refused(400, "limit: not a number") from None
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise Refused(400, f"limit: between 1 and {MAX_PAGE_SIZE}")
        order = query.get("order", "").strip().lower() or "newest"
        if order not in ORDERS:
            raise Refused(400, f"order: {order!r} is not an order: {' or '.join(ORDERS)}")
        chosen = cls(
            task=query.get("task", "").strip(),
            state=state,
            key=query.get("key", ""),
            since=query.get("since", "").strip(),
            until=query.get("until", "").strip(),
            after=query.get("after", "").strip(),
            limit=limit,
            order=order,
        )
        chosen.page_arguments()  # every value checked before the store is asked
        return chosen

    @property
    def oldest_first(self) -> bool:
        return ORDERS[self.order][0]

    @property
    def order_text(self) -> str:
        return ORDERS[self.order][1]

    def page_arguments(self) -> dict[str, object]:
        """The keyword arguments of Store.page."""
        after = None
        if self.after:
            try:
                after = decode_cursor(self.after)
            except CursorError:
                raise Refused(
                    400, "after: not a cursor of this list (follow its Next link)"
                ) from None
        return {
            "status": Status(self.state) if self.state else None,
            "task": self.task or None,
            "key": self.key or None,
            "since": moment(self.since, "since"),
            "until": moment(self.until, "until"),
            "after": after,
            "limit": self.limit,
            "oldest_first": self.oldest_first,
        }

    def count_arguments(self) -> dict[str, object]:
        """The keyword arguments of Store.count: every record the filters take, not
        only those after the cursor."""
        found = self.page_arguments()
        for name in ("after", "limit", "oldest_first"):
            del found[name]
        return found

    def query(self, after: tuple[datetime, str] | None = None, order: str | None = None) -> str:
        """This filter as a query string, at ``after`` (the first page without it), in
        its order or in ``order``."""
        order = order or self.order
        values = {
            "task": self.task,
            "state": self.state,
            "key": self.key,
            "since": self.since,
            "until": self.until,
            "limit": "" if self.limit == PAGE_SIZE else str(self.limit),
            "order": "" if order == "newest" else order,
            "after": encode_cursor(after) if after else "",
        }
        return urlencode({name: value for name, value in values.items() if value})


@dataclass(frozen=True)
class LetterFilter:
    """The dead-letter view's filters: a task (or every one shown), reason, error
    text, dead-at range."""

    task: str = ""
    reason: str = ""
    error: str = ""
    since: str = ""
    until: str = ""

    @classmethod
    def read(cls, values: Mapping[str, str]) -> LetterFilter:
        chosen = cls(
            task=values.get("task", "").strip(),
            reason=values.get("reason", "").strip(),
            error=values.get("error", ""),
            since=values.get("since", "").strip(),
            until=values.get("until", "").strip(),
        )
        chosen.dead_letter_filter()
        return chosen

    def tasks(self, shown: tuple[str, ...]) -> tuple[str, ...]:
        if not self.task:
            return shown
        if self.task not in shown:
            raise Refused(400, f"task: {self.task!r} is not a task of this dashboard")
        return (self.task,)

    def dead_letter_filter(self, refs: frozenset[str] = frozenset()) -> DeadLetterFilter:
        try:
            if refs:
                return Selected(
                    reasons=frozenset({self.reason}) if self.reason else frozenset(),
                    error=self.error or None,
                    since=moment(self.since, "since"),
                    until=moment(self.until, "until"),
                    refs=refs,
                )
            return DeadLetterFilter(
                reasons=frozenset({self.reason}) if self.reason else frozenset(),
                error=self.error or None,
                since=moment(self.since, "since"),
                until=moment(self.until, "until"),
            )
        except BrokerJobsError as error:
            raise Refused(400, str(error)) from None

    def fields(self) -> dict[str, str]:
        """The non-empty filters, for hidden form fields and links."""
        return {name: value for name, value in vars(self).items() if value}

    def query(self) -> str:
        return urlencode(self.fields())

    @property
    def is_empty(self) -> bool:
        return not any(vars(self).values())


@dataclass(frozen=True)
class Selected(DeadLetterFilter):
    """A filter that also takes only the dead letters of ``refs`` (job ids or keys):
    a selection replayed or purged in one pass over the queues."""

    refs: frozenset[str] = frozenset()

    def matches(self, letter: DeadLetter) -> bool:
        chosen = letter.job_id in self.refs or letter.idempotency_key in self.refs
        return chosen and super().matches(letter)


#: The highest page number taken (a million dead letters at 200 a page).
MAX_PAGE = 5000


def page_number(values: Mapping[str, str]) -> int:
    """The ``page`` query parameter: a whole number from 1 (1 when absent)."""
    text = values.get("page", "").strip() or "1"
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise Refused(400, f"page: {text!r} is not a page number (1 to {MAX_PAGE})")
    return int(text)
