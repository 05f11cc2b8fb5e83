"""When the dashboard asks whether the broker takes publishes: never in a page's way,
one check at a time, at most every ``max_age`` seconds. The broker's side (the check
itself, and the banner under a memory alarm) is tested on a real broker in
tests/test_publishing_check.py and tests/test_faults.py."""

from __future__ import annotations

import threading

from broker_jobs.dashboard.publishing_seen import PublishingSeen
from broker_jobs.ops.publishing_check import Publishing
from broker_jobs.urls import BrokerURLs
from tests.support import wait_until

URLS = BrokerURLs.parse("amqp://guest:guest@127.0.0.1:5672/")


class Checks:
    """Each check waits for the test to answer it with a finding (or an error)."""

    def __init__(self) -> None:
        self.asked = threading.Semaphore(0)
        self.answers: list[Publishing | Exception] = []
        self.answer = threading.Semaphore(0)
        self.count = 0

    def __call__(self, _urls: BrokerURLs) -> Publishing:
        self.count += 1
        self.asked.release()
        assert self.answer.acquire(timeout=30), "the test never answered the check"
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def reply(self, seen: PublishingSeen, answer: Publishing | Exception) -> None:
        """Answer the running check and wait until the dashboard took the answer."""
        assert self.asked.acquire(timeout=30), "no check was started"
        checked_before = seen.checked_at
        self.answers.append(answer)
        self.answer.release()
        wait_until(
            lambda: seen.checked_at is not checked_before, within=30, what="the answer taken"
        )


def test_one_check_at_a_time_at_most_every_max_age_never_waited_for() -> None:
    now = [100.0]
    checks = Checks()
    seen = PublishingSeen(URLS, max_age=10, check=checks, clock=lambda: now[0])
    seen.refresh_if_stale()  # starts one; returns at once although it is unanswered
    seen.refresh_if_stale()  # one runs: none more
    assert (seen.last, seen.blocked) == (None, None)
    blocked = Publishing(accepted=False, blocked_reason="low on disk")
    checks.reply(seen, blocked)
    assert (seen.last, seen.blocked) == (blocked, blocked)
    assert seen.checked_at is not None
    now[0] += 9.9
    seen.refresh_if_stale()  # too soon after the last start
    assert checks.count == 1
    now[0] += 0.2
    seen.refresh_if_stale()
    checks.reply(seen, Publishing(accepted=True))
    assert checks.count == 2
    assert seen.blocked is None  # cleared by the next check


def test_a_broker_that_cannot_be_asked_leaves_no_banner() -> None:
    now = [0.0]
    checks = Checks()
    seen = PublishingSeen(URLS, max_age=10, check=checks, clock=lambda: now[0])
    seen.refresh_if_stale()
    checks.reply(seen, Publishing(accepted=False, blocked_reason="low on memory"))
    now[0] += 10
    seen.refresh_if_stale()
    unknown = Publishing(accepted=None, why="no node answered")
    checks.reply(seen, unknown)
    assert (seen.last, seen.blocked) == (unknown, None)  # the unreachable banner says it
    now[0] += 10
    seen.refresh_if_stale()
    checks.reply(seen, RuntimeError("a bug in the check"))
    assert (seen.last, seen.blocked) == (None, None)  # logged; no stale banner
