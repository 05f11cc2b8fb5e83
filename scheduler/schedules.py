"""What the beat runs and when: timings, and the fires a leader emits at a given moment.

Pure code, no broker and no clock: every method takes the instants it reasons about,
so two beats (or a beat and a test) given the same inputs compute the same fires, the
same fence keys and the same job ids. All instants are aware; results are in UTC.

Timings (anything with ``fires`` and ``next_fire`` is a :class:`Timing`):

- :class:`Cron` runs on wall-clock time in a time zone (DST rules below).
- :class:`Interval` runs every N from a fixed anchor, whatever the time zone.
- :class:`OneOff` runs once.

DST rules of :class:`Cron`, as in Vixie cron. A job at a fixed hour (``30 2 * * *``)
runs once per matching wall-clock time: when the clock springs forward over it, at the
first instant after the gap (the skipped times collapse into that one fire); when the
clock falls back and shows it twice, at the first occurrence only. A job whose hour
field is a wildcard (``*``, ``*/2``, ...) runs hourly or more often, so it keeps its
rhythm in real time instead: both occurrences of a repeated time fire, and times that
do not exist do not fire (the instant after the gap fires only if it matches itself).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from itertools import takewhile
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from scheduler.errors import ScheduleError

#: First part of every fence key: ``beat:<schedule>:<fire>``.
FENCE_PREFIX = "beat"
#: Namespace of the job ids derived from fence keys. Fixed forever: changing it would
#: give a fire emitted before and after a deploy two ids, and so run it twice.
JOB_ID_NAMESPACE = uuid.UUID("44b77947-ef4a-42bd-a26b-cf0b8ecf4c78")
#: The default anchor of an :class:`Interval`: every beat counts from the same instant.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_MICROSECOND = timedelta(microseconds=1)
_DAY = timedelta(days=1)
#: Width of the first window searched backwards for the latest missed fire.
_FIRST_WINDOW = timedelta(minutes=1)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: croniter's random (R) and hashed (H) fields: they differ between processes (or
#: need a hash id), so two beats would not agree on the fires.
_RANDOM_FIELD = re.compile(r"(?<![a-z])[hr](?![a-z])", re.IGNORECASE)
_CRON_RANGES = (
    "fields take [second 0-59] minute 0-59, hour 0-23, day 1-31 or L, month 1-12 or"
    " jan-dec, weekday 0-7 or sun-sat, each as *, a list, a range or a /step"
)
_CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class Timing(Protocol):
    """When a schedule fires. Instants are aware; results are UTC, strictly increasing."""

    def fires(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Every fire ``f`` with ``after < f <= until``."""
        ...

    def next_fire(self, after: datetime) -> datetime | None:
        """The first fire after ``after``, or None when there is none."""
        ...


class CatchUp(StrEnum):
    """What a leader does with fires it missed (late by more than ``grace``)."""

    ALL = "all"  # emit every missed fire within the lookback
    LATEST = "latest"  # emit only the most recent missed fire
    SKIP = "skip"  # emit none; wait for the next fire


# -- helpers shared with scheduler.config -------------------------------------------


def as_utc(value: datetime, what: str) -> datetime:
    """``value`` in UTC. A naive datetime is refused: which instant it means is a guess."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value.isoformat()}")
    return value.astimezone(UTC)


def check_duration(what: str, value: timedelta, *, positive: bool = False) -> None:
    """Refuse a negative duration (or a zero one when ``positive``) with what to write."""
    seconds = f"{value.total_seconds():g} s"
    if positive and value <= timedelta(0):
        raise ScheduleError([f"{what} must be positive, got {seconds}; write e.g. 60 or '5m'"])
    if value < timedelta(0):
        raise ScheduleError([f"{what} must not be negative, got {seconds}; use 0 for none"])


def check_name(name: str) -> None:
    """Refuse names that would make fence keys ambiguous or unreadable."""
    if not _NAME.fullmatch(name):
        raise ScheduleError(
            [
                f"invalid schedule name {name!r}: use 1-100 letters, digits, '.', '_' or '-',"
                " starting with a letter or digit (the name is part of fence keys)"
            ]
        )


def catch_up_named(value: str) -> CatchUp:
    """The policy ``value`` names (a :class:`CatchUp` or its string)."""
    try:
        return CatchUp(value)
    except ValueError:
        choices = ", ".join(CatchUp)
        raise ScheduleError([f"catch_up must be one of {choices}; got {value!r}"]) from None


def zone_named(name: str) -> ZoneInfo:
    """The IANA time zone ``name``, or a ScheduleError that says what to write."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            [f"unknown time zone {name!r}: use an IANA name such as 'Europe/Berlin' or 'UTC'"]
        ) from None


