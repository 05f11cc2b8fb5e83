"""The import rules of docs/architecture.md, read off the source: which package may
import which, and no circular imports (bench included).

Every ``import`` counts, inside functions too (an import deferred into a function to
dodge a cycle is still a cycle); only ``if TYPE_CHECKING:`` blocks are left out.
No broker: the source is enough.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("broker_jobs", "topology", "scheduler", "bench")

#: The top-level modules of broker_jobs that are its core (one concept each: the
#: task registry, the job envelope, errors, retries, due times, URLs, the watched event
#: loop, text made printable, counts in words, the fork hook of connection holders,
#: the drivers' log filters), and the old
#: paths of moved modules (they only alias the new ones).
CORE = frozenset(
    {
        "app",
        "app_loader",
        "envelope",
        "clock",
        "errors",
        "retry",
        "due",
        "urls",
        "schedule_decl",
        "keywords",
        "job_context",
        "_moved",
        "publisher",
        "async_publisher",
        "dead_letter_queue",
        "dead_letter",
        "version",
        "closing",
        "watched_loop",
        "printable",
        "plural",
        "fork_watch",
        "log_scopes",
    }
)

#: What the command line and the benchmarks may import: the whole library.
LIBRARY = frozenset({
    "core", "topology", "amqp", "store", "observe", "publish", "worker", "ops", "scheduler",
    "dashboard",
})  # fmt: skip

#: Layer -> the layers it may import (besides itself). docs/architecture.md draws it.
ALLOWED: dict[str, frozenset[str]] = {
    "topology": frozenset(),
    "core": frozenset({"topology"}),
    "store": frozenset({"core"}),
    "amqp": frozenset({"core", "topology"}),
    "observe": frozenset({"core", "store"}),
    "publish": frozenset({"core", "topology", "amqp", "store", "observe"}),
    "ops": frozenset({"core", "topology", "amqp", "store", "observe", "publish"}),
    # The worker makes one of the operator's passes itself (ops.unroutable).
    "worker": frozenset({"core", "topology", "amqp", "store", "observe", "publish", "ops"}),
    "scheduler": frozenset({"core", "topology", "amqp", "store", "observe", "publish", "ops"}),
    "dashboard": frozenset({"core", "topology", "store", "observe", "ops", "scheduler"}),
    # The kit runs the worker's protocol on the publishers and beat's emitter.
    "testing": frozenset({"core", "topology", "store", "publish", "worker", "scheduler"}),
    "api": frozenset({"core", "topology", "store", "publish", "worker"}),
    "cli": frozenset({"api", *LIBRARY}),
    "bench": frozenset({"api", "testing", "cli", *LIBRARY}),
}


def layer(module: str) -> str:
    """The layer of a dotted module name of the sources."""
    top, _, rest = module.partition(".")
    if top != "broker_jobs":
        return top
    if not rest:
        return "api"
    first = rest.partition(".")[0]
    if first == "__main__":
        return "cli"
    return "core" if first in CORE else first


@cache
def modules() -> dict[str, Path]:
    """Every module of the sources: dotted name -> file."""
    found = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _outside_type_checking(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _outside_type_checking(node)


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of the sources in ``path``. ``from pkg import
    sub`` imports the submodule ``pkg.sub`` (the package's own import is no edge:
    Python runs a package's ``__init__`` before any of its modules anyway)."""
    known = modules()
    for node in _outside_type_checking(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found = [sub for sub in subs if sub in known]
            yield from ((node.lineno, sub) for sub in found)
            if len(found) < len(subs):
                yield node.lineno, node.module


def graph() -> dict[str, set[str]]:
    return {
        module: {target for _, target in imported(path) if target != module}
        for module, path in modules().items()
    }


def test_every_import_follows_the_layers() -> None:
    broken = []
    for module, path in modules().items():
        mine = layer(module)
        for line, target in imported(path):
            theirs = layer(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                where = f"{path.relative_to(ROOT)}:{line}"
                broken.append(f"{where}: {mine} may not import {theirs} ({target})")
    assert not broken, "\n".join(broken)


def test_every_layer_has_a_rule() -> None:
    assert {layer(module) for module in modules()} <= set(ALLOWED)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
