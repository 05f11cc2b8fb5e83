"""Load the beat's schedules: the app's declarations plus TOML files, all validated.

Everything is checked before the beat runs anything, and every problem of every
schedule is reported at once, as one :class:`ScheduleError` line per problem::

    nightly-report (beat.toml): unknown time zone 'Europe/Berln': use an IANA name ...

A schedule file holds ``[[schedule]]`` tables with the keys of ``app.schedule``::

    [[schedule]]
    name = "nightly-report"
    task = "report.build"
    cron = "30 2 * * *"          # or: every = 60 / every = "5m"; or: at = 2026-12-01T09:00:00+01:00
    timezone = "Europe/Berlin"   # for cron, and for an `at` without a UTC offset
    payload = { day = "yesterday" }
    catch_up = "latest"          # all | latest | skip
    lookback = "1h"              # durations: seconds, or "90s", "5m", "2h", "1d", "1h30m"
    jitter = 30
    grace = 2
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from broker_jobs.app import App
from broker_jobs.errors import PayloadValidationError
from broker_jobs.schedule_decl import ScheduleDeclaration
from scheduler.errors import ScheduleError
from scheduler.schedules import (
    EPOCH,
    CatchUp,
    Cron,
    Interval,
    OneOff,
    Schedule,
    Timing,
    catch_up_named,
    check_duration,
    check_name,
    wall_to_utc,
    zone_named,
)

T = TypeVar("T")

#: The keys a ``[[schedule]]`` table may have; anything else is a typo to report.
KEYS = frozenset(field.name for field in fields(ScheduleDeclaration))
#: Defaults of keys a table leaves out: those of ``app.schedule``, so both agree.
_DEFAULTS: Mapping[str, Any] = {
    field.name: field.default
    for field in fields(ScheduleDeclaration)
    if field.default not in (None, MISSING)
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_DURATION = re.compile(rf"(?:{_DURATION_PART.pattern})+")
_DURATION_HINT = "seconds (a number) or a duration such as '90s', '5m', '2h', '1d'"
#: Stands in for a timing that failed to build, so checking goes on to the next key.
_NO_TIMING: Timing = OneOff(EPOCH)


@dataclass(frozen=True)
class _Entry:
    """One schedule's raw values and where they come from (for messages)."""

    values: Mapping[str, Any]
    origin: str  # "the app" or a file path
    position: int  # 1-based, within its origin

    @property
    def name(self) -> str | None:
        name = self.values.get("name")
        return name if isinstance(name, str) and name else None

    @property
    def label(self) -> str:
        if self.origin == "the app":
            return self.name or f"schedule #{self.position} of the app"
        return f"{self.name or f'schedule #{self.position}'} ({self.origin})"


def load_schedules(app: App, files: Sequence[Path] = ()) -> list[Schedule]:
    """The app's declared schedules, then those of ``files`` in order, validated.

    Raises one :class:`ScheduleError` listing every problem of every schedule.
    """
    problems: list[str] = []
    entries = [_declared(declaration, n) for n, declaration in enumerate(app.schedules, 1)]
    for path in files:
        found, trouble = _file_entries(Path(path))
        entries.extend(found)
        problems.extend(trouble)
    schedules: list[Schedule] = []
    origins: dict[str, str] = {}
    for entry in entries:
        reasons = _duplicate(entry, origins)
        try:
            schedules.append(_build(entry.values, app))
        except ScheduleError as error:
            reasons.extend(error.reasons)
        problems.extend(f"{entry.label}: {reason}" for reason in reasons)
    if problems:
        raise ScheduleError(problems)
    return schedules


def parse_duration(what: str, value: object) -> timedelta:
    """A duration from seconds (int or float), a timedelta, or text like ``"1h30m"``."""
    if isinstance(value, timedelta):
        return value
    try:
        return timedelta(seconds=_seconds(what, value))
    except OverflowError:
        raise ScheduleError([f"{what} {value!r} is too large"]) from None


