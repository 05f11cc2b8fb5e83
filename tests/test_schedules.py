"""Schedules: timings (cron with DST rules, interval, one-off), the fires a leader emits,
fence keys and job ids, and loading from the app and TOML files. Fixed clocks only."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

from broker_jobs.app import App
from broker_jobs.errors import ConfigurationError
from scheduler.config import load_schedules, parse_duration
from scheduler.errors import ScheduleError
from scheduler.schedules import (
    JOB_ID_NAMESPACE,
    CatchUp,
    Cron,
    Interval,
    OneOff,
    Schedule,
    Timing,
    wall_to_utc,
)

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
TICK = timedelta(microseconds=1)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC)


def local_day(zone: str, day: date) -> tuple[datetime, datetime]:
    """The first and the last instant of a local calendar day, in UTC."""
    tz = ZoneInfo(zone)
    start = datetime.combine(day, datetime.min.time(), tz).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=1), datetime.min.time(), tz).astimezone(UTC)
    return start, end - TICK


def fires_on(timing: Timing, zone: str, day: date) -> list[datetime]:
    start, end = local_day(zone, day)
    return list(timing.fires(start - TICK, end))


def wall(instants: list[datetime], zone: str) -> list[str]:
    """Instants as the local clock shows them, with the offset (to tell folds apart)."""
    return [instant.astimezone(ZoneInfo(zone)).strftime("%H:%M:%S%z") for instant in instants]


def schedule(timing: Timing, **options: object) -> Schedule:
    return Schedule("nightly", "report.build", {}, timing, **options)  # type: ignore[arg-type]


# -- cron: ordinary days ---------------------------------------------------------------


def test_a_daily_cron_fires_at_its_wall_clock_time_in_the_zone() -> None:
    cron = Cron("30 2 * * *", BERLIN)
    fires = list(cron.fires(utc(2026, 1, 10), utc(2026, 1, 13)))
    assert fires == [utc(2026, 1, 10, 1, 30), utc(2026, 1, 11, 1, 30), utc(2026, 1, 12, 1, 30)]
    assert all(fire.tzinfo is UTC for fire in fires)


def test_after_is_exclusive_and_until_inclusive() -> None:
    cron = Cron("0 * * * *")
    assert list(cron.fires(utc(2026, 5, 1, 1), utc(2026, 5, 1, 3))) == [
        utc(2026, 5, 1, 2),
        utc(2026, 5, 1, 3),
    ]
    assert cron.next_fire(utc(2026, 5, 1, 1)) == utc(2026, 5, 1, 2)
    assert cron.next_fire(utc(2026, 5, 1, 1) - TICK) == utc(2026, 5, 1, 1)


def test_six_fields_put_seconds_first() -> None:
    assert Cron("30 0 2 * * *").next_fire(utc(2026, 5, 1)) == utc(2026, 5, 1, 2, 0, 30)
    every_20s = list(Cron("*/20 * * * * *").fires(utc(2026, 5, 1, 12), utc(2026, 5, 1, 12, 2)))
    assert len(every_20s) == 6
    assert {later - earlier for earlier, later in pairwise(every_20s)} == {timedelta(seconds=20)}
    assert every_20s[0] == utc(2026, 5, 1, 12, 0, 20)


def test_iteration_crosses_a_year_boundary() -> None:
    seconds = list(
        Cron("*/20 * * * * *").fires(utc(2026, 12, 31, 23, 59, 30), utc(2027, 1, 1, 0, 0, 30))
    )
    assert seconds == [utc(2026, 12, 31, 23, 59, 40), utc(2027, 1, 1), utc(2027, 1, 1, 0, 0, 20)]
    monthly = list(Cron("0 9 1 * *", BERLIN).fires(utc(2026, 11, 15), utc(2027, 2, 15)))
    assert monthly == [utc(2026, 12, 1, 8), utc(2027, 1, 1, 8), utc(2027, 2, 1, 8)]
    assert Cron("@yearly", NEW_YORK).next_fire(utc(2026, 6, 1)) == utc(2027, 1, 1, 5)


@pytest.mark.parametrize("expression", ["30 2 * * *", "*/20 * * * *", "0 * * * *", "*/15 2 * * *"])
@pytest.mark.parametrize(
    ("start", "end", "step"),
    [
        (utc(2026, 10, 24, 20), utc(2026, 10, 25, 4), timedelta(minutes=7)),  # repeated hour
        (utc(2026, 3, 28, 22), utc(2026, 3, 29, 3), timedelta(minutes=11)),  # skipped hour
    ],
)
def test_windows_cut_anywhere_give_the_same_fires_as_one_pass(
    expression: str, start: datetime, end: datetime, step: timedelta
) -> None:
    # A beat asks for fires window by window; the cuts must not add or lose any, also
    # when one falls inside a repeated or a skipped hour.
    cron = Cron(expression, BERLIN)
    whole = list(cron.fires(start, end))
    assert whole
    cuts = [start + k * step for k in range((end - start) // step + 1)] + [end]
    assert [fire for low, high in pairwise(cuts) for fire in cron.fires(low, high)] == whole


def test_next_fire_is_the_first_of_fires() -> None:
    cron = Cron("*/20 * * * *", BERLIN)
    after = utc(2026, 10, 24, 23, 50)
    while after < utc(2026, 10, 25, 3):
        following = cron.next_fire(after)
        assert following is not None
        assert following == next(iter(cron.fires(after, utc(2026, 10, 26))))
        after = following


def test_naive_instants_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        Cron("* * * * *").next_fire(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        Interval(timedelta(seconds=1)).fires(utc(2026, 1, 1), datetime(2026, 1, 2))


# -- cron: daylight saving time --------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "day", "fire"),
    [
        (BERLIN, date(2026, 3, 29), utc(2026, 3, 29, 1)),  # 02:30 skipped -> 03:00 CEST
        (NEW_YORK, date(2026, 3, 8), utc(2026, 3, 8, 7)),  # 02:30 skipped -> 03:00 EDT
    ],
)
def test_a_skipped_daily_time_fires_once_at_the_end_of_the_gap(
    zone: str, day: date, fire: datetime
) -> None:
    cron = Cron("30 2 * * *", zone)
    assert fires_on(cron, zone, day) == [fire]
    assert wall([fire], zone) == [fire.astimezone(ZoneInfo(zone)).strftime("03:00:00%z")]
    # The days around it are ordinary.
    assert wall(fires_on(cron, zone, day - timedelta(days=1)), zone)[0].startswith("02:30")
    assert wall(fires_on(cron, zone, day + timedelta(days=1)), zone)[0].startswith("02:30")


@pytest.mark.parametrize(
    ("zone", "day", "expression", "fire"),
    [
        (BERLIN, date(2026, 10, 25), "30 2 * * *", utc(2026, 10, 25, 0, 30)),  # 02:30 CEST
        (NEW_YORK, date(2026, 11, 1), "30 2 * * *", utc(2026, 11, 1, 7, 30)),  # not repeated
        (NEW_YORK, date(2026, 11, 1), "30 1 * * *", utc(2026, 11, 1, 5, 30)),  # 01:30 EDT
    ],
)
def test_a_repeated_daily_time_fires_once_at_its_first_occurrence(
    zone: str, day: date, expression: str, fire: datetime
) -> None:
    assert fires_on(Cron(expression, zone), zone, day) == [fire]


def test_an_hourly_job_keeps_real_time_rhythm_over_both_transitions() -> None:
    hourly = Cron("0 * * * *", BERLIN)
    spring = fires_on(hourly, BERLIN, date(2026, 3, 29))
    autumn = fires_on(hourly, BERLIN, date(2026, 10, 25))
    assert len(spring) == 23
    assert len(autumn) == 25
    for fires in (spring, autumn):
        assert {later - earlier for earlier, later in pairwise(fires)} == {timedelta(hours=1)}
    assert wall(autumn, BERLIN)[2:4] == ["02:00:00+0200", "02:00:00+0100"]


def test_a_wildcard_hour_skips_times_that_do_not_exist() -> None:
    # 02:30 does not exist on the spring day; firing it at 03:00 would put two runs
    # half an hour apart in a job that runs hourly.
    fires = list(Cron("30 * * * *", BERLIN).fires(utc(2026, 3, 29, 0), utc(2026, 3, 29, 2)))
    assert fires == [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30)]
    assert wall(fires, BERLIN) == ["01:30:00+0100", "03:30:00+0200"]


def test_a_sub_hourly_job_fires_every_twenty_minutes_through_the_repeated_hour() -> None:
    fires = list(Cron("*/20 * * * *", BERLIN).fires(utc(2026, 10, 24, 23), utc(2026, 10, 25, 2)))
    assert len(fires) == 9
    assert {later - earlier for earlier, later in pairwise(fires)} == {timedelta(minutes=20)}
    seconds = list(Cron("*/20 * * * * *", BERLIN).fires(utc(2026, 10, 25), utc(2026, 10, 25, 2)))
    assert len(seconds) == 2 * 60 * 3


def test_the_second_occurrence_is_found_when_starting_inside_the_repeated_hour() -> None:
    # After 02:30 CEST the clock shows 02:40 twice more; both are ahead.
    cron = Cron("40 * * * *", BERLIN)
    assert list(cron.fires(utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 50))) == [
        utc(2026, 10, 25, 0, 40),
        utc(2026, 10, 25, 1, 40),
    ]
    # A fixed-hour job already run at 02:30 CEST does not run again at 02:30 CET.
    daily = Cron("30 2 * * *", BERLIN)
    assert daily.next_fire(utc(2026, 10, 25, 0, 30)) == utc(2026, 10, 26, 1, 30)


def test_skipped_times_of_a_fixed_hour_collapse_into_one_fire() -> None:
    assert fires_on(Cron("*/15 2 * * *", BERLIN), BERLIN, date(2026, 3, 29)) == [
        utc(2026, 3, 29, 1)
    ]
    # 02:00, 02:30 and 03:00 all mean 03:00 CEST that day: one fire, then 03:30.
    assert fires_on(Cron("0,30 2,3 * * *", BERLIN), BERLIN, date(2026, 3, 29)) == [
        utc(2026, 3, 29, 1),
        utc(2026, 3, 29, 1, 30),
    ]


def test_wall_to_utc_applies_the_fixed_time_rule() -> None:
    berlin = ZoneInfo(BERLIN)
    assert wall_to_utc(datetime(2026, 3, 29, 2, 30), berlin) == utc(2026, 3, 29, 1)
    assert wall_to_utc(datetime(2026, 10, 25, 2, 30), berlin) == utc(2026, 10, 25, 0, 30)
    assert wall_to_utc(datetime(2026, 7, 1, 12), berlin) == utc(2026, 7, 1, 10)


# -- cron: validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("* * *", "3 fields; use 5 (minute hour day month weekday) or 6"),
        ("0 0 1 1 * 2026 *", "7 fields"),
        ("61 * * * *", "out of range; fields take [second 0-59] minute 0-59, hour 0-23"),
        ("*/0 * * * *", "step '0'"),
        ("0 0 30 2 *", "can never occur"),
        ("R * * * *", "random (R) and hashed (H)"),
        ("H H * * *", "random (R) and hashed (H)"),
        ("0 0 * foo *", "is not acceptable"),
    ],
)
def test_invalid_cron_expressions_are_refused(expression: str, reason: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Cron(expression)
    assert f"invalid cron expression {expression!r}" in str(caught.value)
    assert reason in str(caught.value)


def test_month_and_day_names_and_aliases_are_accepted() -> None:
    assert Cron("0 9 * mar-apr thu").next_fire(utc(2026, 1, 1)) == utc(2026, 3, 5, 9)
    assert Cron("@hourly").next_fire(utc(2026, 1, 1, 0, 1)) == utc(2026, 1, 1, 1)


def test_a_cron_reports_a_bad_expression_and_a_bad_zone_together() -> None:
    with pytest.raises(ScheduleError) as caught:
        Cron("nope", "Mars/Olympus")
    assert len(caught.value.reasons) == 2
    assert "unknown time zone 'Mars/Olympus'" in caught.value.reasons[0]


# -- interval and one-off --------------------------------------------------------------


def test_an_interval_is_anchored_not_started() -> None:
    every = Interval(timedelta(minutes=7))
    a = list(every.fires(utc(2026, 5, 1, 12), utc(2026, 5, 1, 14)))
    b = list(every.fires(utc(2026, 5, 1, 12, 3, 17), utc(2026, 5, 1, 14)))
    assert b == [fire for fire in a if fire > utc(2026, 5, 1, 12, 3, 17)]
    assert (len(b), b[0]) == (16, utc(2026, 5, 1, 12, 10))
    assert all((fire - utc(1970, 1, 1)) % timedelta(minutes=7) == timedelta(0) for fire in a)
    assert every.next_fire(utc(2026, 5, 1, 12, 3, 17)) == b[0]


def test_an_interval_with_its_own_anchor_and_a_fractional_period() -> None:
    anchor = datetime(2026, 5, 1, 12, 0, 0, tzinfo=ZoneInfo(BERLIN))
    every = Interval(timedelta(seconds=1.5), anchor)
    assert every.anchor == utc(2026, 5, 1, 10)
    fires = list(every.fires(utc(2026, 5, 1, 9, 59, 58), utc(2026, 5, 1, 10, 0, 3)))
    assert fires == [
        utc(2026, 5, 1, 9, 59, 58) + timedelta(seconds=0.5),
        utc(2026, 5, 1, 10),
        utc(2026, 5, 1, 10, 0, 1) + timedelta(seconds=0.5),
        utc(2026, 5, 1, 10, 0, 3),
    ]


@pytest.mark.parametrize("every", [timedelta(0), timedelta(seconds=-5)])
def test_an_interval_must_be_positive(every: timedelta) -> None:
    with pytest.raises(ScheduleError, match="every must be positive"):
        Interval(every)


def test_a_one_off_fires_once() -> None:
    once = OneOff(datetime(2026, 12, 1, 9, tzinfo=ZoneInfo(BERLIN)))
    assert list(once.fires(utc(2026, 11, 1), utc(2027, 1, 1))) == [utc(2026, 12, 1, 8)]
    assert list(once.fires(utc(2026, 12, 1, 8), utc(2027, 1, 1))) == []
    assert list(once.fires(utc(2026, 11, 1), utc(2026, 12, 1, 7, 59))) == []
    assert once.next_fire(utc(2026, 11, 1)) == utc(2026, 12, 1, 8)
    assert once.next_fire(utc(2026, 12, 1, 8)) is None
    with pytest.raises(ScheduleError, match="has no UTC offset"):
        OneOff(datetime(2026, 12, 1, 9))


def test_a_one_off_further_back_than_its_lookback_is_past_for_good() -> None:
    once = schedule(OneOff(utc(2026, 12, 1, 8)), lookback=timedelta(hours=1))
    assert once.past_for_good(utc(2026, 12, 1, 8, 59)) is None  # a leader still catches it up
    assert once.past_for_good(utc(2026, 12, 1, 9, 1)) == utc(2026, 12, 1, 8)
    assert schedule(Interval(timedelta(minutes=5))).past_for_good(utc(2030, 1, 1)) is None


# -- fence keys, job ids, jitter -------------------------------------------------------


def test_the_fence_key_is_the_utc_fire_to_the_second() -> None:
    nightly = schedule(Cron("30 2 * * *", BERLIN))
    fire = Cron("30 2 * * *", BERLIN).next_fire(utc(2026, 3, 28, 12))
    assert fire is not None
    assert nightly.fence_key(fire) == "beat:nightly:2026-03-29T01:00:00Z"
    in_berlin = datetime(2026, 3, 29, 3, tzinfo=ZoneInfo(BERLIN))
    assert nightly.fence_key(in_berlin) == "beat:nightly:2026-03-29T01:00:00Z"
    fraction = utc(2026, 3, 29, 1) + timedelta(microseconds=500)
    assert nightly.fence_key(fraction) == "beat:nightly:2026-03-29T01:00:00.000500Z"


def test_job_ids_are_uuid5_of_the_fence_key() -> None:
    nightly = schedule(Interval(timedelta(hours=1)))
    fire = utc(2026, 3, 29, 1)
    job_id = nightly.job_id(fire)
    assert job_id == str(uuid.uuid5(JOB_ID_NAMESPACE, "beat:nightly:2026-03-29T01:00:00Z"))
    assert uuid.UUID(job_id).version == 5
    assert job_id == schedule(Cron("0 * * * *")).job_id(fire)  # same name and fire
    assert job_id != nightly.job_id(fire + timedelta(hours=1))
    other = Schedule("hourly", "report.build", {}, Interval(timedelta(hours=1)))
    assert job_id != other.job_id(fire)


def test_jitter_is_within_bounds_deterministic_and_spread() -> None:
    jittered = schedule(Interval(timedelta(seconds=1)), jitter=timedelta(seconds=30))
    twin = schedule(Interval(timedelta(seconds=1)), jitter=timedelta(seconds=30))
    fires = [utc(2026, 1, 1) + timedelta(seconds=k) for k in range(1000)]
    delays = [jittered.jitter_for(fire) for fire in fires]
    assert all(0 <= delay < 30 for delay in delays)
    assert delays == [twin.jitter_for(fire) for fire in fires]
    assert len(set(delays)) > 990
    assert min(delays) < 1
    assert max(delays) > 29
    assert schedule(Interval(timedelta(seconds=1))).jitter_for(fires[0]) == 0.0


# -- due fires -------------------------------------------------------------------------

NOW = utc(2026, 6, 1, 12, 0, 0)
EVERY_MINUTE = Interval(timedelta(minutes=1))


def test_a_new_schedule_does_not_catch_up_history() -> None:
    assert schedule(EVERY_MINUTE).due_fires(None, NOW + timedelta(seconds=1)) == [NOW]
    assert schedule(EVERY_MINUTE).due_fires(None, NOW + timedelta(seconds=30)) == []


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [
        (CatchUp.ALL, [NOW - timedelta(minutes=k) for k in range(9, -1, -1)]),
        (CatchUp.LATEST, [NOW - timedelta(minutes=1), NOW]),
        (CatchUp.SKIP, [NOW]),
    ],
)
def test_missed_fires_follow_the_catch_up_policy(
    catch_up: CatchUp, expected: list[datetime]
) -> None:
    last = NOW - timedelta(minutes=10)
    due = schedule(EVERY_MINUTE, catch_up=catch_up).due_fires(last, NOW + timedelta(seconds=1))
    assert due == expected


def test_catch_up_names_are_accepted_as_strings() -> None:
    assert schedule(EVERY_MINUTE, catch_up="skip").catch_up is CatchUp.SKIP


def test_fires_late_by_at_most_grace_are_on_time() -> None:
    skip = schedule(EVERY_MINUTE, catch_up=CatchUp.SKIP, grace=timedelta(seconds=5))
    last = NOW - timedelta(minutes=1)
    assert skip.due_fires(last, NOW + timedelta(seconds=5)) == [NOW]
    assert skip.due_fires(last, NOW + timedelta(seconds=5) + TICK) == []
    latest = schedule(EVERY_MINUTE, catch_up=CatchUp.LATEST, grace=timedelta(seconds=5))
    assert latest.due_fires(last, NOW + timedelta(seconds=5) + TICK) == [NOW]


def test_the_last_fire_is_not_emitted_again() -> None:
    assert schedule(EVERY_MINUTE).due_fires(NOW, NOW + timedelta(seconds=59)) == []
    assert schedule(EVERY_MINUTE).due_fires(NOW, NOW + timedelta(minutes=1)) == [
        NOW + timedelta(minutes=1)
    ]
    assert schedule(EVERY_MINUTE).due_fires(NOW + timedelta(hours=1), NOW) == []


def test_lookback_bounds_catch_up_after_a_long_gap() -> None:
    every_second = schedule(Interval(timedelta(seconds=1)))
    due = every_second.due_fires(NOW - timedelta(days=3), NOW)
    assert len(due) == 3600
    assert due[0] == NOW - timedelta(hours=1) + timedelta(seconds=1)
    assert due[-1] == NOW
    assert due == sorted(set(due))
    none_back = schedule(EVERY_MINUTE, lookback=timedelta(0), catch_up=CatchUp.ALL)
    assert none_back.due_fires(NOW - timedelta(minutes=5), NOW) == [NOW]


def test_latest_takes_the_most_recent_of_many_missed_fires() -> None:
    every_second = schedule(Interval(timedelta(seconds=1)), catch_up=CatchUp.LATEST)
    due = every_second.due_fires(NOW - timedelta(days=3), NOW)
    assert due == [NOW - timedelta(seconds=s) for s in (3, 2, 1, 0)]


def test_latest_finds_a_sparse_fire_far_back() -> None:
    daily = schedule(
        Cron("30 2 * * *", BERLIN), catch_up=CatchUp.LATEST, lookback=timedelta(days=30)
    )
    now = utc(2026, 3, 30, 12)
    assert daily.due_fires(utc(2026, 3, 20), now) == [utc(2026, 3, 30, 0, 30)]
    assert daily.due_fires(utc(2026, 3, 29, 0, 59), utc(2026, 3, 29, 9)) == [utc(2026, 3, 29, 1)]
    assert daily.due_fires(utc(2026, 3, 30, 0, 30), now) == []


def test_catching_up_all_over_the_repeated_hour_is_ordered() -> None:
    every_20 = schedule(Cron("*/20 * * * *", BERLIN), lookback=timedelta(hours=6))
    due = every_20.due_fires(utc(2026, 10, 24, 23), utc(2026, 10, 25, 2))
    assert len(due) == 9
    assert due == sorted(set(due))


# -- schedule validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"lookback": timedelta(seconds=-1)}, "lookback must not be negative"),
        ({"jitter": timedelta(seconds=-1)}, "jitter must not be negative"),
        ({"grace": timedelta(seconds=-1)}, "grace must not be negative"),
        ({"catch_up": "most"}, "catch_up must be one of all, latest, skip"),
    ],
)
def test_a_schedule_refuses_bad_options(options: dict[str, object], reason: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        schedule(EVERY_MINUTE, **options)
    assert caught.value.problems == (f"nightly: {caught.value.reasons[0]}",)
    assert reason in str(caught.value)


def test_a_schedule_refuses_a_bad_name_and_a_non_json_payload() -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule("no:colons", "report.build", {"when": datetime.now}, EVERY_MINUTE)
    assert "invalid schedule name 'no:colons'" in str(caught.value)
    assert "payload is not JSON-serialisable" in str(caught.value)
    assert isinstance(caught.value, ConfigurationError)


# -- declaring in the app --------------------------------------------------------------


class Report(BaseModel):
    day: str
    limit: int = 10
    since: date | None = None


class Ping(BaseModel):
    pass


def make_app() -> App:
    app = App(namespace="beat-tests")
    app.declare("report.build", Report)
    app.declare("health.ping", Ping)
    return app


def test_the_app_records_declarations_in_order() -> None:
    app = make_app()
    payload = {"day": "yesterday"}
    first = app.schedule("nightly", "report.build", cron="30 2 * * *", payload=payload)
    app.schedule("ping", "health.ping", every=timedelta(seconds=30))
    payload["day"] = "changed later"
    assert [declared.name for declared in app.schedules] == ["nightly", "ping"]
    assert app.schedules[0] is first
    assert first.payload == {"day": "yesterday"}
    assert first.timezone is None
    assert (first.lookback, first.jitter, first.grace) == (3600.0, 0.0, 2.0)


@pytest.mark.parametrize(
    "timing",
    [{}, {"cron": "* * * * *", "every": 5}, {"every": 5, "at": "2026-12-01T09:00:00Z"}],
)
def test_the_app_needs_exactly_one_timing(timing: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="exactly one of cron=, every= or at="):
        make_app().schedule("nightly", "report.build", **timing)  # type: ignore[arg-type]


def test_the_app_refuses_a_name_declared_twice() -> None:
    app = make_app()
    app.schedule("nightly", "report.build", cron="30 2 * * *")
    with pytest.raises(ConfigurationError, match="'nightly' is declared twice"):
        app.schedule("nightly", "health.ping", every=60)
    assert len(app.schedules) == 1


# -- loading ---------------------------------------------------------------------------

EXAMPLE = """
[[schedule]]
name = "nightly-report"
task = "report.build"
cron = "30 2 * * *"
timezone = "Europe/Berlin"
payload = { day = "yesterday", since = 2026-01-01 }
catch_up = "latest"
lookback = "1h"
jitter = 30

