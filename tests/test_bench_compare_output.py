"""Where ``python -m bench.compare`` writes its page: pure, no broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common import REPO
from bench.compare import parse_args

PAGE = REPO / "docs" / "benchmarks.md"
SCRATCH = REPO / "bench" / "out" / "benchmarks.md"


@pytest.mark.parametrize(
    ("argv", "page"),
    [
        ([], PAGE),  # the full run issue 27 judges
        (["--rounds", "6"], PAGE),
        (["--only", "latency"], SCRATCH),
        (["--peers", "broker-jobs,dramatiq"], SCRATCH),
        (["--queue-type", "classic"], SCRATCH),
        (["--quick"], SCRATCH),
        (["--rounds", "3"], SCRATCH),
        (["--only", "latency", "--output", "/elsewhere/page.md"], Path("/elsewhere/page.md")),
    ],
)
def test_only_a_full_run_replaces_the_benchmarks_page(argv: list[str], page: Path) -> None:
    assert parse_args(argv).output == page
