"""Every Python block of the user's docs runs, so that the docs cannot rot.

The blocks of one page run in order in one namespace, in a directory of their own
that is on ``sys.path``. A block whose first line is a file name comment
(``# contracts.py``) is written to that file instead (another service's module, for
the blocks after it to import). The broker URL the docs use is replaced by the test
broker's.
"""

from __future__ import annotations

import re
import shlex
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

import broker_jobs
from broker_jobs import App
from broker_jobs.cli import main
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


# -- the guide's other blocks: commands and the exception tree -------------------------

SHELLS = {"", "sh", "bash", "console", "shell"}
#: What the docs' commands take from the environment, as the examples mean it.
ENVIRONMENT = {"BROKER_JOBS_URL": DOCS_URL, "BROKER_JOBS_STORE": "sqlite:///ledger.db"}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Each fenced block of ``text``: its language ("" for none) and its lines."""
    found, language, lines = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if language is None:
                language, lines = line[3:].strip(), []
            else:
                found.append((language, "\n".join(lines)))
                language = None
        elif language is not None:
            lines.append(line)
    return found


def indented_blocks(text: str) -> list[str]:
    """Each indented code block outside the fenced ones: 4-space lines after a blank."""
    found, current, previous = [], [], ""
    for line in re.sub(r"(?ms)^```.*?^```", "", text).splitlines():
        if line.startswith("    ") and (current or not previous.strip()):
            current.append(line[4:])
        elif current:
            found.append("\n".join(current))
            current = []
        previous = line
    return [*found, "\n".join(current)] if current else found


TREE_BLOCK = re.compile(r"^```text\n(BrokerJobsError\n.*?)^```", re.M | re.S)
TREE_NODE = re.compile(r"^((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+)")


def commands(page: str) -> list[list[str]]:
    """Each ``broker-jobs`` command of the page's shell blocks (fenced or indented),
    split as the shell would (continuations joined, comments and pipes dropped,
    variables as the examples mean them). A synopsis (``[--store URL]``, ``...``) is
    not a command."""
    text = (ROOT / page).read_text()
    shell = [body for language, body in fenced_blocks(text) if language in SHELLS]
    found = []
    for block in [*shell, *indented_blocks(text)]:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command = line.strip().removeprefix("$ ")
            if not command.startswith("broker-jobs "):
                continue
            command = re.sub(r"\$\{?(\w+)\}?", lambda m: ENVIRONMENT.get(m[1], "x"), command)
            words = shlex.split(command, comments=True)
            for end in ("|", ">", "&&", ";"):
                if end in words:
                    words = words[: words.index(end)]
            if any(re.search(r"^\[|\.\.\.|^<[A-Z]", word) for word in words):
                continue  # a synopsis
            found.append(words[1:])
    return found


def parsed_only(args: list[str]) -> click.Command:
    """Parse ``args`` as the command line would, options and their values checked,
    without running the command; the command they name."""
    command: click.Command = main
    name = "broker-jobs"
    parent: click.Context | None = None
    while isinstance(command, click.Group):
        # The group's own parsing picks the subcommand (``beat --app ...`` is ``beat
        # run``); click keeps the subcommand's words in a private attribute.
        parent = command.make_context(name, list(args), parent=parent)
        words = [*parent._protected_args, *parent.args]
        if not words and command.invoke_without_command:
            parent.close()
            return command  # a group that runs on its own (``workers``): its options parsed
        assert words, f"{name} needs a subcommand"
        name, found, args = command.resolve_command(parent, words)
        assert found is not None, f"no command {words[0]!r}"
        assert name is not None
        command = found
    with command.make_context(name, list(args), parent=parent):
        return command


DOC_PAGES = sorted(
    str(path.relative_to(ROOT)) for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
)


@pytest.mark.parametrize("page", DOC_PAGES)
def test_every_command_of_the_docs_parses(page: str) -> None:
    for args in commands(page):
        try:
            parsed_only(args)
        except click.ClickException as error:
            raise AssertionError(f"{page}: broker-jobs {shlex.join(args)}: {error}") from None


def test_the_guides_commands_are_checked() -> None:
    checked = commands("docs/guide.md")
    assert ["dlq", "list", "--app", "shop.worker:app", "--store", "sqlite:///ledger.db"] in checked
    assert len(checked) >= 3


def test_the_guides_exception_tree_is_the_library_one() -> None:
    """Each error of the tree is exported from ``broker_jobs`` under its parent, and
    every exported error is in the tree."""
    (tree,) = TREE_BLOCK.findall((ROOT / "docs" / "guide.md").read_text())
    parents: list[type[BaseException]] = []
    shown = set()
    for line in tree.splitlines():
        match = TREE_NODE.match(line)
        assert match, line
        depth = len(match.group(1)) // 4 + (0 if line.startswith(match.group(2)) else 1)
        error = getattr(broker_jobs, match.group(2))
        assert match.group(2) in broker_jobs.__all__
        del parents[depth:]
        if parents:
            assert issubclass(error, parents[-1]), f"{error.__name__} under {parents[-1].__name__}"
        parents.append(error)
        shown.add(match.group(2))
    exported = {
        name
        for name in broker_jobs.__all__
        if isinstance(value := getattr(broker_jobs, name), type)
        and issubclass(value, broker_jobs.BrokerJobsError)
    }
    mentioned = {name for name in exported if name in tree}
    assert exported == mentioned, f"exported, not in the guide: {sorted(exported - mentioned)}"
    assert len(shown) >= 20


def test_the_readmes_tasks_module_runs_on_its_own(sandbox: Path) -> None:
    """The README's worker module is a whole file a user copies to
    ``myproject/tasks.py``: it imports and declares its task without the publishing
    block above it (it used a model it never defined: ``NameError: Resize``)."""
    (module,) = [block for block in blocks("README.md") if FILE_BLOCK.match(block)]
    assert FILE_BLOCK.match(module).group(1) == "myproject/tasks.py"  # type: ignore[union-attr]
    namespace: dict[str, object] = {"__name__": "myproject.tasks"}
    exec(compile(module, "README.md myproject/tasks.py", "exec"), namespace)
    app = namespace["app"]
    assert isinstance(app, App)
    assert "image.resize" in app
