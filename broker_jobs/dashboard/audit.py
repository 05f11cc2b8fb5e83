"""One log line per action: who, what, how many, and what came of it."""

from __future__ import annotations

import logging

from broker_jobs.urls import mask_text

logger = logging.getLogger("broker_jobs.dashboard.audit")


def record(who: str, action: str, what: str, count: int, result: str) -> None:
    """``dashboard action cancel by 127.0.0.1: job 'k' (1): cancelled``. The values
    are repr()-quoted where they come from users, so a newline cannot forge a line."""
    logger.info(
        "dashboard action %s by %s: %s (%d): %s",
        action,
        who,
        mask_text(what),
        count,
        mask_text(result),
        extra={"action": action, "who": who, "count": count},
    )