[[schedule]]
name = "ping"
task = "health.ping"
every = "5m"
grace = "1.5s"

[[schedule]]
name = "launch"
task = "health.ping"
at = 2026-12-01T09:00:00+01:00
"""


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    def write_file(text: str, name: str = "beat.toml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write_file


def test_schedules_load_from_the_app_and_files(write: Callable[[str], Path]) -> None:
    app = make_app()
    app.schedule("weekly", "report.build", cron="0 6 * * mon", payload=Report(day="monday"))
    loaded = {item.name: item for item in load_schedules(app, [write(EXAMPLE)])}
    assert list(loaded) == ["weekly", "nightly-report", "ping", "launch"]
    nightly = loaded["nightly-report"]
    assert nightly.timing == Cron("30 2 * * *", BERLIN)
    assert nightly.payload == {"day": "yesterday", "limit": 10, "since": "2026-01-01"}
    assert nightly.catch_up is CatchUp.LATEST
    assert (nightly.lookback, nightly.jitter) == (timedelta(hours=1), timedelta(seconds=30))
    assert nightly.grace == timedelta(seconds=2)
    assert loaded["ping"].timing == Interval(timedelta(minutes=5))
    assert loaded["ping"].grace == timedelta(seconds=1.5)
    assert loaded["ping"].payload == {}
    assert loaded["launch"].timing == OneOff(utc(2026, 12, 1, 8))
    assert loaded["weekly"].payload == {"day": "monday", "limit": 10, "since": None}


def test_a_naive_at_is_read_in_the_schedule_zone(write: Callable[[str], Path]) -> None:
    app = make_app()
    app.schedule("launch", "health.ping", at="2026-03-29T02:30:00", timezone=BERLIN)
    app.schedule("iso", "health.ping", at="2026-12-01T09:00:00Z")
    text = '[[schedule]]\nname = "local"\ntask = "health.ping"\nat = 2026-12-01T09:00:00\n'
    text += 'timezone = "America/New_York"\n'
    loaded = {item.name: item.timing for item in load_schedules(app, [write(text)])}
    assert loaded["launch"] == OneOff(utc(2026, 3, 29, 1))  # in the gap: its end
    assert loaded["iso"] == OneOff(utc(2026, 12, 1, 9))
    assert loaded["local"] == OneOff(utc(2026, 12, 1, 14))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("5m", 300), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("0.5s", 0.5)],
)
def test_duration_text(text: str, seconds: float) -> None:
    assert parse_duration("lookback", text) == timedelta(seconds=seconds)
    assert parse_duration("lookback", seconds) == timedelta(seconds=seconds)


@pytest.mark.parametrize("value", ["90", "5 minutes", "-5m", True, float("nan"), [1]])
def test_bad_durations(value: object) -> None:
    with pytest.raises(ScheduleError, match="lookback must be seconds"):
        parse_duration("lookback", value)


def test_a_huge_duration_is_refused() -> None:
    with pytest.raises(ScheduleError, match="every '99999999999d' is too large"):
        parse_duration("every", "99999999999d")


BAD_ENTRIES = [
    ('cron = "61 2 * * *"', "invalid cron expression '61 2 * * *'"),
    ('cron = "30 2 * * *"\ntimezone = "Europe/Berln"', "unknown time zone 'Europe/Berln'"),
    ("every = 0", "every must be positive"),
    ('every = "-1m"', "every must be seconds"),
    ('every = 60\ntimezone = "Europe/Berlin"', "timezone has no effect on every"),
    ("at = 2026-12-01T09:00:00", "has no UTC offset"),
    ('at = "tomorrow"', "is not an ISO 8601 date-time"),
    ("at = 2026-12-01", "a date without a time"),
    ("", "give exactly one of cron, every or at (got none)"),
    ('cron = "* * * * *"\nevery = 60', "give exactly one of cron, every or at (got cron, every)"),
    ("every = 60\nlookback = -1", "lookback must not be negative"),
    ('every = 60\njitter = "-3s"', "jitter must be seconds"),
    ("every = 60\ngrace = -2", "grace must not be negative"),
    ('every = 60\ncatch_up = "newest"', "catch_up must be one of all, latest, skip"),
    ("every = 60\ncronn = 5", "unknown key(s) cronn; the keys are at, catch_up"),
]


@pytest.mark.parametrize(("entry", "reason"), BAD_ENTRIES)
def test_each_bad_entry_is_named_with_its_file(
    write: Callable[[str], Path], entry: str, reason: str
) -> None:
    path = write(f'[[schedule]]\nname = "bad"\ntask = "health.ping"\n{entry}\n')
    with pytest.raises(ScheduleError) as caught:
        load_schedules(make_app(), [path])
    assert len(caught.value.problems) == 1
    assert caught.value.problems[0].startswith(f"bad ({path}): ")
    assert reason in caught.value.problems[0]


def test_unknown_tasks_list_the_app_tasks(write: Callable[[str], Path]) -> None:
    path = write('[[schedule]]\nname = "nightly"\ntask = "report.bild"\nevery = 60\n')
    with pytest.raises(ScheduleError) as caught:
        load_schedules(make_app(), [path])
    assert caught.value.problems == (
        f"nightly ({path}): unknown task 'report.bild': the app declares health.ping,"
        " report.build; fix the name, or declare the task (app.declare or @app.task)",
    )


def test_a_payload_must_fit_the_task_model() -> None:
    app = make_app()
    app.schedule("nightly", "report.build", every=60, payload={"day": "x", "limit": "many"})
    app.schedule("empty", "report.build", every=60)
    with pytest.raises(ScheduleError) as caught:
        load_schedules(app)
    nightly, empty = caught.value.problems
    assert nightly.startswith("nightly: payload for task 'report.build' is invalid: limit:")
    assert nightly.endswith("make the payload fit Report")
    assert empty.startswith("empty: payload for task 'report.build' is invalid: day:")


def test_duplicate_names_across_the_app_and_files(write: Callable[..., Path]) -> None:
    app = make_app()
    app.schedule("nightly", "health.ping", every=60)
    entry = '[[schedule]]\nname = "nightly"\ntask = "health.ping"\nevery = 60\n'
    first, second = write(entry, "a.toml"), write(entry, "b.toml")
    with pytest.raises(ScheduleError) as caught:
        load_schedules(app, [first, second])
    assert caught.value.problems == tuple(
        f"nightly ({path}): duplicate schedule name, also defined in the app; rename one"
        " of them (the name keys the beat's fences and job ids)"
        for path in (first, second)
    )


def test_every_problem_of_every_schedule_is_reported_at_once(
    write: Callable[[str], Path],
) -> None:
    app = make_app()
    app.schedule("from-app", "report.build", cron="0 0 30 2 *", timezone="Nowhere", jitter=-1)
    text = (
        '[[schedule]]\nname = "one"\ntask = "nope"\nevery = 0\n\n'
        '[[schedule]]\ntask = "health.ping"\nevery = 60\n'
    )
    path = write(text)
    with pytest.raises(ScheduleError) as caught:
        load_schedules(app, [path])
    problems = caught.value.problems
    assert [problem.split(": ")[0] for problem in problems] == [
        "from-app",
        "from-app",
        "from-app",
        "from-app",
        f"one ({path})",
        f"one ({path})",
        f"schedule #2 ({path})",
    ]
    assert "unknown time zone 'Nowhere'" in problems[0]
    assert "can never occur" in problems[1]
    assert "day: Field required" in problems[2]
    assert "jitter must not be negative" in problems[3]
    assert "every must be positive" in problems[4]
    assert "unknown task 'nope'" in problems[5]
    assert "missing name" in problems[6]
    assert str(caught.value).startswith("7 schedule problems:\n  - from-app: ")


def test_a_file_that_is_not_toml_names_the_line(write: Callable[[str], Path]) -> None:
    path = write('[[schedule]]\nname = "nightly"\ntask = \n')
    with pytest.raises(ScheduleError) as caught:
        load_schedules(make_app(), [path])
    (problem,) = caught.value.problems
    assert problem.startswith(f"{path}: not valid TOML: ")
    assert "line 3" in problem


def test_a_file_must_hold_schedule_tables(write: Callable[..., Path], tmp_path: Path) -> None:
    table = write('extra = 1\n[schedule]\nname = "x"\n', "table.toml")
    missing = tmp_path / "missing.toml"
    with pytest.raises(ScheduleError) as caught:
        load_schedules(make_app(), [table, missing])
    assert caught.value.problems == (
        f"{table}: unknown top-level key 'extra': a schedule file holds only [[schedule]] tables",
        f"{table}: 'schedule' must be an array of tables: write [[schedule]]",
        f"{missing}: cannot read the schedule file: No such file or directory",
    )


def test_no_declarations_and_no_files_load_nothing() -> None:
    assert load_schedules(make_app()) == []