def wall_to_utc(local: datetime, zone: ZoneInfo) -> datetime:
    """The instant a naive wall-clock time in ``zone`` means for a fixed-time job: its
    first occurrence when the clock shows it twice, the first instant after the gap when
    the clock skips it (the job still runs that day, as soon as its time has passed)."""
    first, second = _readings(local, zone)
    return first if first <= second else _gap_end(local, zone, second, first)


def _readings(local: datetime, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """``local`` read with the offset before and after a transition (PEP 495 fold 0, 1):
    equal normally, increasing in a repeated hour, decreasing in a skipped one."""
    aware = local.replace(tzinfo=zone)
    return aware.astimezone(UTC), aware.replace(fold=1).astimezone(UTC)


def _gap_end(local: datetime, zone: ZoneInfo, low: datetime, high: datetime) -> datetime:
    """The transition that skips ``local``: the first instant whose wall clock reads
    later. It lies in (low, high]; zoneinfo does not expose transitions, and they fall
    on whole seconds, so bisect the seconds between."""
    below, above = math.floor(low.timestamp()), math.ceil(high.timestamp())
    while above - below > 1:
        middle = (below + above) // 2
        reading = datetime.fromtimestamp(middle, UTC).astimezone(zone).replace(tzinfo=None)
        below, above = (below, middle) if reading > local else (middle, above)
    return datetime.fromtimestamp(above, UTC)


def _offset(instant: datetime, zone: ZoneInfo) -> timedelta:
    return instant.astimezone(zone).utcoffset() or timedelta(0)


# -- timings ------------------------------------------------------------------------


@dataclass(frozen=True)
class Cron:
    """A cron expression on wall-clock time in ``timezone``: 5 fields (minute hour day
    month weekday), or 6 with seconds first (Quartz / Spring order)."""

    expression: str
    timezone: str = "UTC"
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _text: str = field(init=False, repr=False, compare=False)
    _hour_wildcard: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        reasons: list[str] = []
        fields: tuple[str, ...] = ()
        try:
            object.__setattr__(self, "_zone", zone_named(self.timezone))
        except ScheduleError as error:
            reasons.extend(error.reasons)
        try:
            fields = _cron_fields(self.expression)
        except ScheduleError as error:
            reasons.extend(error.reasons)
        if reasons:
            raise ScheduleError(reasons)
        hour = fields[1] if len(fields) == 5 else fields[2]  # 6 fields: seconds first
        object.__setattr__(self, "_text", " ".join(fields))
        object.__setattr__(self, "_hour_wildcard", hour.startswith("*"))

    def __str__(self) -> str:
        return f"cron {self.expression} {self.timezone}"

    def fires(self, after: datetime, until: datetime) -> Iterator[datetime]:
        until = as_utc(until, "until")
        return takewhile(lambda fire: fire <= until, self._instants(as_utc(after, "after")))

    def next_fire(self, after: datetime) -> datetime | None:
        return next(self._instants(as_utc(after, "after")), None)

    def _instants(self, after: datetime) -> Iterator[datetime]:
        """Fires after ``after``, strictly increasing (unbounded)."""
        previous = after
        for instant in self._candidates(self._local_start(after)):
            if instant > previous:
                previous = instant
                yield instant

    def _local_start(self, after: datetime) -> datetime:
        """Where the wall-clock walk starts. One fold before ``after``'s reading: in a
        repeated hour, times the clock already showed still have their second
        occurrence ahead."""
        fold = _offset(after, self._zone) - _offset(after + _DAY, self._zone)
        local = after.astimezone(self._zone).replace(tzinfo=None)
        return local - max(fold, timedelta(0))

    def _candidates(self, start: datetime) -> Iterator[datetime]:
        """Instants of the matching wall times after ``start``, non-decreasing, with
        repeats. A second occurrence comes up to a fold later than its wall time's
        first, so a heap holds it until no earlier instant can follow."""
        pending: list[datetime] = []
        for local in self._wall_times(start):
            instants = self._resolve(local)
            if not instants:
                continue
            while pending and pending[0] <= instants[0]:
                yield heapq.heappop(pending)
            for instant in instants:
                heapq.heappush(pending, instant)
        while pending:
            yield heapq.heappop(pending)

    def _wall_times(self, start: datetime) -> Iterator[datetime]:
        """Matching naive wall-clock times after ``start``. Naive on purpose: croniter
        then does plain calendar arithmetic, and DST is decided here, in ``_resolve``."""
        times = croniter(self._text, start, ret_type=datetime, second_at_beginning=True)
        while True:
            try:
                yield times.get_next(datetime)
            except CroniterBadDateError:  # no match within croniter's search horizon
                return

    def _resolve(self, local: datetime) -> tuple[datetime, ...]:
        """The instants a matching wall time fires at, earliest first (rules atop)."""
        first, second = _readings(local, self._zone)
        if first == second:
            return (first,)
        if first < second:  # the clock shows this time twice
            return (first, second) if self._hour_wildcard else (first,)
        if self._hour_wildcard:  # the clock skips this time
            return ()
        return (_gap_end(local, self._zone, second, first),)


def _cron_fields(expression: str) -> tuple[str, ...]:
    """The fields of a valid expression, aliases (``@daily``) expanded."""
    fields = tuple(_CRON_ALIASES.get(expression.strip().lower(), expression).split())
    if len(fields) not in (5, 6):
        raise ScheduleError(
            [
                f"invalid cron expression {expression!r}: {len(fields)} fields; use 5"
                " (minute hour day month weekday) or 6 with seconds first"
            ]
        )
    if any(_RANDOM_FIELD.search(part) for part in fields):
        raise ScheduleError(
            [
                f"invalid cron expression {expression!r}: random (R) and hashed (H) fields"
                " differ between beats; write the values"
            ]
        )
    try:
        croniter.expand(" ".join(fields), second_at_beginning=True, strict=True)
    except CroniterError as error:
        detail = str(error).strip().splitlines()[-1]
        raise ScheduleError(
            [f"invalid cron expression {expression!r}: {detail}; {_CRON_RANGES}"]
        ) from None
    return fields


@dataclass(frozen=True)
class Interval:
    """Every ``every``, at ``anchor + k * every`` for whole k. The anchor, not the start
    of a process, fixes the phase, so every beat computes the same instants."""

    every: timedelta
    anchor: datetime = EPOCH

    def __post_init__(self) -> None:
        check_duration("every", self.every, positive=True)
        if self.anchor.tzinfo is None or self.anchor.utcoffset() is None:
            raise ScheduleError([f"anchor {self.anchor.isoformat()} needs a UTC offset"])
        object.__setattr__(self, "anchor", self.anchor.astimezone(UTC))

    def fires(self, after: datetime, until: datetime) -> Iterator[datetime]:
        until = as_utc(until, "until")
        return takewhile(lambda fire: fire <= until, self._from(self._index_after(after)))

    def next_fire(self, after: datetime) -> datetime | None:
        return next(self._from(self._index_after(after)), None)

    def count(self, after: datetime, until: datetime) -> int:
        """How many fires lie in (after, until]."""
        last_index = (as_utc(until, "until") - self.anchor) // self.every
        return max(0, last_index - self._index_after(after) + 1)

    def __str__(self) -> str:
        return f"every {self.every.total_seconds():g} s"

    def _index_after(self, after: datetime) -> int:
        # Exact integer arithmetic on microseconds: no float drift over long spans.
        return (as_utc(after, "after") - self.anchor) // self.every + 1

    def _from(self, index: int) -> Iterator[datetime]:
        while True:
            try:
                yield self.anchor + index * self.every
            except OverflowError:  # past datetime.max
                return
            index += 1


@dataclass(frozen=True)
class OneOff:
    """Once, at ``at`` (aware; a naive time needs the schedule's time zone)."""

    at: datetime

    def __post_init__(self) -> None:
        if self.at.tzinfo is None or self.at.utcoffset() is None:
            raise ScheduleError(
                [
                    f"at {self.at.isoformat()} has no UTC offset: write one (e.g. +01:00"
                    " or Z), or give the schedule a timezone"
                ]
            )
        object.__setattr__(self, "at", self.at.astimezone(UTC))

    def __str__(self) -> str:
        return f"at {self.at.isoformat().replace('+00:00', 'Z')}"

    def fires(self, after: datetime, until: datetime) -> Iterator[datetime]:
        after, until = as_utc(after, "after"), as_utc(until, "until")
        return iter([self.at] if after < self.at <= until else [])

    def next_fire(self, after: datetime) -> datetime | None:
        return self.at if self.at > as_utc(after, "after") else None


# -- schedules ----------------------------------------------------------------------


class FireKind(StrEnum):
    """Why a fire is emitted: on time (late by at most the grace), or caught up."""

    ON_TIME = "on_time"
    CAUGHT_UP = "caught_up"


@dataclass(frozen=True)
class DueFires:
    """What a leader does at a moment (:meth:`Schedule.due`): the missed fires it
    catches up, the on-time ones, and how many missed fires the policy skips."""

    caught_up: tuple[datetime, ...]
    on_time: tuple[datetime, ...]
    skipped: int

    @property
    def fires(self) -> tuple[datetime, ...]:
        """Every fire to emit, increasing (missed fires precede on-time ones)."""
        return self.caught_up + self.on_time

    def with_kinds(self) -> Iterator[tuple[datetime, FireKind]]:
        for fire in self.caught_up:
            yield fire, FireKind.CAUGHT_UP
        for fire in self.on_time:
            yield fire, FireKind.ON_TIME


def count_fires(timing: Timing, after: datetime, until: datetime) -> int:
    """How many fires ``timing`` has in (after, until]: by arithmetic for an
    :class:`Interval` (a dense one over a long lookback would take seconds to walk,
    stalling the leader's loop), by walking them otherwise, as catch-up ``all`` does."""
    if isinstance(timing, Interval):
        return timing.count(after, until)
    return sum(1 for _ in timing.fires(after, until))


@dataclass(frozen=True)
class Schedule:
    """A job the beat publishes on ``timing``.

    ``lookback`` bounds how far back a leader catches up after a gap; fires late by at
    most ``grace`` count as on time; ``jitter`` spreads the publish of each fire by a
    delay both leaders agree on.
    """

    name: str
    task: str
    payload: dict[str, Any]
    timing: Timing
    catch_up: CatchUp = CatchUp.ALL
    lookback: timedelta = timedelta(hours=1)
    jitter: timedelta = timedelta(0)
    grace: timedelta = timedelta(seconds=2)

    def __post_init__(self) -> None:
        reasons: list[str] = []
        checks = [
            lambda: check_name(self.name),
            lambda: check_duration("lookback", self.lookback),
            lambda: check_duration("jitter", self.jitter),
            lambda: check_duration("grace", self.grace),
            lambda: catch_up_named(self.catch_up),
            self._check_payload,
        ]
        for check in checks:
            try:
                check()
            except ScheduleError as error:
                reasons.extend(error.reasons)
        if reasons:
            raise ScheduleError(reasons, subject=self.name or "<unnamed>")
        object.__setattr__(self, "catch_up", catch_up_named(self.catch_up))

    def _check_payload(self) -> None:
        try:
            json.dumps(self.payload, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ScheduleError(
                [f"payload is not JSON-serialisable ({error}); use JSON types only"]
            ) from None

    def past_for_good(self, now: datetime) -> datetime | None:
        """A one-off's time when it lies further back than the lookback at ``now``: no
        leader emits it any more (it looks like a one-off that fired); else None."""
        timing = self.timing
        if isinstance(timing, OneOff) and timing.at < as_utc(now, "now") - self.lookback:
            return timing.at
        return None

    def fence_key(self, fire: datetime) -> str:
        """``beat:<name>:<fire>``, the fire in UTC to the second (microseconds only when
        set): the key leaders fence on, so each fire is emitted once."""
        stamp = as_utc(fire, "fire").replace(tzinfo=None).isoformat()
        return f"{FENCE_PREFIX}:{self.name}:{stamp}Z"

    def job_id(self, fire: datetime) -> str:
        """The fire's job id, the same in every beat: a duplicate emit is the same job."""
        return str(uuid.uuid5(JOB_ID_NAMESPACE, self.fence_key(fire)))

    def jitter_for(self, fire: datetime) -> float:
        """Seconds in [0, jitter) to delay this fire, derived from its fence key so that
        two leaders racing on one fire pick the same delay."""
        span = self.jitter.total_seconds()
        if span <= 0:
            return 0.0
        digest = hashlib.sha256(self.fence_key(fire).encode()).digest()
        fraction = (int.from_bytes(digest[:8], "big") >> 11) / 2**53  # 53 bits: < 1.0
        return min(fraction * span, math.nextafter(span, 0.0))

    def due_fires(self, last: datetime | None, now: datetime) -> list[datetime]:
        """The fires a leader emits at ``now``, increasing, given the ``last`` fire
        emitted (None for a schedule never run: it starts now, without history).

        Fires after ``last`` up to ``now``. Those late by at most ``grace`` are on time
        and always emitted; older (missed) ones follow ``catch_up``, and only those
        within ``lookback`` are considered (so a long outage costs a bounded amount).
        """
        return list(self.due(last, now).fires)

    def due(self, last: datetime | None, now: datetime) -> DueFires:
        """:meth:`due_fires` split by kind, with the count of missed fires (within the
        lookback) that the catch-up policy drops."""
        now = as_utc(now, "now")
        on_time_from = now - self.grace
        missed_until = on_time_from - _MICROSECOND  # the latest instant that is missed
        after = on_time_from if last is None else as_utc(last, "last")
        on_time = tuple(self.timing.fires(max(after, missed_until), now))
        caught_up, skipped = self._missed(max(after, now - self.lookback), missed_until)
        return DueFires(caught_up, on_time, skipped)

    def _missed(self, start: datetime, until: datetime) -> tuple[tuple[datetime, ...], int]:
        """The missed fires in (start, until] that are emitted, and how many are not."""
        if until <= start:
            return (), 0
        if self.catch_up is CatchUp.ALL:
            return tuple(self.timing.fires(start, until)), 0
        missed = count_fires(self.timing, start, until)
        if self.catch_up is CatchUp.SKIP:
            return (), missed
        latest = self._latest_fire(start, until)
        return ((), 0) if latest is None else ((latest,), missed - 1)

    def _latest_fire(self, start: datetime, until: datetime) -> datetime | None:
        """The last fire in (start, until], searched backwards in doubling windows: a
        dense timing is found within a minute, a sparse one in a few steps, and neither
        walks every fire of a long lookback."""
        upper, width = until, _FIRST_WINDOW
        while upper > start:
            lower = max(start, upper - width)
            window = list(self.timing.fires(lower, upper))
            if window:
                return window[-1]
            upper, width = lower, width * 2
        return None
