"""Every Python block of the user's docs runs, so that the docs cannot rot.

The blocks of one page run in order in one namespace, in a directory of their own
that is on ``sys.path``. A block whose first line is a file name comment
(``# contracts.py``) is written to that file instead (another service's module, for
the blocks after it to import). The broker URL the docs use is replaced by the test
broker's.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker_jobs import App
from tests.support import Broker
from topology import Topology

ROOT = Path(__file__).resolve().parent.parent
#: The broker URL the docs' examples use.
DOCS_URL = "amqp://guest:guest@localhost:5672/"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
FILE_BLOCK = re.compile(r"\A# ([\w/]+\.py)\n")


def blocks(page: str) -> list[str]:
    return [textwrap.dedent(found) for found in BLOCK.findall((ROOT / page).read_text())]


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:  # the pages' own modules, made afresh next time
        if name.split(".")[0] not in {"broker_jobs", "topology", "scheduler"}:
            module = sys.modules.get(name)
            if module is not None and str(tmp_path) in str(getattr(module, "__file__", "")):
                del sys.modules[name]


def run_page(page: str, directory: Path, url: str = DOCS_URL) -> dict[str, object]:
    """Run the page's blocks; the namespace they leave."""
    namespace: dict[str, object] = {"__name__": f"docs_{Path(page).stem}"}
    found = blocks(page)
    assert found, f"{page} has no python block"
    for number, block in enumerate(found, 1):
        code = block.replace(DOCS_URL, url)
        if match := FILE_BLOCK.match(code):
            target = directory / match.group(1)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(code)
            continue
        try:
            exec(compile(code, f"{page} block {number}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"{page}, block {number} failed:\n{code}") from error
    return namespace


def test_every_block_of_the_testing_page_runs(sandbox: Path) -> None:
    run_page("docs/testing.md", sandbox)


@pytest.mark.broker
def test_every_block_of_the_guide_runs_on_a_real_broker(
    sandbox: Path, broker: Broker, cleanup_topology: Callable[[Topology], Topology]
) -> None:
    try:
        namespace = run_page("docs/guide.md", sandbox, url=broker.url)
    finally:
        contracts = sys.modules.get("shop.contracts")
        if contracts is not None:
            app = contracts.app
            assert isinstance(app, App)
            cleanup_topology(app.topology())
    assert "outcomes" in namespace
