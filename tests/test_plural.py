"""Counts in words (broker_jobs/plural.py): what log lines and commands say."""

from __future__ import annotations

import pytest

from broker_jobs.plural import plural


@pytest.mark.parametrize(
    ("count", "noun", "many", "said"),
    [
        (0, "job", None, "0 jobs"),
        (1, "job", None, "1 job"),
        (3, "job", None, "3 jobs"),
        (1, "success", "successes", "1 success"),
        (2, "success", "successes", "2 successes"),
    ],
)
def test_a_count_agrees_with_its_noun(count: int, noun: str, many: str | None, said: str) -> None:
    assert plural(count, noun, many) == said