def _seconds(what: str, value: object) -> float:
    if isinstance(value, str) and _DURATION.fullmatch(text := value.replace(" ", "")):
        return sum(float(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(text))
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScheduleError([f"{what} must be {_DURATION_HINT}; got {value!r}"])
    return value


def _declared(declaration: ScheduleDeclaration, position: int) -> _Entry:
    values = {key: getattr(declaration, key) for key in KEYS}
    return _Entry(
        {key: value for key, value in values.items() if value is not None}, "the app", position
    )


def _file_entries(path: Path) -> tuple[list[_Entry], list[str]]:
    """The ``[[schedule]]`` tables of ``path``, and the problems of the file itself."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        return [], [f"{path}: cannot read the schedule file: {error.strerror}"]
    except tomllib.TOMLDecodeError as error:  # the message gives line and column
        return [], [f"{path}: not valid TOML: {error}; fix the file there"]
    problems = [
        f"{path}: unknown top-level key {key!r}: a schedule file holds only [[schedule]] tables"
        for key in sorted(set(document) - {"schedule"})
    ]
    tables = document.get("schedule", [])
    if not isinstance(tables, list) or not all(isinstance(table, dict) for table in tables):
        problems.append(f"{path}: 'schedule' must be an array of tables: write [[schedule]]")
        return [], problems
    return [_Entry(table, str(path), n) for n, table in enumerate(tables, 1)], problems


def _duplicate(entry: _Entry, origins: dict[str, str]) -> list[str]:
    """Names key fences and job ids, so one name must mean one schedule."""
    if entry.name is None:
        return []
    if entry.name in origins:
        return [
            f"duplicate schedule name, also defined in {origins[entry.name]}; rename one"
            " of them (the name keys the beat's fences and job ids)"
        ]
    origins[entry.name] = entry.origin
    return []


def _build(values: Mapping[str, Any], app: App) -> Schedule:
    """One Schedule, or a ScheduleError with every reason it cannot be built."""
    reasons: list[str] = []

    def attempt(build: Callable[[], T], stand_in: T) -> T:
        try:
            return build()
        except ScheduleError as error:
            reasons.extend(error.reasons)
            return stand_in

    unknown = sorted(set(values) - KEYS)
    if unknown:
        known = ", ".join(sorted(KEYS))
        reasons.append(f"unknown key(s) {', '.join(unknown)}; the keys are {known}")
    name = attempt(lambda: _name(values), "")
    timing = attempt(lambda: _timing(values), _NO_TIMING)
    no_payload: tuple[str, dict[str, Any]] = ("", {})
    task, payload = attempt(lambda: _task_and_payload(app, values), no_payload)
    catch_up = attempt(lambda: _catch_up(values), CatchUp.ALL)
    lookback = attempt(lambda: _duration(values, "lookback"), timedelta(0))
    jitter = attempt(lambda: _duration(values, "jitter"), timedelta(0))
    grace = attempt(lambda: _duration(values, "grace"), timedelta(0))
    if reasons:
        raise ScheduleError(reasons)
    return Schedule(name, task, payload, timing, catch_up, lookback, jitter, grace)


def _name(values: Mapping[str, Any]) -> str:
    name = values.get("name")
    if not isinstance(name, str):
        raise ScheduleError(["missing name: give every schedule a unique name"])
    check_name(name)
    return name


def _timing(values: Mapping[str, Any]) -> Timing:
    given = [key for key in ("cron", "every", "at") if values.get(key) is not None]
    if len(given) != 1:
        raise ScheduleError(
            [f"give exactly one of cron, every or at (got {', '.join(given) or 'none'})"]
        )
    zone = values.get("timezone")
    if zone is not None and not isinstance(zone, str):
        raise ScheduleError(
            [f"timezone must be an IANA name such as 'Europe/Berlin'; got {zone!r}"]
        )
    if given == ["cron"]:
        if not isinstance(values["cron"], str):
            raise ScheduleError(
                [f"cron must be a string like '30 2 * * *'; got {values['cron']!r}"]
            )
        return Cron(values["cron"], zone or "UTC")
    if given == ["every"]:
        if zone is not None:
            raise ScheduleError(
                [
                    "timezone has no effect on every: an interval fires every N seconds"
                    " counted from 1970-01-01T00:00Z; remove timezone, or use cron for"
                    " wall-clock times"
                ]
            )
        return Interval(parse_duration("every", values["every"]))
    return OneOff(_instant(values["at"], zone))


def _instant(value: object, zone: str | None) -> datetime:
    """``at`` as an aware datetime; a naive one is read as wall-clock time in ``zone``."""
    local_zone = zone_named(zone) if zone is not None else None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ScheduleError(
                [
                    f"at {value!r} is not an ISO 8601 date-time; write e.g."
                    " '2026-12-01T09:00:00+01:00'"
                ]
            ) from None
    if not isinstance(value, datetime):
        kind = "a date without a time" if isinstance(value, date) else repr(value)
        raise ScheduleError([f"at must be a date-time with a UTC offset; got {kind}"])
    if value.tzinfo is not None or local_zone is None:
        return value  # OneOff refuses it if naive
    return wall_to_utc(value, local_zone)


def _task_and_payload(app: App, values: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The task, declared by the app, and the payload as its model validates and
    serialises it (so the beat publishes exactly what a worker will accept)."""
    task = values.get("task")
    tasks = ", ".join(sorted(spec.name for spec in app)) or "none"
    if not isinstance(task, str):
        raise ScheduleError([f"missing task: give one of the app's tasks ({tasks})"])
    if task not in app:
        raise ScheduleError(
            [
                f"unknown task {task!r}: the app declares {tasks}; fix the name, or declare"
                " the task (app.declare or @app.task)"
            ]
        )
    spec = app.get(task)
    payload = values.get("payload", {})
    if not isinstance(payload, Mapping | BaseModel):
        raise ScheduleError([f"payload must be a table (a mapping); got {payload!r}"])
    try:
        model = spec.validate(payload)
    except PayloadValidationError as error:
        raise ScheduleError(
            [f"{error}; make the payload fit {spec.payload_model.__name__}"]
        ) from None
    return task, model.model_dump(mode="json")


def _catch_up(values: Mapping[str, Any]) -> CatchUp:
    value = values.get("catch_up", _DEFAULTS["catch_up"])
    if not isinstance(value, str):
        raise ScheduleError([f"catch_up must be one of all, latest, skip; got {value!r}"])
    return catch_up_named(value)


def _duration(values: Mapping[str, Any], key: str) -> timedelta:
    duration = parse_duration(key, values.get(key, _DEFAULTS[key]))
    check_duration(key, duration)
    return duration
