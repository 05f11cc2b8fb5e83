"""Beat: schedules, leader election through RabbitMQ, emission and catch-up.

    from scheduler import Beat, load_schedules

Depends on ``broker_jobs`` only. See docs/beat.md.
"""

from scheduler.beat import Beat, BeatSettings
from scheduler.config import load_schedules, parse_duration
from scheduler.errors import ScheduleError
from scheduler.schedules import JOB_ID_NAMESPACE, CatchUp, Cron, Interval, OneOff, Schedule, Timing

__all__ = [
    "JOB_ID_NAMESPACE",
    "Beat",
    "BeatSettings",
    "CatchUp",
    "Cron",
    "Interval",
    "OneOff",
    "Schedule",
    "ScheduleError",
    "Timing",
    "load_schedules",
    "parse_duration",
]
